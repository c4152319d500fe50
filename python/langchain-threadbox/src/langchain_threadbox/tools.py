"""LangChain tools that run code and touch files in a threadbox sandbox."""

from __future__ import annotations

import posixpath
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal, TypeVar

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool, ToolException
from pydantic import BaseModel, Field

from threadbox import (
    AsyncSandbox,
    ExecResult,
    FileEntry,
    Sandbox,
    SandboxNotFound,
    SandboxNotRunning,
    Threadbox,
    ThreadboxError,
)

from ._output import DEFAULT_MAX_OUTPUT_CHARS, cut_middle, format_exec
from .binding import (
    DEFAULT_THREAD_PREFIX,
    ClientFactory,
    FixedSandbox,
    SandboxBinding,
    ThreadIdMissing,
    ThreadSandboxes,
)

__all__ = [
    "ListFilesInput",
    "ReadFileInput",
    "RunPythonInput",
    "RunShellInput",
    "ThreadboxToolkit",
    "WriteFileInput",
]

T = TypeVar("T")
ToolResult = tuple[str, dict[str, Any]]

HOME = "/home/user"
# File-level error codes: the model's mistake, reported to it as text.
_FILE_ERROR_CODES = {"not_found", "invalid_argument", "permission_denied"}


class RunPythonInput(BaseModel):
    """Arguments of ``run_python``."""

    code: str = Field(description="A complete Python 3 program. Print the results you want to see.")


class RunShellInput(BaseModel):
    """Arguments of ``run_shell``."""

    command: str = Field(description="A shell command line, run with /bin/sh -c in /home/user.")


class ReadFileInput(BaseModel):
    """Arguments of ``read_file``."""

    path: str = Field(description="File path; relative paths are relative to /home/user.")


class WriteFileInput(BaseModel):
    """Arguments of ``write_file``."""

    path: str = Field(description="File path; relative paths are relative to /home/user.")
    content: str = Field(description="The complete new content of the file (UTF-8 text).")


class ListFilesInput(BaseModel):
    """Arguments of ``list_files``."""

    path: str = Field(default=".", description="Directory; relative paths are relative to /home/user.")


def _abs(path: str) -> str:
    return path if path.startswith("/") else posixpath.normpath(posixpath.join(HOME, path))


def _infra(e: BaseException, what: str) -> ToolException:
    return ToolException(f"threadbox sandbox unavailable while running {what}: {e}")


def _file_error(e: ThreadboxError, path: str) -> ToolResult:
    reasons = {
        "not_found": "no such file or directory",
        "permission_denied": "permission denied",
    }
    reason = reasons.get(e.code) or e.message or e.code
    code = "file_not_found" if e.code == "not_found" else e.code
    return f"Error: {path}: {reason}", {"error": code, "path": path}


def _format_entries(path: str, entries: Sequence[FileEntry], max_chars: int) -> str:
    if not entries:
        return f"{path}: (empty directory)"
    lines = []
    for e in sorted(entries, key=lambda e: (e.kind != "dir", e.name)):
        if e.kind == "dir":
            lines.append(f"{e.name}/")
        elif e.kind == "symlink":
            lines.append(f"{e.name} -> {e.symlink_target or '?'}")
        else:
            lines.append(f"{e.name}  ({e.size} bytes)")
    text, _ = cut_middle("\n".join(lines), max_chars)
    return f"{path}:\n{text}"


