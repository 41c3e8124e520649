"""sandbox.commands: run commands (waiting or in the background), list, connect, signal, feed stdin."""

import base64
import codecs
import queue
import threading
from datetime import datetime

from .errors import (CommandExitError, CommandResult, CommandTimeoutError, ForkdError, NotFoundError,
                     error_from_envelope)

_SIGNAL_NAMES = {1: "SIGHUP", 2: "SIGINT", 9: "SIGKILL", 15: "SIGTERM"}
_END = object()


class ProcessInfo:
    """A running command (E2B's ProcessInfo: pid, tag, cmd, args, envs, cwd)."""

    def __init__(self, pid, cmd, args, started_at, stdin_open, tag=None, envs=None, cwd=None):
        self.pid = pid
        self.cmd = cmd
        self.args = args
        self.started_at = started_at
        self.stdin_open = stdin_open
        self.tag = tag
        self.envs = envs or {}
        self.cwd = cwd

    def __repr__(self):
        return "ProcessInfo(pid=%r, cmd=%r, args=%r)" % (self.pid, self.cmd, self.args)


class CommandHandle:
    """A command running in the background. A thread reads its output as it arrives; iterate the
    handle for (stdout, stderr, pty) tuples as they come (E2B's shape: one of the three is set)."""

    def __init__(self, pid, commands, events, on_stdout=None, on_stderr=None, on_pty=None, pty=False):
        self.pid = pid
        self._pty = pty
        self._on_pty = on_pty
        self._commands = commands
        self._events = events
        self._on_stdout = on_stdout
        self._on_stderr = on_stderr
        self._out = []
        self._err = []
        self._out_dec = codecs.getincrementaldecoder("utf-8")("replace")
        self._err_dec = codecs.getincrementaldecoder("utf-8")("replace")
        self._result = None
        self._error = None
        self._done = threading.Event()
        self._thread = None
        self._lock = threading.Lock()
        self._chunks = queue.Queue()
        self._detached = False

    def _start_thread(self):
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._consume, name="forkd-cmd-%d" % self.pid, daemon=True)
            self._thread.start()

    def _emit(self, dec, parts, cb, data, which, final=False):
        s = dec.decode(data, final)
        if s:
            parts.append(s)
            if cb and not self._detached:
                cb(s)
            item = (s, None, None) if which == "stdout" else (None, s, None)
            self._chunks.put(item)

    def _consume(self):
        try:
            for ev in self._events:
                t = ev.get("type")
                if t == "stdout" and self._pty:  # a terminal's output: bytes, not stdout text
                    data = base64.b64decode(ev["data"])
                    if data:
                        if self._on_pty and not self._detached:
                            self._on_pty(data)
                        self._chunks.put((None, None, data))
                elif t == "stdout":
                    self._emit(self._out_dec, self._out, self._on_stdout, base64.b64decode(ev["data"]), t)
                elif t == "stderr":
                    self._emit(self._err_dec, self._err, self._on_stderr, base64.b64decode(ev["data"]), t)
                elif t == "exit":
                    self._emit(self._out_dec, self._out, self._on_stdout, b"", "stdout", True)
                    self._emit(self._err_dec, self._err, self._on_stderr, b"", "stderr", True)
                    sig = ev.get("signal")
                    error = None
                    if ev.get("timed_out"):
                        error = "timed out"
                    elif sig is not None:
                        error = "killed by %s" % _SIGNAL_NAMES.get(sig, "signal %d" % sig)
                    code = ev.get("exit_code")
                    self._result = CommandResult(-1 if code is None else code, self.stdout, self.stderr,
                                                 signal=sig, timed_out=bool(ev.get("timed_out")), error=error)
                    return
                elif t == "error":
                    e = ev.get("error") or {}
                    self._error = error_from_envelope(200, e.get("code", "internal"),
                                                      e.get("message", "command failed"), e.get("details"))
                    return
            self._error = ForkdError("the command's output stream ended before it exited", code="connection")
        except ForkdError as e:
            self._error = e
        except Exception as e:  # keep the thread from dying silently
            self._error = ForkdError(str(e), code="connection")
        finally:
            self._done.set()
            self._chunks.put(_END)
            close = getattr(self._events, "close", None)
            if close:
                close()  # the stream is released as soon as the command ended

    @property
    def stdout(self):
        return "".join(self._out)

    @property
    def stderr(self):
        return "".join(self._err)

    @property
    def exit_code(self):
        """The exit code once it exited (-1 when a signal ended it), else None."""
        return self._result.exit_code if self._result else None

    @property
    def error(self):
        """Why it did not exit normally (signal or timeout), once it exited."""
        return self._result.error if self._result else None

    def _outcome(self):
        if self._error:
            raise self._error
        if self._result.timed_out:
            raise CommandTimeoutError(self._result)
        if self._result.exit_code != 0:
            raise CommandExitError(self._result)
        return self._result

    def __iter__(self):
        """Yields (stdout, stderr, pty) as output arrives; raises TimeoutException if it timed out."""
        self._start_thread()
        while True:
            item = self._chunks.get()
            if item is _END:
                break
            yield item
        if self._error:
            raise self._error
        if self._result is not None and self._result.timed_out:
            raise CommandTimeoutError(self._result)

    def wait(self, on_pty=None, on_stdout=None, on_stderr=None, timeout=None):
        """Waits for the exit; raises CommandExitError when the exit code is not 0, TimeoutException
        (CommandTimeoutError) when the command ran past its timeout."""
        if on_stdout:
            self._on_stdout = on_stdout
        if on_stderr:
            self._on_stderr = on_stderr
        if on_pty:
            self._on_pty = on_pty
        if self._thread is None and not self._done.is_set():  # foreground: consume in this thread
            with self._lock:
                claimed = self._thread is None
                if claimed:
                    self._thread = threading.current_thread()
            if claimed:
                self._consume()
        if not self._done.wait(timeout):
            raise ForkdError("command %d still running after %s s" % (self.pid, timeout), code="timeout")
        return self._outcome()

    def disconnect(self):
        """Stops delivering output to this handle's callbacks; the command keeps running (its output
        is still read, so that the daemon does not take the hang-up for a request to kill it)."""
        self._detached = True
        self._start_thread()

    def kill(self):
        """SIGKILLs the command's process group. False if it had already exited."""
        if self._done.is_set():
            return False
        return self._commands.kill(self.pid)

    def send_stdin(self, data):
        self._commands.send_stdin(self.pid, data)

    def close_stdin(self):
        self._commands.close_stdin(self.pid)


