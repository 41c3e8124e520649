"""forkd warm Python interpreter (runs inside the guest, driven by forkd-agent).

Protocol on stdin/stdout (see docs/agent-protocol.md, "Agent to interpreter"):
request  = u32 BE length, u32 BE id, UTF-8 code
reply    = u32 BE length, u32 BE id, UTF-8 JSON
Id 0 with empty code reseeds `random` and `numpy.random` from os.urandom.
A request whose code starts with a NUL byte carries options: NUL, one line of JSON, a newline,
then the code. Options: "context" (the context the cell runs in; absent: "default"), "env" (an
object of variables the cell sees, restored after it), "stream" (true: the cell's stdout and
stderr are sent while it runs, as output frames, and not again in its reply), "op" (a context
operation instead of a cell: "create" with "cwd", "list", "delete" and "restart" with "context").
An output frame has the request's id and a body of byte 0x01, then "o" (stdout) or "e" (stderr),
then UTF-8 text; the reply (JSON, starting with "{") ends the request.

Cells run notebook-style in a context's persistent globals dict (each context has its own
globals, execution count and cwd; "default" is the one a cell without a context runs in): all statements are executed and,
if the last statement is an expression, its repr() is the value and its rich forms (IPython's
_repr_html_/_repr_png_/... protocol, a matplotlib figure as PNG) are "value_data". Objects
passed to display() and matplotlib figures left open by the cell come back in "display", one
MIME bundle each, in order. The protocol uses private
duplicates of fds 0 and 1; fds 0 and 1 themselves point at /dev/null so that cell code and
its subprocesses cannot corrupt the frame stream.
"""

import ast
import base64
import builtins
import io
import json
import linecache
import os
import random
import signal
import struct
import sys
import threading
import traceback

# matplotlib (if the template has it and a cell imports it) draws off-screen.
os.environ.setdefault("MPLBACKEND", "Agg")

try:
    import numpy
except ImportError:  # the image should have it; keep working without
    numpy = None

OUT_CAP = 256 * 1024       # bytes of stdout/stderr kept per cell
TEXT_CAP = 256 * 1024      # characters of value/error kept
REPLY_MAX = 1000 * 1000    # encoded JSON bound (the agent's frame limit is 1 MiB)
MIME_CAP = 512 * 1024      # characters of one rich output kept (larger ones are dropped)
DISPLAY_MAX = 32           # rich outputs kept per cell
THIS_FILE = os.path.abspath(__file__)
CONTEXTS_MAX = 32          # contexts besides the default one
STREAM_CAP = 4 * 1024 * 1024  # bytes of stdout/stderr streamed per cell and stream
STREAM_CHUNK = 32 * 1024   # a pending chunk this big is sent at once
STREAM_DELAY = 0.05        # seconds output may wait to be sent with more

_in_cell = False
_framing = False            # the main thread is writing a frame: an interrupt waits for its end
_interrupt_pending = False
_busy = False               # a request is being served (read, not yet answered)


def _on_sigint(signum, frame):
    # The agent sends SIGINT on timeout or when the host gives the cell up. Between requests (a
    # late signal) it is ignored; while a cell is being prepared it waits for the cell's start.
    global _interrupt_pending
    if _in_cell and not _framing:
        raise KeyboardInterrupt
    if _busy:
        _interrupt_pending = True


class Proto:
    """The frame writer: replies and output frames, whole, one at a time (cells may have threads)."""

    def __init__(self, fd):
        self.fd = fd
        self.lock = threading.Lock()

    def frame(self, ident, body):
        global _framing, _interrupt_pending
        main = threading.current_thread() is threading.main_thread()
        with self.lock:
            if main:
                _framing = True
            try:
                write_all(self.fd, struct.pack(">II", len(body) + 4, ident) + body)
            except BrokenPipeError:
                os._exit(0)  # the agent is gone
            finally:
                if main:
                    _framing = False
        if main and _interrupt_pending:
            _interrupt_pending = False
            if _in_cell:
                raise KeyboardInterrupt


