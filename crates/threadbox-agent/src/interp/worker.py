# threadbox Python context worker (embedded in the agent; see docs/interpreter.md).
#
# Started by a bootstrap `python3 -c` that reads this source from the control socket.
# Standard library only. One request at a time on the control socket (NDJSON, one JSON
# object per line each way); fds 1 and 2 are pipes to the agent, so output of
# subprocesses and C code is captured there, while Python-level prints travel on the
# control socket in order with displays.
import ast
import base64
import builtins
import codecs
import importlib.abc
import importlib.util
import io
import json
import linecache
import os
import signal
import sys
import tokenize
import traceback
import types

CTL = CTL_FD  # noqa: F821 - set by the bootstrap
MAX_TEXT = 100 * 1024
MAX_VALUE = 8 * 1024 * 1024
MAX_DISPLAY_TOTAL = 16 * 1024 * 1024
MAX_DISPLAYS = 64

_wlock = None
try:
    import threading

    _wlock = threading.Lock()
except Exception:  # pragma: no cover - threads always exist in CPython builds we target
    pass


def _send(obj):
    line = (json.dumps(obj, separators=(",", ":"), default=str) + "\n").encode()
    if _wlock:
        _wlock.acquire()
    try:
        view = memoryview(line)
        while view:
            n = os.write(CTL, view)
            view = view[n:]
    finally:
        if _wlock:
            _wlock.release()


class _Cell:
    running = False
    displays = 0
    display_bytes = 0
    truncated = False


STATE = _Cell()


class _Stream(io.TextIOBase):
    """sys.stdout/sys.stderr: text goes on the control socket as `stream` events."""

    def __init__(self, name, fd):
        self.name_ = name
        self.fd = fd

    @property
    def encoding(self):
        return "utf-8"

    def writable(self):
        return True

    def fileno(self):
        return self.fd

    def isatty(self):
        return False

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError("write() argument must be str, not %s" % type(s).__name__)
        if s:
            _send({"ev": "stream", "name": self.name_, "text": s})
        return len(s)

    def flush(self):
        pass


def _after_fork_in_child():
    # A forked child (multiprocessing, os.fork) must not write on the control socket:
    # its prints go to fds 1/2 like a subprocess's.
    try:
        os.close(CTL)
    except OSError:
        pass
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)


os.register_at_fork(after_in_child=_after_fork_in_child)


def _b64(b):
    return base64.b64encode(b).decode("ascii")


_ORDER = [
    ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_latex_", "text/latex"),
    ("_repr_json_", "application/json"),
    ("_repr_javascript_", "application/javascript"),
]


def _is_class(obj):
    return isinstance(obj, type)


def _norm(mime, value):
    """A MIME value as JSON: bytes as base64, */json as JSON, the rest as text."""
    if isinstance(value, (bytes, bytearray)):
        return _b64(bytes(value))
    if mime.endswith("json"):
        return value
    if isinstance(value, str):
        return value
    return str(value)


def _text_repr(obj):
    try:
        t = repr(obj)
    except Exception as e:  # a broken __repr__ must not break the cell
        t = "<repr failed: %s: %s>" % (type(e).__name__, e)
    if len(t) > MAX_TEXT:
        STATE.truncated = True
        t = t[:MAX_TEXT] + "..."
    return t