class Commands:
    def __init__(self, transport, sandbox_id, layout=None, envs=None):
        self._t = transport
        self._id = sandbox_id
        self._layout = layout
        self._envs = dict(envs or {})  # the sandbox's own (Sandbox(envs=...)), under each command's
        self._handles = {}
        self._handles_lock = threading.Lock()

    def _path(self, rest=""):
        return "/v1/sandboxes/%s%s" % (self._id, rest)

    def run(self, cmd, background=False, envs=None, user=None, cwd=None, on_stdout=None, on_stderr=None,
            stdin=None, timeout=60, request_timeout=None):
        """Runs cmd (a shell string, or an argv list) and waits for it; with background=True returns a
        CommandHandle as soon as it runs. timeout is in seconds (0 or None: never); a command killed
        by it raises TimeoutException (CommandTimeoutError). stdin: a str/bytes is written and closed;
        True keeps stdin open for send_stdin(). user: the account to run as (default `user` when
        the image has one, else the image's default); cwd defaults to that user's home.
        Raises CommandExitError when a waited-for command exits non-zero."""
        return self._start(cmd, background=background, envs=envs, user=user, cwd=cwd, on_stdout=on_stdout,
                           on_stderr=on_stderr, stdin=stdin, timeout=timeout)

    def _start(self, cmd, background=True, envs=None, user=None, cwd=None, on_stdout=None, on_stderr=None,
               stdin=None, timeout=60, pty=None, on_pty=None):
        body = {"cmd": cmd}
        env = dict(self._envs)
        env.update(envs or {})
        if env:
            body["env"] = env
        if user is None and self._layout is not None:
            user = self._layout.user
        if user is not None:
            body["user"] = user
        if cwd is None and self._layout is not None:
            cwd = self._layout.home(user)
        if cwd:
            body["cwd"] = self._layout.resolve(cwd, user) if self._layout is not None else cwd
        if timeout:
            body["timeout_ms"] = int(timeout * 1000)
        if pty is not None:
            body["pty"] = pty
        if isinstance(stdin, (str, bytes)):
            body["stdin"] = stdin.decode("utf-8") if isinstance(stdin, bytes) else stdin
        elif stdin is True and pty is None:
            body["keep_stdin_open"] = True
        events = self._t.ndjson("POST", self._path("/exec/stream"), json_body=body)
        first = next(events, None)
        if first is None:
            raise ForkdError("the daemon closed the stream before the command started", code="connection")
        if first.get("type") == "error":
            e = first.get("error") or {}
            raise error_from_envelope(200, e.get("code", "internal"), e.get("message", "exec failed"),
                                      e.get("details"))
        pid = first.get("pid", 0) if first.get("type") == "started" else 0
        rest = events if first.get("type") == "started" else _prepend(first, events)
        handle = CommandHandle(pid, self, rest, on_stdout, on_stderr, on_pty=on_pty, pty=pty is not None)
        if background:
            with self._handles_lock:
                self._handles = {p: h for p, h in self._handles.items() if not h._done.is_set()}
                self._handles[pid] = handle
            handle._start_thread()
            return handle
        return handle.wait()

    def connect(self, pid, timeout=60, on_stdout=None, on_stderr=None, request_timeout=None):
        """A handle on a running command started through the API (by this or any other client): its
        output from now on and its exit (GET /v1/sandboxes/:id/commands/:pid/stream). Its
        disconnect() or this process ending detaches only this handle; kill() kills the command.
        NotFoundException when no such command runs."""
        events = self._t.ndjson("GET", self._path("/commands/%d/stream" % pid))
        first = next(events, None)
        if first is None:
            raise ForkdError("the daemon closed the stream before the command started", code="connection")
        if first.get("type") == "error":
            e = first.get("error") or {}
            raise error_from_envelope(200, e.get("code", "internal"), e.get("message", "connect failed"),
                                      e.get("details"))
        rest = events if first.get("type") == "started" else _prepend(first, events)
        handle = CommandHandle(pid, self, rest, on_stdout, on_stderr)
        handle._start_thread()
        return handle

    def list(self, request_timeout=None):
        r = self._t.json("GET", self._path("/commands"))
        out = []
        for c in r["commands"]:
            cmd = c["cmd"]
            out.append(ProcessInfo(c["pid"], cmd if isinstance(cmd, str) else (cmd[0] if cmd else ""),
                                   [] if isinstance(cmd, str) else cmd[1:],
                                   datetime.fromisoformat(c["started"].replace("Z", "+00:00")), c["stdin_open"],
                                   tag=c.get("tag")))
        return out

    def kill(self, pid, signal="SIGKILL", request_timeout=None):
        """Signals a running command's process group. False if it is not running."""
        try:
            self._t.json("POST", self._path("/commands/%d/signal" % pid), json_body={"signal": signal})
            return True
        except NotFoundError:
            return False

    def send_stdin(self, pid, data, request_timeout=None):
        body = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        self._t.json("POST", self._path("/commands/%d/stdin" % pid), body=body)

    def close_stdin(self, pid, request_timeout=None):
        self._t.json("POST", self._path("/commands/%d/stdin" % pid), body=b"", query={"eof": 1})


def _prepend(first, rest):
    yield first
    yield from rest
