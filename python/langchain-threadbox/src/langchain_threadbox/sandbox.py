"""Deep Agents backend: :class:`ThreadboxSandbox` (a ``BaseSandbox`` subclass)."""

from __future__ import annotations

from collections.abc import Mapping
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

from .binding import DEFAULT_THREAD_PREFIX, ClientFactory, FixedSandbox, SandboxBinding, ThreadSandboxes

__all__ = ["ThreadboxSandbox"]

DEFAULT_TIMEOUT = 30 * 60
TIMEOUT_EXIT_CODE = 124


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


def _combine(r: ExecResult, timeout: float) -> ExecuteResponse:
    out = r.stdout
    err = r.stderr
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
    absolute (``invalid_path`` otherwise), as Deep Agents expects.

    Args:
        sandbox: A sandbox handle, or a sandbox name/id.
        per_thread: Bind to the current LangGraph thread instead.
        client: A :class:`threadbox.Threadbox` (default: from ``THREADBOX_URL``).
        async_client: Optional :class:`threadbox.AsyncThreadbox` for the async twins
            (default: one per event loop).
        sandbox_options: ``get_or_create`` options for sandboxes this creates.
        timeout: Default command timeout in seconds (30 minutes).
        max_output_bytes: Capture bound per stream passed to the daemon.
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
    ) -> None:
        if (sandbox is None) == (not per_thread):
            raise ValueError("pass exactly one of sandbox=... or per_thread=True")
        if client is None and isinstance(sandbox, Sandbox):
            client = sandbox.client
        factory = ClientFactory(client, url=url, api_key=api_key, async_client=async_client)
        self._binding: SandboxBinding
        if per_thread:
            self._binding = ThreadSandboxes(factory, prefix=thread_prefix, create_options=sandbox_options)
        else:
            assert sandbox is not None
            self._binding = FixedSandbox(
                sandbox, factory=factory, create=isinstance(sandbox, str), create_options=sandbox_options
            )
        self._fixed: Sandbox | None = sandbox if isinstance(sandbox, Sandbox) else None
        self._timeout = timeout
        self._max_output_bytes = max_output_bytes

    # -- resolution -----------------------------------------------------------

    def sandbox(self) -> Sandbox:
        """The threadbox sandbox commands run in now (resolved per call)."""
        if self._fixed is not None:
            return self._fixed
        sb = self._binding.resolve(None)
        if isinstance(self._binding, FixedSandbox):
            self._fixed = sb
        return sb

    async def _asandbox(self) -> AsyncSandbox:
        return await self._binding.aresolve(None)

    @property
    def id(self) -> str:
        """The sandbox id."""
        return self.sandbox().id

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
        return _combine(r, t)

    async def aexecute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        """Async twin of :meth:`execute`."""
        t = float(timeout or self._timeout)
        sb = await self._asandbox()
        try:
            r = await sb.exec(command, timeout=t, max_output_bytes=self._max_output_bytes)
        except SandboxNotRunning:
            await sb.ensure_running()
            r = await sb.exec(command, timeout=t, max_output_bytes=self._max_output_bytes)
        return _combine(r, t)

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
                sb.files.write(path, content, parents=True)
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
                await sb.files.write(path, content, parents=True)
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
                data = sb.files.read(path)
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
                data = await sb.files.read(path)
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
