"""Deep Agents backend: :class:`ThreadboxSandbox` (a ``BaseSandbox`` subclass)."""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import inspect
import posixpath
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from deepagents.backends.protocol import (
    ExecuteResponse,
    FileDownloadResponse,
    FileOperationError,
    FileUploadResponse,
)
from deepagents.backends.sandbox import BaseSandbox

from threadbox import (
    AsyncSandbox,
    AsyncThreadbox,
    ExecResult,
    Sandbox,
    SandboxNotFound,
    SandboxNotRunning,
    Threadbox,
    ThreadboxError,
)

from ._output import NEW_SANDBOX_NOTE, human_bytes, safe_text
from ._paths import escape_name, raw_path, sdk_path
from .binding import (
    DEFAULT_THREAD_PREFIX,
    ClientFactory,
    FixedSandbox,
    SandboxBinding,
    ThreadIdMissing,
    ThreadSandboxes,
)

__all__ = ["HOME", "ThreadboxSandbox"]

DEFAULT_TIMEOUT = 30 * 60
TIMEOUT_EXIT_CODE = 124
HOME = "/home/user"
# The top level of the sandbox images (a Debian-like root); anything else under "/"
# is a name the model made up for its own files, and is taken to mean the home.
_SYSTEM_DIRS = frozenset(
    {
        *("bin", "boot", "dev", "etc", "home", "lib", "lib32", "lib64", "libx32", "media", "mnt", "opt"),
        *("proc", "root", "run", "sbin", "srv", "sys", "tmp", "usr", "var"),
    }
)
# Inherited file operations and the name of their path argument.
_PATH_ARGS = {
    "ls": "path",
    "ls_info": "path",
    "read": "file_path",
    "write": "file_path",
    "edit": "file_path",
    "grep": "path",
    "grep_raw": "path",
    "glob": "path",
    "glob_info": "path",
}


# Set while an inherited helper (ls, read, grep, ...) runs: its `execute` calls carry
# commands whose output the helper parses (JSON), so that output stays as it is, and a
# pending new-sandbox note waits for the next call the model itself made.
_IN_HELPER: contextvars.ContextVar[bool] = contextvars.ContextVar("threadbox_da_helper", default=False)


def map_path(path: Any) -> Any:
    """``/notes.md`` and ``/proj/app.py`` -> ``/home/user/...``; system paths unchanged.

    Deep Agents turns a relative path into ``/``-rooted one before the backend sees
    it, and its prompt tells the model that paths are absolute, so a model writes
    ``/notes.md``, which the sandbox refuses (``/`` is not writable). Such a path is
    resolved against the home instead; ``/etc/...``, ``/tmp/...``, ``/home/...`` and
    the other top-level directories of the image keep their meaning.
    """
    if not isinstance(path, str) or not path.startswith("/"):
        return path
    first = path.lstrip("/").split("/", 1)[0]
    if not first or first in _SYSTEM_DIRS:
        return path
    return posixpath.normpath(HOME + "/" + path.lstrip("/"))


# Alias path -> the bytes it stands for, while a helper runs on a name that is not UTF-8.
_ALIASES: contextvars.ContextVar[dict[str, bytes] | None] = contextvars.ContextVar("threadbox_da_aliases", default=None)
_MAKE_ALIAS = "import os, sys; os.symlink(bytes.fromhex(sys.argv[1]), sys.argv[2])"


def _escape_surrogates(path: str) -> str:
    """A path as listed (``surrogateescape`` for bytes that are not UTF-8) as the model sees it."""
    return escape_name(path.encode("utf-8", "surrogateescape"))


def _shown(result: Any, alias: str | None = None, shown: str | None = None) -> Any:
    """A helper's result with every path a model can read and give back (ADR 0026).

    Paths of names that are not UTF-8 come out of the inherited helpers as lone
    surrogates (which no provider API takes); they become ``\\xNN`` escapes. A helper
    run on an alias gets its paths and messages put back in the caller's terms.
    """
    if not dataclasses.is_dataclass(result) or isinstance(result, type):
        return result
    changes: dict[str, Any] = {}
    for attr in ("entries", "matches"):
        items = getattr(result, attr, None)
        if not isinstance(items, list):
            continue
        out = []
        for item in items:
            if isinstance(item, dict) and isinstance(item.get("path"), str):
                p = item["path"]
                if alias is not None and shown is not None and p.startswith(alias):
                    p = shown + p[len(alias) :]
                item = {**item, "path": _escape_surrogates(p)}
            out.append(item)
        changes[attr] = out
    err = getattr(result, "error", None)
    if isinstance(err, str) and alias is not None and shown is not None:
        changes["error"] = err.replace(alias, shown)
    return dataclasses.replace(result, **changes) if changes else result


