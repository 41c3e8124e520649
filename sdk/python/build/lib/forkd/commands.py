"""sandbox.commands: run commands (waiting or in the background), list, signal, feed stdin."""

import base64
import codecs
import threading
from datetime import datetime

from .errors import CommandExitError, CommandResult, ForkdError, NotFoundError

_SIGNAL_NAMES = {1: "SIGHUP", 2: "SIGINT", 9: "SIGKILL", 15: "SIGTERM"}


class ProcessInfo:
    def __init__(self, pid, cmd, args, started_at, stdin_open):
        self.pid = pid
        self.cmd = cmd
        self.args = args
        self.started_at = started_at
        self.stdin_open = stdin_open

    def __repr__(self):
        return "ProcessInfo(pid=%r, cmd=%r, args=%r)" % (self.pid, self.cmd, self.args)


class CommandHandle:
    """A command running in the background. Output is collected by a thread as it arrives."""

    def __init__(self, pid, commands, events, on_stdout=None, on_stderr=None):
        self.pid = pid
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

    def _start_thread(self):
        self._thread = threading.Thread(target=self._consume, name="forkd-cmd-%d" % self.pid, daemon=True)
        self._thread.start()

    def _emit(self, dec, parts, cb, data, final=False):
        s = dec.decode(data, final)
        if s:
            parts.append(s)
            if cb:
                cb(s)

    def _consume(self):
        try:
            for ev in self._events:
                t = ev.get("type")
                if t == "stdout":
                    self._emit(self._out_dec, self._out, self._on_stdout, base64.b64decode(ev["data"]))
                elif t == "stderr":
                    self._emit(self._err_dec, self._err, self._on_stderr, base64.b64decode(ev["data"]))
                elif t == "exit":
                    self._emit(self._out_dec, self._out, self._on_stdout, b"", True)
                    self._emit(self._err_dec, self._err, self._on_stderr, b"", True)
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
                    self._error = ForkdError(e.get("message", "command failed"), code=e.get("code", "internal"),
                                             details=e.get("details"))
                    return
            self._error = ForkdError("the command's output stream ended before it exited", code="connection")
        except ForkdError as e:
            self._error = e
        except Exception as e:  # keep the thread from dying silently
            self._error = ForkdError(str(e), code="connection")
        finally:
            self._done.set()

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

    def wait(self, on_stdout=None, on_stderr=None, timeout=None):
        """Waits for the exit; raises CommandExitError when the exit code is not 0."""
        if on_stdout:
            self._on_stdout = on_stdout
        if on_stderr:
            self._on_stderr = on_stderr
        if self._thread is None:  # foreground: consume in this thread
            self._consume()
        elif not self._done.wait(timeout):
            raise ForkdError("command %d still running after %s s" % (self.pid, timeout), code="timeout")
        if self._error:
            raise self._error
        if self._result.exit_code != 0:
            raise CommandExitError(self._result)
        return self._result

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
    def __init__(self, transport, sandbox_id):
        self._t = transport
        self._id = sandbox_id

    def _path(self, rest=""):
        return "/v1/sandboxes/%s%s" % (self._id, rest)

    def run(self, cmd, background=False, envs=None, cwd=None, on_stdout=None, on_stderr=None,
            timeout=60, stdin=None, user=None, request_timeout=None):
        """Runs cmd (a shell string, or an argv list) and waits for it; with background=True returns a
        CommandHandle as soon as it runs. timeout is in seconds (0 or None: never).
        stdin: a str/bytes is written and closed; True keeps stdin open for send_stdin().
        Raises CommandExitError when a waited-for command exits non-zero."""
        body = {"cmd": cmd}
        if envs:
            body["env"] = dict(envs)
        if cwd:
            body["cwd"] = cwd
        if timeout:
            body["timeout_ms"] = int(timeout * 1000)
        if isinstance(stdin, (str, bytes)):
            body["stdin"] = stdin.decode("utf-8") if isinstance(stdin, bytes) else stdin
        elif stdin is True:
            body["keep_stdin_open"] = True
        events = self._t.ndjson("POST", self._path("/exec/stream"), json_body=body)
        first = next(events, None)
        if first is None:
            raise ForkdError("the daemon closed the stream before the command started", code="connection")
        if first.get("type") == "error":
            e = first.get("error") or {}
            raise ForkdError(e.get("message", "exec failed"), code=e.get("code", "internal"), details=e.get("details"))
        pid = first.get("pid", 0) if first.get("type") == "started" else 0
        rest = events if first.get("type") == "started" else _prepend(first, events)
        handle = CommandHandle(pid, self, rest, on_stdout, on_stderr)
        if background:
            handle._start_thread()
            return handle
        return handle.wait()

    def list(self):
        r = self._t.json("GET", self._path("/commands"))
        out = []
        for c in r["commands"]:
            cmd = c["cmd"]
            out.append(ProcessInfo(c["pid"], cmd if isinstance(cmd, str) else (cmd[0] if cmd else ""),
                                   [] if isinstance(cmd, str) else cmd[1:],
                                   datetime.fromisoformat(c["started"].replace("Z", "+00:00")), c["stdin_open"]))
        return out

    def kill(self, pid, signal="SIGKILL"):
        """Signals a running command's process group. False if it is not running."""
        try:
            self._t.json("POST", self._path("/commands/%d/signal" % pid), json_body={"signal": signal})
            return True
        except NotFoundError:
            return False

    def send_stdin(self, pid, data):
        body = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        self._t.json("POST", self._path("/commands/%d/stdin" % pid), body=body)

    def close_stdin(self, pid):
        self._t.json("POST", self._path("/commands/%d/stdin" % pid), body=b"", query={"eof": 1})


def _prepend(first, rest):
    yield first
    yield from rest