def format_object(obj):
    """(data, metadata) of an object, the way IPython's formatter builds a MIME bundle."""
    data, md = {}, {}
    fig = _mpl_figure_png(obj)
    if fig is not None:
        data["image/png"] = _b64(fig)
    elif not _is_class(obj) and hasattr(obj, "_repr_mimebundle_"):
        try:
            r = obj._repr_mimebundle_()
        except TypeError:
            r = obj._repr_mimebundle_(include=None, exclude=None)
        if isinstance(r, tuple):
            r, md = r[0], (r[1] or {})
        for mime, value in (r or {}).items():
            data[mime] = _norm(mime, value)
    else:
        for meth, mime in _ORDER:
            f = getattr(obj, meth, None)
            if f is None or not callable(f) or _is_class(obj):
                continue
            try:
                v = f()
            except Exception:
                continue
            if v is None:
                continue
            if isinstance(v, tuple) and len(v) == 2:
                v, m = v
                md[mime] = m
            data[mime] = _norm(mime, v)
    if "text/plain" not in data:
        data["text/plain"] = _text_repr(obj)
    # Bound every value; an oversize one is dropped and marked.
    for mime in list(data):
        v = data[mime]
        size = len(v) if isinstance(v, str) else len(json.dumps(v, default=str))
        if size > MAX_VALUE:
            del data[mime]
            md.setdefault("threadbox", {}).setdefault("dropped", []).append(mime)
            STATE.truncated = True
    return data, md


def display(*objs, **kwargs):
    """Shows each object as a rich output of the cell (like IPython's display)."""
    for obj in objs:
        if kwargs.get("raw") and isinstance(obj, dict):
            data, md = obj, kwargs.get("metadata") or {}
        else:
            data, md = format_object(obj)
        _emit_display(data, md)


def _emit_display(data, md):
    size = sum(len(v) if isinstance(v, str) else 0 for v in data.values())
    if STATE.displays >= MAX_DISPLAYS or STATE.display_bytes + size > MAX_DISPLAY_TOTAL:
        STATE.truncated = True
        return
    STATE.displays += 1
    STATE.display_bytes += size
    _send({"ev": "display", "data": data, "metadata": md})


builtins.display = display


# matplotlib: a backend of ours (module://threadbox_mpl) flushes figures as PNG at show()
# and at the end of a cell, unless the user chose a backend.
def _mpl_figure_png(obj):
    mpl = sys.modules.get("matplotlib.figure")
    if mpl is None or not isinstance(obj, mpl.Figure):
        return None
    buf = io.BytesIO()
    obj.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()


def _flush_figures():
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    try:
        nums = plt.get_fignums()
    except Exception:
        return
    for n in nums:
        try:
            fig = plt.figure(n)
            png = _mpl_figure_png(fig)
            if png is not None:
                _emit_display({"image/png": _b64(png), "text/plain": repr(fig)}, {})
        except Exception as e:
            _send({"ev": "stream", "name": "stderr", "text": "threadbox: a figure could not be rendered: %s\n" % e})
    try:
        plt.close("all")
    except Exception:
        pass


_BACKEND_SRC = """
from matplotlib.backends.backend_agg import FigureCanvasAgg as FigureCanvas
from matplotlib.backend_bases import FigureManagerBase as FigureManager
def show(*args, **kwargs):
    _flush()
"""


class _BackendFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name == "threadbox_mpl":
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__dict__["_flush"] = _flush_figures
        exec(compile(_BACKEND_SRC, "<threadbox_mpl>", "exec"), module.__dict__)


sys.meta_path.append(_BackendFinder())
if "MPLBACKEND" not in os.environ:
    os.environ["MPLBACKEND"] = "module://threadbox_mpl"


# Cells run in a real __main__, so pickle and multiprocessing find what they define.
MAIN = types.ModuleType("__main__")
MAIN.__dict__["__builtins__"] = builtins
sys.modules["__main__"] = MAIN
sys.argv = [""]
_loop = None


def _on_sigint(signum, frame):
    # Between cells an interrupt has nothing to stop (the agent only signals busy
    # contexts, but a signal may arrive just after a cell ended).
    if STATE.running:
        raise KeyboardInterrupt


signal.signal(signal.SIGINT, _on_sigint)


def _suppressed(code):
    """Whether the cell's last token is `;` (IPython: no value shown)."""
    last = None
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type in (tokenize.NEWLINE, tokenize.NL, tokenize.COMMENT, tokenize.ENDMARKER,
                            tokenize.INDENT, tokenize.DEDENT):
                continue
            last = tok
    except (tokenize.TokenError, SyntaxError):
        return False
    return last is not None and last.type == tokenize.OP and last.string == ";"