def _alias_name() -> str:
    return f"/tmp/.threadbox-alias-{uuid.uuid4().hex[:12]}"


def _raw_target(path: str) -> bytes | None:
    """The bytes an escaped absolute path stands for (None: a plain path)."""
    raw = raw_path(path)
    if raw is None:
        return None
    return raw if raw.startswith(b"/") else HOME.encode() + b"/" + raw


class _HelperCall:
    """One call of an inherited helper (``ls``, ``read``, ...): its path argument mapped,
    and for a name that is not UTF-8 a plain-named alias to reach it by (ADR 0026).

    The inherited helpers put their path into a program as UTF-8 text, which cannot
    name other bytes; a symlink in ``/tmp`` with a plain name can. While the call runs,
    ``execute`` knows it serves a helper (its output is parsed, not shown) and
    ``upload_files``/``download_files`` resolve the alias to the bytes.
    """

    def __init__(self, backend: ThreadboxSandbox, sig: inspect.Signature, arg: str, args: Any, kwargs: Any) -> None:
        self.bound = sig.bind_partial(backend, *args, **kwargs)
        path = self.bound.arguments.get(arg)
        self.path = map_path(path) if backend._map_paths else path
        self.raw = _raw_target(self.path) if isinstance(self.path, str) else None
        self.alias = _alias_name() if self.raw is not None else None
        if isinstance(self.path, str):
            self.bound.arguments[arg] = self.alias or self.path

    def make_alias(self) -> list[str]:
        assert self.raw is not None and self.alias is not None
        return ["python3", "-c", _MAKE_ALIAS, self.raw.hex(), self.alias]

    def drop_alias(self) -> list[str]:
        return ["rm", "-f", str(self.alias)]

    def result(self, r: Any) -> Any:
        return _shown(r, self.alias, self.path if self.alias else None)

    def __enter__(self) -> _HelperCall:
        aliases = _ALIASES.get() or {}
        if self.alias is not None and self.raw is not None:
            aliases = {**aliases, self.alias: self.raw}
        self._tokens = (_IN_HELPER.set(True), _ALIASES.set(aliases))
        return self

    def __exit__(self, *_: object) -> None:
        helper, aliases = self._tokens
        _ALIASES.reset(aliases)
        _IN_HELPER.reset(helper)