class _StreamedBytes(io.RawIOBase):
    """A cell's stdout or stderr sent as output frames while it runs: a chunk goes when it is
    STREAM_CHUNK bytes or has waited STREAM_DELAY; at most STREAM_CAP bytes per cell."""

    def __init__(self, proto, ident, tag):
        super().__init__()
        self.proto, self.ident, self.tag = proto, ident, tag
        self.pending = bytearray()
        self.sent = 0
        self.truncated = False
        self.ended = False
        self.timer = None
        self.lock = threading.RLock()

    def writable(self):
        return True

    def write(self, b):
        b = bytes(memoryview(b).cast("B"))
        with self.lock:
            if self.ended:
                return len(b)  # a thread writing after its cell ended: dropped
            room = STREAM_CAP - self.sent - len(self.pending)
            if len(b) > room:
                if not self.truncated:
                    self.truncated = True
                    cut = b[:max(room, 0)].decode("utf-8", errors="ignore").encode("utf-8")
                    self.pending += cut + b"\n[output truncated]\n"
            else:
                self.pending += b
            if len(self.pending) >= STREAM_CHUNK:
                self._send()
            elif self.pending and self.timer is None:
                self.timer = threading.Timer(STREAM_DELAY, self.send_pending)
                self.timer.daemon = True
                self.timer.start()
        return len(b)

    def send_pending(self):
        with self.lock:
            if not self.ended:
                self._send()

    def _send(self):
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if not self.pending:
            return
        data = bytes(self.pending)
        self.pending.clear()
        self.sent += len(data)
        while data:  # frames of at most STREAM_CHUNK bytes, cut between UTF-8 sequences
            cut = min(len(data), STREAM_CHUNK)
            while 0 < cut < len(data) and cut > STREAM_CHUNK - 4 and data[cut] & 0xC0 == 0x80:
                cut -= 1
            self.proto.frame(self.ident, b"\x01" + self.tag + data[:cut])
            data = data[cut:]

    def end(self):
        """Sends what is pending; nothing is sent after (the reply follows)."""
        with self.lock:
            if not self.ended:
                try:
                    self._send()
                finally:
                    self.ended = True


class _CappedBytes(io.BytesIO):
    """A BytesIO that silently stops growing at OUT_CAP bytes."""

    truncated = False

    def write(self, b):
        b = memoryview(b).cast("B")
        room = OUT_CAP - self.tell()
        if len(b) > room:
            self.truncated = True
            b = b[:max(room, 0)]
        if len(b):
            super().write(b)
        return len(b)


def _capture(raw=None):
    return io.TextIOWrapper(raw if raw is not None else _CappedBytes(), encoding="utf-8",
                            errors="replace", line_buffering=False, write_through=True)


def _captured_text(stream):
    """The text a buffered capture kept; a streamed one sends what it still holds, and is ""."""
    try:
        stream.flush()
    except BaseException:
        pass
    raw = stream.buffer
    if isinstance(raw, _StreamedBytes):
        raw.end()
        return ""
    text = raw.getvalue().decode("utf-8", errors="replace")
    return text + "\n[output truncated]\n" if raw.truncated else text


def _cap(text, limit=TEXT_CAP):
    return text if len(text) <= limit else text[:limit] + "...[truncated]"


_REPRS = (
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("image/svg+xml", "_repr_svg_"),
    ("image/png", "_repr_png_"),
    ("image/jpeg", "_repr_jpeg_"),
    ("text/latex", "_repr_latex_"),
    ("application/json", "_repr_json_"),
)