def _run_code(code_obj):
    global _loop
    flags = getattr(code_obj, "co_flags", 0)
    if flags & 0x80:  # CO_COROUTINE: the cell used top-level await
        import asyncio

        if _loop is None:
            _loop = asyncio.new_event_loop()
        return _loop.run_until_complete(eval(code_obj, MAIN.__dict__))
    return eval(code_obj, MAIN.__dict__)


def _user_tb(tb):
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell-"):
        tb = tb.tb_next
    return tb


def _exception(e, filename):
    tb = _user_tb(e.__traceback__)
    te = traceback.TracebackException(type(e), e, tb, compact=True) if sys.version_info >= (3, 10) \
        else traceback.TracebackException(type(e), e, tb)
    text = "".join(te.format())
    if tb is None and not isinstance(e, SyntaxError):
        text = "".join(traceback.format_exception_only(type(e), e))
    frames = []
    for fs in traceback.extract_tb(tb) if tb is not None else []:
        frames.append({"file": fs.filename, "line": fs.lineno, "function": fs.name, "source": fs.line or ""})
    out = {"ev": "exception", "name": type(e).__name__, "value": str(e), "traceback": text, "frames": frames}
    if isinstance(e, SyntaxError):
        out["line"] = e.lineno
        out["offset"] = e.offset
    return out


def execute(req):
    n = req.get("execution_count", 0)
    code = req.get("code", "")
    filename = "<cell-%d>" % n
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    env = req.get("env") or {}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    STATE.displays = 0
    STATE.display_bytes = 0
    STATE.truncated = False
    status = "ok"
    try:
        STATE.running = True
        # From here on SIGINT interrupts the cell; the agent holds its signal until it
        # reads this, so an interrupt cannot fall before the cell and be lost.
        _send({"ev": "started"})
        try:
            flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT if hasattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT") else 0
            tree = ast.parse(code, filename, "exec")
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr) and not _suppressed(code):
                last = ast.Expression(tree.body.pop().value)
            _run_code(compile(tree, filename, "exec", flags=flags, dont_inherit=True))
            if last is not None:
                value = _run_code(compile(last, filename, "eval", flags=flags, dont_inherit=True))
                if value is not None:
                    builtins._ = value
                    data, md = format_object(value)
                    _send({"ev": "result", "data": data, "metadata": md})
            _flush_figures()
        finally:
            STATE.running = False
    except BaseException as e:  # noqa: B036 - SystemExit and KeyboardInterrupt are results too
        STATE.running = False
        status = "exception"
        try:
            _flush_figures()
        except BaseException:
            pass
        _send(_exception(e, filename))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for s in (sys.__stdout__, sys.__stderr__):
            try:
                s.flush()
            except Exception:
                pass
    _send({"ev": "done", "status": status, "truncated": STATE.truncated})


def main():
    sys.stdout = _Stream("stdout", 1)
    sys.stderr = _Stream("stderr", 2)
    # Python-level output of the worker itself goes to fd 1/2 only through these.
    sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    sys.__stderr__ = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)
    _send({"ev": "ready", "pid": os.getpid(), "python": sys.version.split()[0]})
    dec = codecs.getincrementaldecoder("utf-8")("replace")
    buf = ""
    while True:
        try:
            chunk = os.read(CTL, 1 << 16)
        except KeyboardInterrupt:
            continue
        except InterruptedError:
            continue
        if not chunk:
            return
        buf += dec.decode(chunk)
        while "\n" in buf:
            line, buf = buf.split("\n", 1)
            if not line.strip():
                continue
            try:
                req = json.loads(line)
            except ValueError:
                _send({"ev": "error", "message": "malformed request"})
                continue
            if req.get("op") == "execute":
                execute(req)
            else:
                _send({"ev": "error", "message": "unknown op"})


main()