def _wrap_helper(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` (inherited, sync or async) run as a :class:`_HelperCall`."""
    sig = inspect.signature(method)
    arg = _PATH_ARGS[name]

    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def awrapper(self: ThreadboxSandbox, *args: Any, **kwargs: Any) -> Any:
            with _HelperCall(self, sig, arg, args, kwargs) as call:
                if call.alias is None:
                    return call.result(await method(*call.bound.args, **call.bound.kwargs))
                sb = await self._asandbox()
                await sb.exec(call.make_alias(), timeout=30)
                try:
                    return call.result(await method(*call.bound.args, **call.bound.kwargs))
                finally:
                    await sb.exec(call.drop_alias(), timeout=30)

        return awrapper

    @functools.wraps(method)
    def wrapper(self: ThreadboxSandbox, *args: Any, **kwargs: Any) -> Any:
        with _HelperCall(self, sig, arg, args, kwargs) as call:
            if call.alias is None:
                return call.result(method(*call.bound.args, **call.bound.kwargs))
            sb = self.sandbox()
            sb.exec(call.make_alias(), timeout=30)
            try:
                return call.result(method(*call.bound.args, **call.bound.kwargs))
            finally:
                sb.exec(call.drop_alias(), timeout=30)

    return wrapper


def _file_error(e: ThreadboxError) -> FileOperationError | None:
    """Maps a daemon error on a file operation to Deep Agents' literals (None: not a file error)."""
    if isinstance(e, SandboxNotFound):
        return None
    msg = e.message.lower()
    if "directory" in msg and ("is a" in msg or "is_directory" in msg or "isdir" in msg):
        return "is_directory"
    if e.code == "not_found":
        return "file_not_found"
    if e.code == "permission_denied":
        return "permission_denied"
    if e.code in ("invalid_argument", "conflict"):
        return "invalid_path"
    return None


def _combine(r: ExecResult, timeout: float, *, for_model: bool = True) -> ExecuteResponse:
    """stdout then stderr, and how the command ended.

    For the model, bytes that are not text (NUL, other control characters, invalid UTF-8)
    are escaped as ``\\xNN`` and mostly-binary output is summarised, as the toolkit does
    (ADR 0024). A helper's own command (``ls``/``read``/... parse JSON) gets the text as
    it came.
    """
    if for_model:
        out, _ = safe_text(r.stdout_bytes)
        err, _ = safe_text(r.stderr_bytes)
    else:
        out, err = r.stdout, r.stderr
    if err:
        if out and not out.endswith("\n"):
            out += "\n"
        out += err
    if r.timed_out:
        if out and not out.endswith("\n"):
            out += "\n"
        out += f"Command timed out after {timeout:g} seconds"
        return ExecuteResponse(output=out, exit_code=TIMEOUT_EXIT_CODE, truncated=r.truncated)
    exit_code = r.exit_code
    if exit_code is None and r.signal is not None:
        exit_code = 128 + r.signal
    if r.oom_killed:
        if out and not out.endswith("\n"):
            out += "\n"
        limit = f" (limit {human_bytes(r.memory_limit_bytes)})" if r.memory_limit_bytes else ""
        out += f"Killed: out of memory{limit}"
    return ExecuteResponse(output=out, exit_code=exit_code, truncated=r.truncated)


class ThreadboxSandbox(BaseSandbox):
    """A Deep Agents sandbox backend that runs in threadbox.

    Pick one of:

    - ``ThreadboxSandbox(sandbox=sb)``: an existing :class:`threadbox.Sandbox`;
    - ``ThreadboxSandbox(sandbox="name")``: that sandbox, created on first use;
    - ``ThreadboxSandbox(per_thread=True)``: the current LangGraph thread's sandbox
      (``thread-<thread_id>``, from ``langgraph.config.get_config()``), so one
      ``create_deep_agent(..., backend=ThreadboxSandbox(per_thread=True))`` keeps
      each conversation's files apart.

    Commands run with ``/bin/sh -c`` as uid 1000 in ``/home/user``; ``output`` is
    stdout followed by stderr. A timeout gives exit code 124. File paths must be
    absolute (``invalid_path`` otherwise), as Deep Agents expects; a ``/``-rooted
    path outside the image's system directories (``/notes.md``, ``/proj/app.py``)
    means the same path under ``/home/user`` (``map_paths=False`` turns that off).
    Give the agent :data:`langchain_threadbox.THREADBOX_SYSTEM_PROMPT` (as
    ``create_deep_agent(system_prompt=...)``) so the model knows where it may write.

    Args:
        sandbox: A sandbox handle, or a sandbox name/id.
        per_thread: Bind to the current LangGraph thread instead.
        client: A :class:`threadbox.Threadbox` (default: from ``THREADBOX_URL``).
        async_client: Optional :class:`threadbox.AsyncThreadbox` for the async twins
            (default: one per event loop).
        sandbox_options: ``get_or_create`` options for sandboxes this creates.
        timeout: Default command timeout in seconds (30 minutes).
        max_output_bytes: Capture bound per stream passed to the daemon.
        map_paths: Resolve made-up ``/``-rooted paths against ``/home/user``.
        binding: A binding to share instead of ``sandbox``/``per_thread``, e.g. a
            :class:`~langchain_threadbox.TimeTravelSaver`'s ``sandboxes`` so the
            thread's sandbox follows the graph's time travel (ADR 0115).
    """

    # deepagents >= 0.7: keep execute output inline (no capture-to-file shell wrapper).
    enable_capture_offload = False

    def __init__(
        self,
        *,
        sandbox: Sandbox | str | None = None,
        per_thread: bool = False,
        client: Threadbox | None = None,
        async_client: AsyncThreadbox | None = None,
        url: str | None = None,
        api_key: str | None = None,
        sandbox_options: Mapping[str, Any] | None = None,
        thread_prefix: str = DEFAULT_THREAD_PREFIX,
        timeout: int = DEFAULT_TIMEOUT,
        max_output_bytes: int | None = 8 << 20,
        map_paths: bool = True,
        binding: SandboxBinding | None = None,
    ) -> None:
        if binding is not None:
            if sandbox is not None:
                raise ValueError("pass binding=... or sandbox=..., not both")
            per_thread = isinstance(binding, ThreadSandboxes)
        elif (sandbox is None) == (not per_thread):
            raise ValueError("pass exactly one of sandbox=... or per_thread=True")
        if client is None and isinstance(sandbox, Sandbox):
            client = sandbox.client
        factory = ClientFactory(client, url=url, api_key=api_key, async_client=async_client)
        self._binding: SandboxBinding
        if binding is not None:
            self._binding = binding
        elif per_thread:
            self._binding = ThreadSandboxes(factory, prefix=thread_prefix, create_options=sandbox_options)
        else:
            assert sandbox is not None
            self._binding = FixedSandbox(
                sandbox, factory=factory, create=isinstance(sandbox, str), create_options=sandbox_options
            )
        self._fixed: Sandbox | None = sandbox if isinstance(sandbox, Sandbox) else None
        self._timeout = timeout
        self._max_output_bytes = max_output_bytes
        self._map_paths = map_paths
        self._per_thread = per_thread
        # Sandbox name -> id of the sandbox this backend last used under it, and the names
        # whose sandbox was created again since (their next execute says so; ADR 0025).
        self._seen: dict[str, str] = {}
        self._recreated: set[str] = set()
        self._lock = threading.Lock()

    # -- resolution -----------------------------------------------------------

    def sandbox(self) -> Sandbox:
        """The threadbox sandbox commands run in now (resolved per call)."""
        if self._fixed is not None:
            return self._fixed
        sb = self._binding.resolve(None)
        if isinstance(self._binding, FixedSandbox):
            self._fixed = sb
        self._track(sb)
        return sb

    async def _asandbox(self) -> AsyncSandbox:
        sb = await self._binding.aresolve(None)
        self._track(sb)
        return sb

    def _track(self, sb: Sandbox | AsyncSandbox) -> None:
        """Notes a sandbox created under a name this backend used before (a recreation)."""
        key = sb.name or sb.id
        with self._lock:
            before = self._seen.get(key)
            self._seen[key] = sb.id
            if sb.created and before is not None and before != sb.id:
                self._recreated.add(key)

    def _announce(self, sb: Sandbox | AsyncSandbox, resp: ExecuteResponse) -> ExecuteResponse:
        """The model's first command after a recreation starts with the note (ADR 0022)."""
        if _IN_HELPER.get():
            return resp
        key = sb.name or sb.id
        with self._lock:
            if key not in self._recreated:
                return resp
            self._recreated.discard(key)
        out = NEW_SANDBOX_NOTE + resp.output
        return ExecuteResponse(output=out, exit_code=resp.exit_code, truncated=resp.truncated)

    @property
    def id(self) -> str:
        """The sandbox id (of the current thread's sandbox with ``per_thread=True``).

        Raises:
            RuntimeError: ``per_thread=True`` outside a LangGraph run, where there is
                no thread and so no sandbox.
        """
        try:
            return self.sandbox().id
        except ThreadIdMissing as e:
            raise RuntimeError(
                "ThreadboxSandbox(per_thread=True) has no id outside a LangGraph run: each thread has its own "
                "sandbox, named thread-<thread_id>. Read .id inside the graph, or look the sandbox up with "
                "Threadbox().get(langchain_threadbox.thread_sandbox_name(thread_id))"
            ) from e

    def _abs(self, path: str) -> str:
        """The path to give the SDK: mapped, an alias resolved, escapes turned into bytes."""
        raw = (_ALIASES.get() or {}).get(path)
        if raw is not None:
            return raw.decode("utf-8", "surrogateescape")
        mapped: str = map_path(path) if self._map_paths else path
        return sdk_path(mapped)

    # -- execute --------------------------------------------------------------

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        """Runs ``command`` with ``/bin/sh -c``; stdout and stderr are combined."""
        t = float(timeout or self._timeout)
        sb = self.sandbox()
        try:
            r = sb.exec(command, timeout=t, max_output_bytes=self._max_output_bytes)
        except SandboxNotRunning:
            sb.ensure_running()
            r = sb.exec(command, timeout=t, max_output_bytes=self._max_output_bytes)
        return self._announce(sb, _combine(r, t, for_model=not _IN_HELPER.get()))

    async def aexecute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        """Async twin of :meth:`execute`."""
        t = float(timeout or self._timeout)
        sb = await self._asandbox()
        try:
            r = await sb.exec(command, timeout=t, max_output_bytes=self._max_output_bytes)
        except SandboxNotRunning:
            await sb.ensure_running()
            r = await sb.exec(command, timeout=t, max_output_bytes=self._max_output_bytes)
        return self._announce(sb, _combine(r, t, for_model=not _IN_HELPER.get()))

    # -- files ----------------------------------------------------------------

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        """Writes each file (parents created); errors are reported per file, in order."""
        out: list[FileUploadResponse] = []
        sb: Sandbox | None = None
        for path, content in files:
            if not path.startswith("/"):
                out.append(FileUploadResponse(path=path, error="invalid_path"))
                continue
            sb = sb or self.sandbox()
            try:
                sb.files.write(self._abs(path), content, parents=True)
            except ThreadboxError as e:
                err = _file_error(e)
                if err is None:
                    raise
                out.append(FileUploadResponse(path=path, error=err))
            else:
                out.append(FileUploadResponse(path=path, error=None))
        return out

    async def aupload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        """Async twin of :meth:`upload_files`."""
        out: list[FileUploadResponse] = []
        sb: AsyncSandbox | None = None
        for path, content in files:
            if not path.startswith("/"):
                out.append(FileUploadResponse(path=path, error="invalid_path"))
                continue
            sb = sb or await self._asandbox()
            try:
                await sb.files.write(self._abs(path), content, parents=True)
            except ThreadboxError as e:
                err = _file_error(e)
                if err is None:
                    raise
                out.append(FileUploadResponse(path=path, error=err))
            else:
                out.append(FileUploadResponse(path=path, error=None))
        return out

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        """Reads each file; errors are reported per file, in order."""
        out: list[FileDownloadResponse] = []
        sb: Sandbox | None = None
        for path in paths:
            if not path.startswith("/"):
                out.append(FileDownloadResponse(path=path, content=None, error="invalid_path"))
                continue
            sb = sb or self.sandbox()
            try:
                data = sb.files.read(self._abs(path))
            except ThreadboxError as e:
                err = _file_error(e)
                if err is None:
                    raise
                out.append(FileDownloadResponse(path=path, content=None, error=err))
            else:
                out.append(FileDownloadResponse(path=path, content=data, error=None))
        return out

    async def adownload_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        """Async twin of :meth:`download_files`."""
        out: list[FileDownloadResponse] = []
        sb: AsyncSandbox | None = None
        for path in paths:
            if not path.startswith("/"):
                out.append(FileDownloadResponse(path=path, content=None, error="invalid_path"))
                continue
            sb = sb or await self._asandbox()
            try:
                data = await sb.files.read(self._abs(path))
            except ThreadboxError as e:
                err = _file_error(e)
                if err is None:
                    raise
                out.append(FileDownloadResponse(path=path, content=None, error=err))
            else:
                out.append(FileDownloadResponse(path=path, content=data, error=None))
        return out

    # -- lifecycle ------------------------------------------------------------

    def delete_sandbox(self) -> None:
        """Deletes the (current) threadbox sandbox and its files.

        (``delete(file_path)`` is Deep Agents' file deletion, inherited.)
        """
        self.sandbox().delete(missing_ok=True)


for _name in _PATH_ARGS:
    for _n in (_name, "a" + _name):
        _base = getattr(BaseSandbox, _n, None)
        if _base is None or _n in ThreadboxSandbox.__dict__:
            continue
        if _PATH_ARGS[_name] not in inspect.signature(_base).parameters:
            continue
        setattr(ThreadboxSandbox, _n, _wrap_helper(_name, _base))
