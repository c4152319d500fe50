"""LangChain tools that run code and touch files in a threadbox sandbox."""

from __future__ import annotations

import base64
import mimetypes
import posixpath
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeVar

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, BaseToolkit, StructuredTool, ToolException
from langgraph.prebuilt import ToolRuntime
from pydantic import BaseModel, ConfigDict, Field

from threadbox import (
    AsyncSandbox,
    ExecResult,
    FileEntry,
    OutputEvent,
    Sandbox,
    SandboxNotFound,
    SandboxNotRunning,
    Threadbox,
    ThreadboxError,
)
from threadbox._network import NetworkSpec, allowed_names, policy_body

from ._code import format_execution
from ._output import DEFAULT_MAX_OUTPUT_CHARS, NEW_SANDBOX_NOTE, cut_middle, format_exec, safe_text
from ._paths import escape_name, sdk_path
from ._tracing import tool_span
from .binding import (
    DEFAULT_THREAD_PREFIX,
    ClientFactory,
    FixedSandbox,
    ReleaseAction,
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
ToolResult = tuple[Any, dict[str, Any]]

HOME = "/home/user"
TOOL_NAMES = ("run_python", "run_shell", "read_file", "write_file", "list_files")
# File-level error codes: the model's mistake, reported to it as an error message.
_FILE_ERROR_CODES = {"not_found", "invalid_argument", "permission_denied", "conflict"}
# Tools that only read: a time-travel checkpointer takes no sandbox checkpoint for them.
_READ_ONLY = frozenset({"read_file", "list_files"})
_IMAGE_TYPES = {"image/png", "image/jpeg", "image/gif", "image/webp"}
PARALLEL_NOTE = (
    "Calls in one message run in parallel, in no set order: issue a step that depends on "
    "another (write a file, then run it) in a later message."
)


class RunPythonInput(BaseModel):
    """Arguments of ``run_python``."""

    code: str = Field(description="A complete Python 3 program. Print the results you want to see.")
    timeout: float | None = Field(
        default=None, description="Seconds before the program is killed (optional; the default suits most calls)."
    )


class RunShellInput(BaseModel):
    """Arguments of ``run_shell``."""

    command: str = Field(description="A shell command line, run with /bin/sh -c in /home/user.")
    timeout: float | None = Field(
        default=None, description="Seconds before the command is killed (optional; the default suits most calls)."
    )


class ReadFileInput(BaseModel):
    """Arguments of ``read_file``."""

    path: str = Field(description="File path; relative paths are relative to /home/user.")
    offset: int = Field(default=0, ge=0, description="First line to show, counting from 0.")
    limit: int | None = Field(default=None, ge=1, description="How many lines to show at most.")


class WriteFileInput(BaseModel):
    """Arguments of ``write_file``."""

    path: str = Field(description="File path; relative paths are relative to /home/user.")
    content: str = Field(description="The complete new content of the file (UTF-8 text).")


class ListFilesInput(BaseModel):
    """Arguments of ``list_files``."""

    path: str = Field(default=".", description="Directory; relative paths are relative to /home/user.")


class _FileError(ToolException):
    """A file operation failed because of the model's request (shown to it as an error)."""


def _abs(path: str) -> str:
    return path if path.startswith("/") else posixpath.normpath(posixpath.join(HOME, path))


def _infra(e: BaseException, what: str) -> ToolException:
    if isinstance(e, ThreadboxError) and e.code == "not_found" and "no such route" in e.message:
        # A route the daemon does not know: the URL points below the daemon's root.
        return ToolException(f"threadbox could not run {what}: {e.message}")
    return ToolException(f"threadbox sandbox unavailable while running {what}: {e}")


def _file_error(e: ThreadboxError, path: str) -> _FileError:
    reasons = {
        "not_found": "no such file or directory",
        "permission_denied": "permission denied (you can write under /home/user and /tmp)",
    }
    reason = reasons.get(e.code) or e.message or e.code
    return _FileError(f"Error: {path}: {reason}")


def _format_entries(path: str, entries: Sequence[FileEntry], max_chars: int) -> str:
    if not entries:
        return f"{path}: (empty directory)"
    lines = []
    for e in sorted(entries, key=lambda e: (e.kind != "dir", e.name)):
        name = e.name
        if e.kind == "dir":
            lines.append(f"{name}/")
        elif e.kind == "symlink":
            lines.append(f"{name} -> {e.symlink_target or '?'}")
        else:
            lines.append(f"{name}  ({e.size} bytes)")
    text, _ = cut_middle("\n".join(lines), max_chars)
    return f"{path}:\n{text}"


def _writer_of(runtime: ToolRuntime | None) -> Callable[[Any], None] | None:
    """LangGraph's stream writer (``stream_mode="custom"``), or None outside a run."""
    writer = runtime.stream_writer if runtime is not None else None
    if writer is None:
        try:
            from langgraph.config import get_stream_writer

            writer = get_stream_writer()
        except (ImportError, RuntimeError, KeyError):
            return None
    try:
        from langgraph.runtime import _no_op_stream_writer

        if writer is _no_op_stream_writer:
            return None
    except ImportError:  # pragma: no cover - older langgraph
        pass
    # Without stream_mode="custom", LangGraph passes a local `def stream_writer(c): pass`:
    # then the plain (not streamed) exec is used.
    code = getattr(writer, "__code__", None)
    if code is not None and getattr(writer, "__closure__", None) is None and code.co_code == _PASS_CODE:
        return None
    return writer


def _pass(_: Any) -> None:
    pass


_PASS_CODE = _pass.__code__.co_code


def _had_sandbox_before(runtime: ToolRuntime | None) -> bool | None:
    """Whether earlier tool results of this conversation came from a threadbox sandbox
    (None: cannot tell, the tool runs outside a ``ToolNode``)."""
    if runtime is None:
        return None
    state = runtime.state
    msgs = state.get("messages") if isinstance(state, Mapping) else getattr(state, "messages", state)
    if not isinstance(msgs, (list, tuple)):
        return None
    return any(isinstance(m, ToolMessage) and isinstance(m.artifact, dict) and "sandbox_id" in m.artifact for m in msgs)


@dataclass(frozen=True)
class _Call:
    """One call of ``sandbox.files`` a tool's steps ask for: the method and its arguments."""

    method: Literal["stat", "read", "write", "list"]
    path: str
    data: bytes | None = None
    offset: int = 0
    length: int | None = None
    parents: bool = False


_Steps = Generator[_Call, Any, ToolResult]


def _call(files: Any, c: _Call) -> Any:
    """The SDK call for ``c`` on ``files`` (sync or async: its result or its awaitable)."""
    if c.method == "stat":
        return files.stat(c.path)
    if c.method == "read":
        return files.read(c.path, offset=c.offset, length=c.length)
    if c.method == "write":
        return files.write(c.path, c.data, parents=c.parents)
    return files.list(c.path)


def _drive(steps: _Steps, sb: Sandbox) -> ToolResult:
    try:
        call = next(steps)
        while True:
            call = steps.send(_call(sb.files, call))
    except StopIteration as done:
        result: ToolResult = done.value
        return result


async def _adrive(steps: _Steps, sb: AsyncSandbox) -> ToolResult:
    try:
        call = next(steps)
        while True:
            call = steps.send(await _call(sb.files, call))
    except StopIteration as done:
        result: ToolResult = done.value
        return result


_FIRST_WINDOW = 64 << 10
_MAX_WINDOW = 1 << 20


class _Reader:
    """Collects lines ``offset .. offset+limit`` of a streamed file within a budget."""

    def __init__(self, offset: int, limit: int | None, max_chars: int, max_bytes: int) -> None:
        self.offset, self.limit, self.max_chars, self.max_bytes = offset, limit, max_chars, max_bytes
        self.buf = b""
        self.pulled = 0
        self.line = 0  # index of the first line in buf
        self.kept: list[bytes] = []
        self.kept_chars = 0
        self.done = False
        self.more = False
        self.first = b""
        self.win = 0

    def feed(self, chunk: bytes) -> bool:
        """Takes a chunk; True when nothing more is needed."""
        if not self.first:
            self.first = chunk[:8192]
        self.pulled += len(chunk)
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        for ln in lines:
            if self._take(ln + b"\n"):
                return True
        if self.line >= self.offset and not self.kept and len(self.buf) > self.max_chars:
            # One line longer than the whole budget: show its start.
            self.kept.append(self.buf[: self.max_chars])
            self.more = self.done = True
            return True
        if self.pulled >= self.max_bytes:
            self.more = True
            self.done = True
        return self.done

    def _take(self, ln: bytes) -> bool:
        if self.line >= self.offset:
            if (self.limit is not None and len(self.kept) >= self.limit) or (
                self.kept and self.kept_chars + len(ln) > self.max_chars
            ):
                self.more = True
                self.done = True
                return True
            self.kept.append(ln)
            self.kept_chars += len(ln)
        self.line += 1
        return False

    def finish(self) -> None:
        if not self.done and self.buf:
            self._take(self.buf)
            self.buf = b""

    def window(self) -> int | None:
        """How many bytes to fetch next (a byte range of the file), None when done.

        Windows start small and double, so a short read costs one small request and a
        long one few requests; the daemon sends only the bytes of each window.
        """
        if self.done:
            return None
        self.win = min(self.win * 2, _MAX_WINDOW) if self.win else _FIRST_WINDOW
        return max(1, min(self.win, self.max_bytes - self.pulled))

    def take_window(self, data: bytes, asked: int) -> bool:
        """Takes a fetched window; True when nothing more is needed (a short one is the end)."""
        if data and self.feed(data):
            return True
        if len(data) < asked:
            self.finish()
            self.done = True
            return True
        return False


class ThreadboxToolkit(BaseToolkit):
    """Builds the threadbox tools (``run_python``, ``run_shell``, ``read_file``,
    ``write_file``, ``list_files``) for ``ToolNode`` or ``create_agent``.

    By default the tools are bound to the graph's thread: each call resolves
    ``config["configurable"]["thread_id"]`` and runs in the sandbox named
    ``thread-<thread_id>`` (created on first use, found by name afterwards, also from
    another process; paused after 60 s without calls, see ``sandbox_options``). Pass
    ``sandbox=`` to bind every call to one sandbox instead.

    The model only sees each tool's own arguments. A non-zero exit is a normal
    result: the text shows the output and exit code, and the ``ToolMessage.artifact``
    holds ``exit_code``, ``timed_out``, ``oom_killed`` and ``truncated``. A file
    operation the model got wrong (no such file, permission denied) is a
    ``ToolMessage`` with ``status="error"``. Infrastructure failures (daemon
    unreachable, quota exceeded, ...) raise :class:`ToolException`; set
    ``handle_errors=True`` to turn those into error messages for the model instead.

    When the graph is streamed with ``stream_mode="custom"``, ``run_python`` and
    ``run_shell`` write their output as it comes:
    ``{"type": "threadbox_output", "tool": ..., "tool_call_id": ..., "stream": "stdout", "text": ...}``.

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
        max_timeout: The most a model may ask for with the tools' ``timeout``
            argument (default: 10 minutes, or ``timeout`` when larger).
        max_output_chars: Output budget per tool result (head and tail kept).
        max_output_bytes: Capture bound passed to the daemon (per stream).
        max_image_bytes: Largest image ``read_file`` returns as an image block.
        name_prefix: Prepended to every tool name (``"sandbox_"`` gives
            ``sandbox_read_file``...), so the tools never replace others of the
            same name, such as Deep Agents' own ``read_file``.
        handle_errors: Passed as ``handle_tool_error`` to every tool (for
            infrastructure errors; file errors are always shown to the model).
        network: Egress of the sandboxes this toolkit creates: a list of allow
            rules (``["pypi.org", "python-packages"]``) or a policy mapping, as
            :meth:`threadbox.Threadbox.create` takes it. The tools tell the model
            what is open. Without it sandboxes reach nothing outside themselves.
        template: A template (name or id) the sandboxes this toolkit creates start
            from: a clone of its disk, its image, limits, labels and network policy as
            the defaults (``tb.templates.create(...)`` makes one).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    binding: Any
    timeout: float = 60.0
    max_timeout: float = 600.0
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS
    max_output_bytes: int | None = 4 << 20
    max_image_bytes: int = 5 << 20
    max_read_bytes: int = 16 << 20
    name_prefix: str = ""
    handle_errors: Any = False
    stateful: bool = False
    images: str = "content"
    network_allows: list[str] = Field(default_factory=list)

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
        max_timeout: float | None = None,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
        max_output_bytes: int | None = 4 << 20,
        max_image_bytes: int = 5 << 20,
        name_prefix: str = "",
        handle_errors: bool | str | Callable[[ToolException], str] = False,
        binding: SandboxBinding | None = None,
        stateful: bool = False,
        images: Literal["content", "none"] = "content",
        network: NetworkSpec | None = None,
        template: str | None = None,
    ) -> None:
        if template is not None:
            sandbox_options = {**dict(sandbox_options or {}), "template": template}
        if network is not None:
            # Checked here, so a bad rule fails when the toolkit is built, not on a tool call.
            policy_body(network)
            sandbox_options = {**dict(sandbox_options or {}), "network": network}
        if binding is None:
            factory = ClientFactory(client, url=url, api_key=api_key)
            if sandbox is not None:
                binding = FixedSandbox(sandbox, factory=factory, create=create, create_options=sandbox_options)
            else:
                binding = ThreadSandboxes(factory, prefix=thread_prefix, create_options=sandbox_options)
        fields: dict[str, Any] = {
            "binding": binding,
            "timeout": timeout,
            "max_timeout": max(max_timeout if max_timeout is not None else 600.0, timeout),
            "max_output_chars": max_output_chars,
            "max_output_bytes": max_output_bytes,
            "max_image_bytes": max_image_bytes,
            "name_prefix": name_prefix,
            "handle_errors": handle_errors,
            "stateful": stateful,
            "images": images,
            "network_allows": allowed_names(network) if network is not None else [],
        }
        super().__init__(**fields)

    # -- sandbox resolution ---------------------------------------------------

    def sandbox_for(self, config: RunnableConfig | None) -> Sandbox:
        """The sandbox a call with this config runs in (created if needed).

        This is how an app gets files out of a thread's sandbox, for example after a
        turn: ``toolkit.sandbox_for(config).files.read("chart.png")``.
        """
        sb: Sandbox = self.binding.resolve(config)
        return sb

    async def asandbox_for(self, config: RunnableConfig | None) -> AsyncSandbox:
        """Async twin of :meth:`sandbox_for`."""
        sb: AsyncSandbox = await self.binding.aresolve(config)
        return sb

    def _resolve(self, config: RunnableConfig | None, what: str) -> Sandbox:
        try:
            sb: Sandbox = self.binding.resolve(config, writes=what not in _READ_ONLY)
        except ThreadIdMissing as e:
            raise ToolException(str(e)) from e
        except ThreadboxError as e:
            raise _infra(e, what) from e
        return sb

    async def _aresolve(self, config: RunnableConfig | None, what: str) -> AsyncSandbox:
        try:
            sb: AsyncSandbox = await self.binding.aresolve(config, writes=what not in _READ_ONLY)
        except ThreadIdMissing as e:
            raise ToolException(str(e)) from e
        except ThreadboxError as e:
            raise _infra(e, what) from e
        return sb

    def release_thread(self, thread_id: str, *, action: ReleaseAction = "delete") -> bool:
        """Deletes, stops, pauses or hibernates a thread's sandbox (per-thread binding only)."""
        if not isinstance(self.binding, ThreadSandboxes):
            raise TypeError("release_thread needs the per-thread binding")
        return self.binding.release(thread_id, action=action)

    async def arelease_thread(self, thread_id: str, *, action: ReleaseAction = "delete") -> bool:
        """Async twin of :meth:`release_thread`."""
        if not isinstance(self.binding, ThreadSandboxes):
            raise TypeError("release_thread needs the per-thread binding")
        return await self.binding.arelease(thread_id, action=action)

    # -- shared pieces --------------------------------------------------------

    @staticmethod
    def _new_sandbox(sb: Sandbox | AsyncSandbox, runtime: ToolRuntime | None, result: ToolResult) -> ToolResult:
        """Says so in the result when this call had to create the sandbox."""
        if not sb.created:
            return result
        content, artifact = result
        artifact["sandbox_created"] = True
        if not _had_sandbox_before(runtime):
            # The conversation's first sandbox (or no history to tell): nothing was lost.
            return content, artifact
        note = NEW_SANDBOX_NOTE
        if isinstance(content, str):
            return note + content, artifact
        return [{"type": "text", "text": note}, *content], artifact

    def _timeout(self, requested: float | None) -> tuple[float, bool]:
        if requested is None or requested <= 0:
            return self.timeout, False
        if requested > self.max_timeout:
            return self.max_timeout, True
        return float(requested), False

    def _handler(self) -> Callable[[ToolException], str]:
        user = self.handle_errors

        def handle(e: ToolException) -> str:
            if isinstance(e, _FileError):
                return str(e)
            if not user:
                raise e
            if user is True:
                return str(e)
            if isinstance(user, str):
                return user
            return str(user(e))

        return handle

    # -- exec -----------------------------------------------------------------

    def _finish_exec(
        self, sb: Sandbox | AsyncSandbox, r: ExecResult, t: float, capped: bool, runtime: ToolRuntime | None
    ) -> ToolResult:
        content, artifact = format_exec(
            r, max_chars=self.max_output_chars, timeout=t, sandbox_id=sb.id, sandbox_name=sb.name
        )
        artifact["timeout"] = t
        if capped:
            artifact["timeout_capped"] = True
            content += f" (the timeout asked for was above the limit of {self.max_timeout:g}s)"
        return self._new_sandbox(sb, runtime, (content, artifact))

    @staticmethod
    def _emit(writer: Callable[[Any], None], what: str, runtime: ToolRuntime | None, ev: OutputEvent) -> None:
        writer(
            {
                "type": "threadbox_output",
                "tool": what,
                "tool_call_id": runtime.tool_call_id if runtime is not None else None,
                "stream": ev.stream,
                "text": safe_text(ev.data)[0],
            }
        )

    def _exec(
        self,
        config: RunnableConfig | None,
        runtime: ToolRuntime | None,
        what: str,
        cmd: Any,
        stdin: str | None,
        env: dict[str, str],
        requested: float | None,
    ) -> ToolResult:
        sb = self._resolve(config, what)
        t, capped = self._timeout(requested)
        writer = _writer_of(runtime)

        def run() -> ExecResult:
            kw: dict[str, Any] = {"timeout": t, "stdin": stdin, "env": env, "max_output_bytes": self.max_output_bytes}
            if writer is None:
                return sb.exec(cmd, **kw)
            with sb.exec_stream(cmd, **kw) as events:
                return events.collect(on_output=lambda ev: self._emit(writer, what, runtime, ev))

        with tool_span(what, runtime.tool_call_id if runtime is not None else None):
            try:
                try:
                    r = run()
                except SandboxNotRunning:
                    sb.ensure_running()
                    r = run()
            except ThreadboxError as e:
                raise _infra(e, what) from e
            return self._finish_exec(sb, r, t, capped, runtime)

    async def _aexec(
        self,
        config: RunnableConfig | None,
        runtime: ToolRuntime | None,
        what: str,
        cmd: Any,
        stdin: str | None,
        env: dict[str, str],
        requested: float | None,
    ) -> ToolResult:
        sb = await self._aresolve(config, what)
        t, capped = self._timeout(requested)
        writer = _writer_of(runtime)

        async def run() -> ExecResult:
            kw: dict[str, Any] = {"timeout": t, "stdin": stdin, "env": env, "max_output_bytes": self.max_output_bytes}
            if writer is None:
                return await sb.exec(cmd, **kw)
            async with sb.exec_stream(cmd, **kw) as events:
                return await events.collect(on_output=lambda ev: self._emit(writer, what, runtime, ev))

        with tool_span(what, runtime.tool_call_id if runtime is not None else None):
            try:
                try:
                    r = await run()
                except SandboxNotRunning:
                    await sb.ensure_running()
                    r = await run()
            except ThreadboxError as e:
                raise _infra(e, what) from e
            return self._finish_exec(sb, r, t, capped, runtime)

    _PY_ENV: ClassVar[dict[str, str]] = {"PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}

    def _run_python(
        self,
        code: str,
        config: RunnableConfig,
        timeout: float | None = None,
        runtime: ToolRuntime = None,  # type: ignore[assignment]
    ) -> ToolResult:
        if self.stateful:
            return self._run_code(config, runtime, code, timeout)
        return self._exec(config, runtime, "run_python", ["python3", "-"], code, self._PY_ENV, timeout)

    def _finish_code(self, sb: Sandbox | AsyncSandbox, ex: Any, t: float, runtime: ToolRuntime | None) -> ToolResult:
        images: Any = self.images
        content, artifact = format_execution(ex, max_chars=self.max_output_chars, timeout=t, images=images)
        artifact["sandbox_id"] = sb.id
        return self._new_sandbox(sb, runtime, (content, artifact))

    def _run_code(
        self, config: RunnableConfig | None, runtime: ToolRuntime | None, code: str, requested: float | None
    ) -> ToolResult:
        sb = self._resolve(config, "run_python")
        t, _ = self._timeout(requested)
        with tool_span("run_python", runtime.tool_call_id if runtime is not None else None):
            try:
                try:
                    ex = sb.run_code(code, context="python", timeout=t)
                except SandboxNotRunning:
                    sb.ensure_running()
                    ex = sb.run_code(code, context="python", timeout=t)
            except ThreadboxError as e:
                raise _infra(e, "run_python") from e
            return self._finish_code(sb, ex, t, runtime)

    async def _arun_code(
        self, config: RunnableConfig | None, runtime: ToolRuntime | None, code: str, requested: float | None
    ) -> ToolResult:
        sb = await self._aresolve(config, "run_python")
        t, _ = self._timeout(requested)
        with tool_span("run_python", runtime.tool_call_id if runtime is not None else None):
            try:
                try:
                    ex = await sb.run_code(code, context="python", timeout=t)
                except SandboxNotRunning:
                    await sb.ensure_running()
                    ex = await sb.run_code(code, context="python", timeout=t)
            except ThreadboxError as e:
                raise _infra(e, "run_python") from e
            return self._finish_code(sb, ex, t, runtime)

    async def _arun_python(
        self,
        code: str,
        config: RunnableConfig,
        timeout: float | None = None,
        runtime: ToolRuntime = None,  # type: ignore[assignment]
    ) -> ToolResult:
        if self.stateful:
            return await self._arun_code(config, runtime, code, timeout)
        return await self._aexec(config, runtime, "run_python", ["python3", "-"], code, self._PY_ENV, timeout)

    def _run_shell(
        self,
        command: str,
        config: RunnableConfig,
        timeout: float | None = None,
        runtime: ToolRuntime = None,  # type: ignore[assignment]
    ) -> ToolResult:
        return self._exec(config, runtime, "run_shell", command, None, {}, timeout)

    async def _arun_shell(
        self,
        command: str,
        config: RunnableConfig,
        timeout: float | None = None,
        runtime: ToolRuntime = None,  # type: ignore[assignment]
    ) -> ToolResult:
        return await self._aexec(config, runtime, "run_shell", command, None, {}, timeout)

    # -- files ----------------------------------------------------------------

    def _file_op(
        self,
        config: RunnableConfig | None,
        runtime: ToolRuntime | None,
        what: str,
        path: str,
        steps: Callable[[Sandbox], _Steps],
    ) -> ToolResult:
        with tool_span(what, runtime.tool_call_id if runtime is not None else None):
            sb = self._resolve(config, what)
            try:
                return self._new_sandbox(sb, runtime, _drive(steps(sb), sb))
            except ThreadboxError as e:
                if e.code in _FILE_ERROR_CODES and not isinstance(e, SandboxNotFound):
                    raise _file_error(e, path) from e
                raise _infra(e, what) from e

    async def _afile_op(
        self,
        config: RunnableConfig | None,
        runtime: ToolRuntime | None,
        what: str,
        path: str,
        steps: Callable[[AsyncSandbox], _Steps],
    ) -> ToolResult:
        with tool_span(what, runtime.tool_call_id if runtime is not None else None):
            sb = await self._aresolve(config, what)
            try:
                return self._new_sandbox(sb, runtime, await _adrive(steps(sb), sb))
            except ThreadboxError as e:
                if e.code in _FILE_ERROR_CODES and not isinstance(e, SandboxNotFound):
                    raise _file_error(e, path) from e
                raise _infra(e, what) from e

    def _read_plan(self, path: str, entry: FileEntry) -> str | None:
        """``"image"`` to return an image block, ``None`` to read lines; raises for a directory."""
        if entry.kind == "dir":
            raise _FileError(f"Error: {path}: is a directory (use list_files)")
        mime = mimetypes.guess_type(path)[0]
        return "image" if mime in _IMAGE_TYPES else None

    def _image_result(self, path: str, entry: FileEntry, data: bytes | None, sb_id: str) -> ToolResult:
        mime = mimetypes.guess_type(path)[0] or "application/octet-stream"
        artifact: dict[str, Any] = {"path": path, "size": entry.size, "binary": True, "mime_type": mime}
        artifact["sandbox_id"] = sb_id
        if data is None:
            return (
                f"{path} is an image ({mime}, {entry.size} bytes), larger than the {self.max_image_bytes} bytes "
                "that can be shown; make a smaller one (fewer pixels, or JPEG) to look at it.",
                artifact,
            )
        blocks = [
            {"type": "text", "text": f"{path} ({mime}, {entry.size} bytes):"},
            {"type": "image", "base64": base64.b64encode(data).decode("ascii"), "mime_type": mime},
        ]
        return blocks, artifact

    def _lines_result(self, path: str, entry: FileEntry, rd: _Reader, sb_id: str) -> ToolResult:
        artifact: dict[str, Any] = {"path": path, "size": entry.size, "sandbox_id": sb_id}
        _, binary = safe_text(rd.first)
        if binary or b"\x00" in rd.first:
            artifact.update(binary=True, truncated=False)
            return (
                f"{path} is a binary file ({entry.size} bytes); it is not shown. Inspect it with a program "
                "(for example `file`, `xxd ... | head`, or Python), or have the app fetch it.",
                artifact,
            )
        body, _ = safe_text(b"".join(rd.kept))
        first, last = rd.offset, rd.offset + len(rd.kept)
        artifact.update(binary=False, truncated=rd.more, offset=first, lines=len(rd.kept), bytes_read=rd.pulled)
        if rd.more:
            body = (body if body.endswith("\n") or not body else body + "\n") + (
                f"[lines {first}-{last - 1} of {path} ({entry.size} bytes) shown; "
                f"call read_file with offset={last} to read on]"
            )
        elif not rd.kept and rd.offset > 0:
            body = f"[{path} has {rd.line} lines; offset {rd.offset} is past the end]"
        return body, artifact

    # The file tools' logic is written once, as generators that yield the SDK calls they
    # need (`_Call`) and get the answers sent back; `_drive` and `_adrive` make those
    # calls on a sync or an async sandbox. So the sync and async tools differ only there.

    def _read_steps(self, path: str, offset: int, limit: int | None, sb_id: str) -> _Steps:
        real = sdk_path(path)
        entry = yield _Call("stat", real)
        if self._read_plan(path, entry) == "image":
            data = (yield _Call("read", real)) if entry.size <= self.max_image_bytes else None
            return self._image_result(path, entry, data, sb_id)
        rd = _Reader(offset, limit, self.max_output_chars, self.max_read_bytes)
        pos = 0
        while (want := rd.window()) is not None:
            data = yield _Call("read", real, offset=pos, length=want)
            pos += len(data)
            if rd.take_window(data, want):
                break
        return self._lines_result(path, entry, rd, sb_id)

    def _write_steps(self, path: str, content: str, sb_id: str) -> _Steps:
        data = content.encode("utf-8")
        yield _Call("write", sdk_path(path), data, parents=True)
        return f"Wrote {len(data)} bytes to {_abs(path)}", {"path": _abs(path), "size": len(data), "sandbox_id": sb_id}

    def _list_steps(self, path: str, sb_id: str) -> _Steps:
        entries = yield _Call("list", sdk_path(path))
        return self._list_result(path, entries, sb_id)

    def _list_result(self, path: str, entries: Sequence[FileEntry], sb_id: str) -> ToolResult:
        entries = _with_escaped_names(entries)
        return _format_entries(_abs(path), entries, self.max_output_chars), {
            "path": _abs(path),
            "count": len(entries),
            "sandbox_id": sb_id,
        }

    def _read_file(
        self,
        path: str,
        config: RunnableConfig,
        offset: int = 0,
        limit: int | None = None,
        runtime: ToolRuntime = None,  # type: ignore[assignment]
    ) -> ToolResult:
        return self._file_op(
            config, runtime, "read_file", path, lambda sb: self._read_steps(path, offset, limit, sb.id)
        )

    async def _aread_file(
        self,
        path: str,
        config: RunnableConfig,
        offset: int = 0,
        limit: int | None = None,
        runtime: ToolRuntime = None,  # type: ignore[assignment]
    ) -> ToolResult:
        return await self._afile_op(
            config, runtime, "read_file", path, lambda sb: self._read_steps(path, offset, limit, sb.id)
        )

    def _write_file(
        self,
        path: str,
        content: str,
        config: RunnableConfig,
        runtime: ToolRuntime = None,  # type: ignore[assignment]
    ) -> ToolResult:
        return self._file_op(config, runtime, "write_file", path, lambda sb: self._write_steps(path, content, sb.id))

    async def _awrite_file(
        self,
        path: str,
        content: str,
        config: RunnableConfig,
        runtime: ToolRuntime = None,  # type: ignore[assignment]
    ) -> ToolResult:
        return await self._afile_op(
            config, runtime, "write_file", path, lambda sb: self._write_steps(path, content, sb.id)
        )

    def _list_files(
        self,
        config: RunnableConfig,
        path: str = ".",
        runtime: ToolRuntime = None,  # type: ignore[assignment]
    ) -> ToolResult:
        return self._file_op(config, runtime, "list_files", path, lambda sb: self._list_steps(path, sb.id))

    async def _alist_files(
        self,
        config: RunnableConfig,
        path: str = ".",
        runtime: ToolRuntime = None,  # type: ignore[assignment]
    ) -> ToolResult:
        return await self._afile_op(config, runtime, "list_files", path, lambda sb: self._list_steps(path, sb.id))

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
            name=self.name_prefix + name,
            description=description,
            args_schema=schema,
            func=func,
            coroutine=coroutine,
            response_format="content_and_artifact",
            handle_tool_error=self._handler(),
            metadata={"threadbox_tool": name},
        )

    def _network_text(self) -> str:
        if not self.network_allows:
            return "There is no network access."
        return "Network access is limited to: " + ", ".join(self.network_allows) + " (everything else is refused)."

    def _timeout_text(self) -> str:
        return (
            f"A call is killed after {self.timeout:g} seconds; pass `timeout` (at most {self.max_timeout:g}) "
            "for a longer one."
        )

    @property
    def run_python(self) -> StructuredTool:
        """Runs a whole Python 3 program per call (the CodeAct pattern), or, with
        ``stateful=True``, a cell in the thread's persistent Python context."""
        if self.stateful:
            return self._tool(
                "run_python",
                "Run Python 3 code in your sandbox's persistent Python session. Variables, imports "
                "and open files persist between calls, like cells of a notebook. The value of the last "
                "expression is shown (end it with `;` to hide it), print() output too, and matplotlib "
                "figures or objects with _repr_png_ come back as images. The working directory is "
                f"/home/user. {self._network_text()} {self._timeout_text()} A call that runs too "
                "long is interrupted and the session keeps its variables.",
                RunPythonInput,
                self._run_python,
                self._arun_python,
            )
        return self._tool(
            "run_python",
            "Run a complete Python 3 program in your sandbox and get back its stdout, stderr "
            "and exit code. Each call is a fresh process: variables do not survive between "
            "calls, files do (the working directory is /home/user). Print what you need to "
            f"see. {self._network_text()} {self._timeout_text()} {PARALLEL_NOTE}",
            RunPythonInput,
            self._run_python,
            self._arun_python,
        )

    @property
    def reset_python(self) -> StructuredTool:
        """Restarts the thread's persistent Python context (``stateful=True``)."""
        from .repl import ResetPythonInput, areset_python, reset_python

        def run(config: RunnableConfig) -> ToolResult:
            return reset_python(self, config)

        async def arun(config: RunnableConfig) -> ToolResult:
            return await areset_python(self, config)

        return self._tool(
            "reset_python",
            "Restart your persistent Python session: every variable and import is forgotten "
            "(files are kept). Use it when the session is in a bad state, not between steps.",
            ResetPythonInput,
            run,
            arun,
        )

    @property
    def run_shell(self) -> StructuredTool:
        """Runs a shell command line."""
        return self._tool(
            "run_shell",
            "Run a shell command (/bin/sh -c) in your sandbox and get back its stdout, stderr "
            f"and exit code. The working directory is /home/user. {self._network_text()} "
            f"{self._timeout_text()} {PARALLEL_NOTE}",
            RunShellInput,
            self._run_shell,
            self._arun_shell,
        )

    @property
    def read_file(self) -> StructuredTool:
        """Reads a text file (a range of lines), or shows an image."""
        return self._tool(
            "read_file",
            "Read a text file from your sandbox (relative paths are relative to /home/user). "
            "Long files are shown in parts: pass `offset` (first line, from 0) and `limit` (lines) "
            "to read on. PNG, JPEG, GIF and WebP images are shown as images.",
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
            "created). Relative paths are relative to /home/user, where you can write (and /tmp). "
            f"{PARALLEL_NOTE}",
            WriteFileInput,
            self._write_file,
            self._awrite_file,
        )

    @property
    def list_files(self) -> StructuredTool:
        """Lists a directory."""
        return self._tool(
            "list_files",
            "List a directory of your sandbox. Relative paths are relative to /home/user. Names "
            "that are not valid UTF-8 are shown with \\xNN escapes, which the other tools accept.",
            ListFilesInput,
            self._list_files,
            self._alist_files,
        )

    def get_tools(self, names: Sequence[str] | None = None) -> list[BaseTool]:
        """The tools, all five by default (six with ``stateful=True``: ``reset_python``
        too) or those in ``names`` (without the prefix)."""
        known = (*TOOL_NAMES, "reset_python") if self.stateful else TOOL_NAMES
        wanted = list(names) if names is not None else list(known)
        unknown = set(wanted) - set(known)
        if unknown:
            raise ValueError(f"unknown threadbox tools: {sorted(unknown)}")
        return [getattr(self, n) for n in wanted]


def _with_escaped_names(entries: Sequence[FileEntry]) -> list[FileEntry]:
    """Names that are not UTF-8 shown as ``caf\\xe9.txt``, which the tools take back."""
    from dataclasses import replace

    return [replace(e, name=escape_name(e.raw_name)) if e.name_b64 else e for e in entries]
