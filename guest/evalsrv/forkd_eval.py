"""forkd warm Python interpreter (runs inside the guest, driven by forkd-agent).

Protocol on stdin/stdout (see docs/agent-protocol.md, "Agent to interpreter"):
request  = u32 BE length, u32 BE id, UTF-8 code
reply    = u32 BE length, u32 BE id, UTF-8 JSON
Id 0 with empty code reseeds `random` and `numpy.random` from os.urandom.

Cells run notebook-style in one persistent globals dict: all statements are executed and,
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

_in_cell = False


def _on_sigint(signum, frame):
    # The agent sends SIGINT on timeout. Outside a cell (a late signal) it is ignored.
    if _in_cell:
        raise KeyboardInterrupt


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


def _capture():
    return io.TextIOWrapper(_CappedBytes(), encoding="utf-8", errors="replace",
                            line_buffering=False, write_through=True)


def _captured_text(stream):
    stream.flush()
    raw = stream.buffer
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


class Interpreter:
    def __init__(self):
        self.globals = {"__name__": "__main__", "__builtins__": builtins,
                        "display": self.display}
        self.shown = []
        if numpy is not None:
            self.globals["np"] = self.globals["numpy"] = numpy
        self.count = 0

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

    def run(self, code):
        global _in_cell
        self.count += 1
        name = "<cell %d>" % self.count
        # register the source so tracebacks show the offending lines
        linecache.cache[name] = (len(code), None, code.splitlines(True), name)
        out, err = _capture(), _capture()
        result = {"ok": True, "value": None, "value_data": None, "display": [],
                  "stdout": "", "stderr": "", "error": None}
        self.shown = []
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = out, err
        try:
            try:
                tree = ast.parse(code, name, "exec")
                last = None
                if tree.body and isinstance(tree.body[-1], ast.Expr):
                    last = ast.Expression(tree.body.pop().value)
                body = compile(tree, name, "exec")
                last = compile(last, name, "eval") if last is not None else None
                _in_cell = True
                exec(body, self.globals)
                if last is not None:
                    value = eval(last, self.globals)
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
        key = max(("stdout", "stderr", "value"), key=lambda k: len(result[k] or ""))
        text = result[key] or ""
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


def main():
    # private protocol fds; 0 and 1 go to /dev/null (stderr stays for crash reports)
    proto_in, proto_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    sys.stdin = open(0, "r", closefd=False)
    signal.signal(signal.SIGINT, _on_sigint)
    interp = Interpreter()
    while True:
        length, ident = struct.unpack(">II", read_exact(proto_in, 8))
        code = read_exact(proto_in, length - 4).decode("utf-8", errors="replace")
        try:
            result = reseed() if ident == 0 and not code else interp.run(code)
            data = encode(result)
        except BaseException as e:  # e.g. MemoryError: answer anyway, keep serving
            data = encode({"ok": False, "value": None, "value_data": None, "display": [],
                           "stdout": "", "stderr": "",
                           "error": {"name": type(e).__name__, "value": _cap(repr(e)),
                                     "traceback": ""}})
        try:
            write_all(proto_out, struct.pack(">II", len(data) + 4, ident) + data)
        except BrokenPipeError:
            os._exit(0)  # the agent is gone


if __name__ == "__main__":
    main()