class ThreadboxToolkit:
    """Builds the threadbox tools (``run_python``, ``run_shell``, ``read_file``,
    ``write_file``, ``list_files``) for ``ToolNode`` or ``create_agent``.

    By default the tools are bound to the graph's thread: each call resolves
    ``config["configurable"]["thread_id"]`` and runs in the sandbox named
    ``thread-<thread_id>`` (created on first use, found by name afterwards, also from
    another process). Pass ``sandbox=`` to bind every call to one sandbox instead.

    The model only sees each tool's own arguments. A non-zero exit is a normal
    result: the text shows the output and exit code, and the ``ToolMessage.artifact``
    holds ``exit_code``, ``timed_out`` and ``truncated``. Infrastructure failures
    (daemon unreachable, quota exceeded, ...) raise :class:`ToolException`; set
    ``handle_errors=True`` to turn those into error messages for the model instead.

    Args:
        client: A :class:`threadbox.Threadbox`; default from ``THREADBOX_URL``.
        url: Daemon URL when no client is given.
        api_key: API key when no client is given.
        sandbox: A fixed sandbox (handle, id or name) instead of per-thread ones.
        create: With a sandbox *name*, create it on first use if missing.
        sandbox_options: ``get_or_create`` options for new sandboxes (``memory``,
            ``cpus``, ``idle_pause_secs``, ``ttl_secs``, ``image``, ``labels``...).
        thread_prefix: Name prefix of per-thread sandboxes.
        timeout: Seconds after which a ``run_python``/``run_shell`` call is killed.
        max_output_chars: Output budget per tool result (head and tail kept).
        max_output_bytes: Capture bound passed to the daemon (per stream).
        handle_errors: Passed as ``handle_tool_error`` to every tool.
    """

    def __init__(
        self,
        *,
        client: Threadbox | None = None,
        url: str | None = None,
        api_key: str | None = None,
        sandbox: Sandbox | str | None = None,
        create: bool = False,
        sandbox_options: Mapping[str, Any] | None = None,
        thread_prefix: str = DEFAULT_THREAD_PREFIX,
        timeout: float = 60.0,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
        max_output_bytes: int | None = 4 << 20,
        handle_errors: bool | str | Callable[[ToolException], str] = False,
        binding: SandboxBinding | None = None,
    ) -> None:
        factory = ClientFactory(client, url=url, api_key=api_key)
        if binding is not None:
            self.binding = binding
        elif sandbox is not None:
            self.binding = FixedSandbox(sandbox, factory=factory, create=create, create_options=sandbox_options)
        else:
            self.binding = ThreadSandboxes(factory, prefix=thread_prefix, create_options=sandbox_options)
        self.timeout = timeout
        self.max_output_chars = max_output_chars
        self.max_output_bytes = max_output_bytes
        self.handle_errors = handle_errors

    # -- sandbox resolution ---------------------------------------------------

    def sandbox_for(self, config: RunnableConfig | None) -> Sandbox:
        """The sandbox a call with this config runs in (created if needed)."""
        return self.binding.resolve(config)

    def _resolve(self, config: RunnableConfig | None, what: str) -> Sandbox:
        try:
            return self.binding.resolve(config)
        except ThreadIdMissing as e:
            raise ToolException(str(e)) from e
        except ThreadboxError as e:
            raise _infra(e, what) from e

    async def _aresolve(self, config: RunnableConfig | None, what: str) -> AsyncSandbox:
        try:
            return await self.binding.aresolve(config)
        except ThreadIdMissing as e:
            raise ToolException(str(e)) from e
        except ThreadboxError as e:
            raise _infra(e, what) from e

    def release_thread(self, thread_id: str, *, action: Literal["delete", "stop"] = "delete") -> bool:
        """Stops or deletes a finished thread's sandbox (per-thread binding only)."""
        if not isinstance(self.binding, ThreadSandboxes):
            raise TypeError("release_thread needs the per-thread binding")
        return self.binding.release(thread_id, action=action)

    async def arelease_thread(self, thread_id: str, *, action: Literal["delete", "stop"] = "delete") -> bool:
        """Async twin of :meth:`release_thread`."""
        if not isinstance(self.binding, ThreadSandboxes):
            raise TypeError("release_thread needs the per-thread binding")
        return await self.binding.arelease(thread_id, action=action)

    # -- implementation -------------------------------------------------------

    def _exec(
        self, config: RunnableConfig | None, what: str, cmd: Any, stdin: str | None, env: dict[str, str]
    ) -> ToolResult:
        sb = self._resolve(config, what)

        def run() -> ExecResult:
            return sb.exec(cmd, timeout=self.timeout, stdin=stdin, env=env, max_output_bytes=self.max_output_bytes)

        try:
            try:
                r = run()
            except SandboxNotRunning:
                sb.ensure_running()
                r = run()
        except ThreadboxError as e:
            raise _infra(e, what) from e
        return format_exec(
            r, max_chars=self.max_output_chars, timeout=self.timeout, sandbox_id=sb.id, sandbox_name=sb.name
        )

    async def _aexec(
        self, config: RunnableConfig | None, what: str, cmd: Any, stdin: str | None, env: dict[str, str]
    ) -> ToolResult:
        sb = await self._aresolve(config, what)

        async def run() -> ExecResult:
            return await sb.exec(
                cmd, timeout=self.timeout, stdin=stdin, env=env, max_output_bytes=self.max_output_bytes
            )

        try:
            try:
                r = await run()
            except SandboxNotRunning:
                await sb.ensure_running()
                r = await run()
        except ThreadboxError as e:
            raise _infra(e, what) from e
        return format_exec(
            r, max_chars=self.max_output_chars, timeout=self.timeout, sandbox_id=sb.id, sandbox_name=sb.name
        )

    _PY_ENV: ClassVar[dict[str, str]] = {"PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}

    def _run_python(self, code: str, config: RunnableConfig) -> ToolResult:
        return self._exec(config, "run_python", ["python3", "-"], code, self._PY_ENV)

    async def _arun_python(self, code: str, config: RunnableConfig) -> ToolResult:
        return await self._aexec(config, "run_python", ["python3", "-"], code, self._PY_ENV)

    def _run_shell(self, command: str, config: RunnableConfig) -> ToolResult:
        return self._exec(config, "run_shell", command, None, {})

    async def _arun_shell(self, command: str, config: RunnableConfig) -> ToolResult:
        return await self._aexec(config, "run_shell", command, None, {})

    def _file_op(
        self, config: RunnableConfig | None, what: str, path: str, op: Callable[[Sandbox], ToolResult]
    ) -> ToolResult:
        sb = self._resolve(config, what)
        try:
            return op(sb)
        except ThreadboxError as e:
            if e.code in _FILE_ERROR_CODES and not isinstance(e, SandboxNotFound):
                return _file_error(e, path)
            raise _infra(e, what) from e

    async def _afile_op(
        self,
        config: RunnableConfig | None,
        what: str,
        path: str,
        op: Callable[[AsyncSandbox], Awaitable[ToolResult]],
    ) -> ToolResult:
        sb = await self._aresolve(config, what)
        try:
            return await op(sb)
        except ThreadboxError as e:
            if e.code in _FILE_ERROR_CODES and not isinstance(e, SandboxNotFound):
                return _file_error(e, path)
            raise _infra(e, what) from e

    def _read_result(self, path: str, data: bytes, sb_id: str) -> ToolResult:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return (
                f"{path} is a binary file ({len(data)} bytes); it is not shown. Use run_python to inspect it.",
                {"path": path, "size": len(data), "binary": True, "truncated": False, "sandbox_id": sb_id},
            )
        shown, cut = cut_middle(text, self.max_output_chars)
        return shown, {"path": path, "size": len(data), "binary": False, "truncated": cut > 0, "sandbox_id": sb_id}

    def _read_file(self, path: str, config: RunnableConfig) -> ToolResult:
        return self._file_op(config, "read_file", path, lambda sb: self._read_result(path, sb.files.read(path), sb.id))

    async def _aread_file(self, path: str, config: RunnableConfig) -> ToolResult:
        async def op(sb: AsyncSandbox) -> ToolResult:
            return self._read_result(path, await sb.files.read(path), sb.id)

        return await self._afile_op(config, "read_file", path, op)

    def _write_file(self, path: str, content: str, config: RunnableConfig) -> ToolResult:
        data = content.encode("utf-8")

        def op(sb: Sandbox) -> ToolResult:
            sb.files.write(path, data, parents=True)
            return f"Wrote {len(data)} bytes to {_abs(path)}", {
                "path": _abs(path),
                "size": len(data),
                "sandbox_id": sb.id,
            }

        return self._file_op(config, "write_file", path, op)

    async def _awrite_file(self, path: str, content: str, config: RunnableConfig) -> ToolResult:
        data = content.encode("utf-8")

        async def op(sb: AsyncSandbox) -> ToolResult:
            await sb.files.write(path, data, parents=True)
            return f"Wrote {len(data)} bytes to {_abs(path)}", {
                "path": _abs(path),
                "size": len(data),
                "sandbox_id": sb.id,
            }

        return await self._afile_op(config, "write_file", path, op)

    def _list_result(self, path: str, entries: Sequence[FileEntry], sb_id: str) -> ToolResult:
        return _format_entries(_abs(path), entries, self.max_output_chars), {
            "path": _abs(path),
            "count": len(entries),
            "sandbox_id": sb_id,
        }

    def _list_files(self, path: str, config: RunnableConfig) -> ToolResult:
        return self._file_op(config, "list_files", path, lambda sb: self._list_result(path, sb.files.list(path), sb.id))

    async def _alist_files(self, path: str, config: RunnableConfig) -> ToolResult:
        async def op(sb: AsyncSandbox) -> ToolResult:
            return self._list_result(path, await sb.files.list(path), sb.id)

        return await self._afile_op(config, "list_files", path, op)

    # -- tools ----------------------------------------------------------------

    def _tool(
        self,
        name: str,
        description: str,
        schema: type[BaseModel],
        func: Callable[..., ToolResult],
        coroutine: Callable[..., Awaitable[ToolResult]],
    ) -> StructuredTool:
        return StructuredTool(
            name=name,
            description=description,
            args_schema=schema,
            func=func,
            coroutine=coroutine,
            response_format="content_and_artifact",
            handle_tool_error=self.handle_errors,
            metadata={"threadbox_tool": name},
        )

    @property
    def run_python(self) -> StructuredTool:
        """Runs a whole Python program per call (the CodeAct pattern)."""
        return self._tool(
            "run_python",
            "Run a complete Python 3 program in your sandbox and get back its stdout, stderr "
            "and exit code. Each call is a fresh process: variables do not survive between "
            "calls, files do (the working directory is /home/user). Print what you need to "
            f"see. There is no network access. A call is killed after {self.timeout:g} seconds.",
            RunPythonInput,
            self._run_python,
            self._arun_python,
        )

    @property
    def run_shell(self) -> StructuredTool:
        """Runs a shell command line."""
        return self._tool(
            "run_shell",
            "Run a shell command (/bin/sh -c) in your sandbox and get back its stdout, stderr "
            "and exit code. The working directory is /home/user; there is no network access. "
            f"A call is killed after {self.timeout:g} seconds.",
            RunShellInput,
            self._run_shell,
            self._arun_shell,
        )

    @property
    def read_file(self) -> StructuredTool:
        """Reads a text file."""
        return self._tool(
            "read_file",
            "Read a text file from your sandbox. Relative paths are relative to /home/user.",
            ReadFileInput,
            self._read_file,
            self._aread_file,
        )

    @property
    def write_file(self) -> StructuredTool:
        """Creates or overwrites a text file."""
        return self._tool(
            "write_file",
            "Create or overwrite a text file in your sandbox (missing parent directories are "
            "created). Relative paths are relative to /home/user.",
            WriteFileInput,
            self._write_file,
            self._awrite_file,
        )

    @property
    def list_files(self) -> StructuredTool:
        """Lists a directory."""
        return self._tool(
            "list_files",
            "List a directory of your sandbox. Relative paths are relative to /home/user.",
            ListFilesInput,
            self._list_files,
            self._alist_files,
        )

    def get_tools(self, names: Sequence[str] | None = None) -> list[BaseTool]:
        """The tools, all five by default or those in ``names``."""
        all_names = ["run_python", "run_shell", "read_file", "write_file", "list_files"]
        wanted = list(names) if names is not None else all_names
        unknown = set(wanted) - set(all_names)
        if unknown:
            raise ValueError(f"unknown threadbox tools: {sorted(unknown)}")
        return [getattr(self, n) for n in wanted]