def _figure_png(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def mime_bundle(obj):
    """The rich forms of obj (never raises: a broken _repr_ is skipped)."""
    data = {}
    mpl_figure = sys.modules.get("matplotlib.figure")
    if mpl_figure is not None and isinstance(obj, mpl_figure.Figure):
        try:
            data["image/png"] = _figure_png(obj)
        except Exception:
            pass
    for mime, attr in _REPRS:
        method = getattr(type(obj), attr, None)
        if method is None or mime in data:
            continue
        try:
            out = method(obj)
        except Exception:
            continue
        if isinstance(out, tuple):  # (data, metadata)
            out = out[0]
        if out is None:
            continue
        if isinstance(out, bytes):
            out = base64.b64encode(out).decode("ascii")
        elif mime == "application/json":
            try:
                json.dumps(out)
            except (TypeError, ValueError):
                continue
        elif not isinstance(out, str):
            continue
        if not isinstance(out, str) or len(out) <= MIME_CAP:
            data[mime] = out
    return data


def _open_figures():
    """PNGs of the figures a cell left open (then closed, as a notebook's inline backend does)."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return []
    out = []
    try:
        for num in plt.get_fignums():
            png = _figure_png(plt.figure(num))
            if len(png) <= MIME_CAP:
                out.append({"image/png": png, "text/plain": "<Figure %d>" % num})
        plt.close("all")
    except Exception:
        pass
    return out


def _user_tb(tb):
    # Drop this server's own frames from the top of the traceback.
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) == THIS_FILE:
        tb = tb.tb_next
    return tb


class Context:
    """One namespace cells run in: its globals, execution count and cwd."""

    def __init__(self, cid, cwd, display):
        self.id, self.cwd = cid, cwd
        self.reset(display)

    def reset(self, display):
        self.globals = {"__name__": "__main__", "__builtins__": builtins, "display": display}
        if numpy is not None:
            self.globals["np"] = self.globals["numpy"] = numpy
        self.count = 0

    def view(self):
        return {"id": self.id, "cwd": self.cwd}


def _take_pending_interrupt():
    """An interrupt that came while the cell was prepared (parsed, compiled) is raised now."""
    global _interrupt_pending
    if _interrupt_pending:
        _interrupt_pending = False
        raise KeyboardInterrupt


def _op_error(kind, message):
    return {"ok": False, "context_error": kind,
            "error": {"name": "ContextError", "value": message, "traceback": ""}}


def _apply_env(env):
    saved = {k: os.environ.get(k) for k in env}
    for k, v in env.items():
        os.environ[k] = v
    return saved


def _restore_env(saved):
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


class Interpreter:
    def __init__(self, proto=None):
        self.proto = proto
        self.shown = []
        self.contexts = {"default": Context("default", os.getcwd(), self.display)}
        self.context = self.contexts["default"]

    @property
    def globals(self):
        return self.context.globals

    def display(self, *objs):
        """Shows objects as rich output of the current cell (like IPython's display())."""
        for obj in objs:
            if len(self.shown) >= DISPLAY_MAX:
                return
            data = mime_bundle(obj)
            try:
                data.setdefault("text/plain", _cap(repr(obj)))
            except Exception:
                data.setdefault("text/plain", "<unprintable %s>" % type(obj).__name__)
            self.shown.append(data)

    def op(self, opts):
        """A context operation: create, list, delete, restart."""
        op, cid = opts.get("op"), opts.get("context")
        if op == "list":
            return {"ok": True, "contexts": [c.view() for c in self.contexts.values()]}
        if op == "create":
            if len(self.contexts) > CONTEXTS_MAX:
                return _op_error("limit", "at most %d contexts per kernel" % CONTEXTS_MAX)
            cwd = opts.get("cwd") or self.contexts["default"].cwd
            if not isinstance(cwd, str) or not os.path.isdir(cwd):
                return _op_error("invalid", "cwd %r is not a directory" % (cwd,))
            ctx = Context(os.urandom(8).hex(), os.path.abspath(cwd), self.display)
            self.contexts[ctx.id] = ctx
            return {"ok": True, "context": ctx.view()}
        ctx = self.contexts.get(cid) if isinstance(cid, str) else None
        if ctx is None:
            return _op_error("not_found", "no context %r" % (cid,))
        if op == "delete":
            if ctx.id == "default":
                return _op_error("invalid", "the default context cannot be deleted")
            del self.contexts[ctx.id]
            return {"ok": True, "context": ctx.view()}
        if op == "restart":
            ctx.reset(self.display)
            return {"ok": True, "context": ctx.view()}
        return _op_error("invalid", "unknown op %r" % (op,))

    def run(self, code, opts=None, ident=0):
        global _in_cell
        opts = opts or {}
        cid = opts.get("context") or "default"
        ctx = self.contexts.get(cid) if isinstance(cid, str) else None
        if ctx is None:
            return _op_error("not_found", "no context %r" % (cid,))
        env = opts.get("env") or {}
        if not isinstance(env, dict):
            env = {}
        env = {str(k): str(v) for k, v in env.items() if "=" not in str(k) and "\0" not in str(k) + str(v)}
        self.context = ctx
        ctx.count += 1
        name = "<cell %d>" % ctx.count if ctx.id == "default" else "<cell %s:%d>" % (ctx.id[:8], ctx.count)
        # register the source so tracebacks show the offending lines
        linecache.cache[name] = (len(code), None, code.splitlines(True), name)
        if opts.get("stream") and self.proto is not None:
            out = _capture(_StreamedBytes(self.proto, ident, b"o"))
            err = _capture(_StreamedBytes(self.proto, ident, b"e"))
        else:
            out, err = _capture(), _capture()
        result = {"ok": True, "value": None, "value_data": None, "display": [],
                  "stdout": "", "stderr": "", "error": None, "context": ctx.id,
                  "execution_count": ctx.count}
        self.shown = []
        saved = sys.stdout, sys.stderr
        saved_env = _apply_env(env)
        sys.stdout, sys.stderr = out, err
        try:
            try:
                try:
                    os.chdir(ctx.cwd)
                except OSError as e:
                    err.write("[forkd: cannot enter the context's cwd %s: %s]\n" % (ctx.cwd, e))
                tree = ast.parse(code, name, "exec")
                last = None
                if tree.body and isinstance(tree.body[-1], ast.Expr):
                    last = ast.Expression(tree.body.pop().value)
                body = compile(tree, name, "exec")
                last = compile(last, name, "eval") if last is not None else None
                _in_cell = True
                _take_pending_interrupt()
                exec(body, ctx.globals)
                if last is not None:
                    value = eval(last, ctx.globals)
                    if value is not None:
                        result["value"] = _cap(repr(value))
                        result["value_data"] = mime_bundle(value) or None
                        mpl_figure = sys.modules.get("matplotlib.figure")
                        plt = sys.modules.get("matplotlib.pyplot")
                        if (mpl_figure is not None and plt is not None
                                and isinstance(value, mpl_figure.Figure)):
                            plt.close(value)  # shown as the value, not again as a display
            finally:
                _in_cell = False
        except BaseException as e:  # SystemExit and KeyboardInterrupt included
            tb = None if isinstance(e, SyntaxError) else _user_tb(e.__traceback__)
            try:
                text = "".join(traceback.format_exception(type(e), e, tb))
                value = str(e)
            except BaseException as fmt_err:  # a broken __str__ must not kill us
                text = value = "<unprintable %s: %r>" % (type(e).__name__, fmt_err)
            result["ok"] = False
            result["error"] = {"name": type(e).__name__, "value": _cap(value),
                               "traceback": _cap(text)}
        finally:
            sys.stdout, sys.stderr = saved
            _restore_env(saved_env)
            try:
                ctx.cwd = os.getcwd()
            except OSError:
                pass
        result["display"] = (self.shown + _open_figures())[:DISPLAY_MAX]
        self.shown = []
        result["stdout"] = _captured_text(out)
        result["stderr"] = _captured_text(err)
        return result


def reseed():
    random.seed(os.urandom(32))
    if numpy is not None:
        numpy.random.seed(numpy.frombuffer(os.urandom(32), dtype=numpy.uint32))
    return {"ok": True, "value": None, "value_data": None, "display": [],
            "stdout": "", "stderr": "", "error": None}


def encode(result):
    """JSON-encode, shrinking the bulkiest fields until it fits the reply limit."""
    while True:
        data = json.dumps(result, ensure_ascii=False).encode("utf-8", errors="replace")
        if len(data) <= REPLY_MAX:
            return data
        # Rich outputs go first (last shown first), then the value's rich forms.
        if result.get("display"):
            result["display"].pop()
            result["stderr"] = (result["stderr"] or "") + "[a rich output was dropped: reply too large]\n"
            continue
        if result.get("value_data"):
            result["value_data"] = None
            continue
        key = max(("stdout", "stderr", "value"), key=lambda k: len(result.get(k) or ""))
        text = result.get(key) or ""
        if not text:
            err = result["error"]  # only the error can still be too big
            err["traceback"] = err["traceback"][: len(err["traceback"]) // 2]
            err["value"] = err["value"][: len(err["value"]) // 2]
            continue
        result[key] = text[: len(text) // 2] + "\n[truncated]\n"


def read_exact(fd, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            os._exit(0)  # the agent closed the pipe
        buf += chunk
    return bytes(buf)


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def parse_request(payload):
    """(code, options): a payload starting with NUL carries a line of JSON options first."""
    if not payload.startswith(b"\0"):
        return payload.decode("utf-8", errors="replace"), None
    head, _, code = payload[1:].partition(b"\n")
    try:
        opts = json.loads(head.decode("utf-8"))
    except ValueError:
        opts = None
    if not isinstance(opts, dict):
        opts = {"op": "invalid"}
    return code.decode("utf-8", errors="replace"), opts


def main():
    global _busy, _interrupt_pending
    # private protocol fds; 0 and 1 go to /dev/null (stderr stays for crash reports)
    proto_in, proto_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    sys.stdin = open(0, "r", closefd=False)
    signal.signal(signal.SIGINT, _on_sigint)
    proto = Proto(proto_out)
    interp = Interpreter(proto)
    while True:
        length, ident = struct.unpack(">II", read_exact(proto_in, 8))
        code, opts = parse_request(read_exact(proto_in, length - 4))
        _interrupt_pending = False
        _busy = True
        try:
            if ident == 0 and not code and opts is None:
                result = reseed()
            elif opts is not None and "op" in opts:
                result = interp.op(opts)
            else:
                result = interp.run(code, opts, ident)
            data = encode(result)
        except BaseException as e:  # e.g. MemoryError: answer anyway, keep serving
            data = encode({"ok": False, "value": None, "value_data": None, "display": [],
                           "stdout": "", "stderr": "",
                           "error": {"name": type(e).__name__, "value": _cap(repr(e)),
                                     "traceback": ""}})
        proto.frame(ident, data)
        _busy = _interrupt_pending = False


if __name__ == "__main__":
    main()
