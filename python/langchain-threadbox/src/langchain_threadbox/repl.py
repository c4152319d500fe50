"""A sandboxed, stateful drop-in for LangChain's ``PythonREPLTool`` and the
``reset_python`` tool of the stateful toolkit (issue 15, ADR 0086).

The swap from ``langchain_experimental`` is one import::

    # from langchain_experimental.tools import PythonREPLTool
    from langchain_threadbox import PythonREPLTool

    tool = PythonREPLTool()  # name "Python_REPL", argument "query", as before

Each graph thread runs in its own sandbox (``thread-<thread_id>``) and its own persistent
Python context, instead of ``exec()`` in the host process.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import StructuredTool, ToolException
from langgraph.prebuilt import ToolRuntime
from pydantic import BaseModel, Field

from threadbox import AsyncSandbox, ContextInfo, Sandbox, SandboxNotRunning, ThreadboxError

if TYPE_CHECKING:
    from .tools import ThreadboxToolkit

ToolResult = tuple[Any, dict[str, Any]]

__all__ = ["PythonREPLInput", "PythonREPLTool", "ResetPythonInput", "sanitize_input"]

REPL_NAME = "Python_REPL"
REPL_DESCRIPTION = (
    "A Python shell. Use this to execute python commands. "
    "Input should be a valid python command. "
    "If you want to see the output of a value, you should print it out "
    "with `print(...)`, or end the command with it: the value of the last expression is shown. "
    "Variables and imports persist between calls. It runs in a sandbox with no network access; "
    "matplotlib figures come back as images."
)
RESET_NOTE = (
    "The Python session was restarted: every variable and import from earlier calls is gone. "
    "Files in the sandbox are kept."
)


def sanitize_input(query: str) -> str:
    """What ``langchain_experimental``'s tool does to ``query``: strips backticks,
    whitespace and a leading ``python`` (models often send a Markdown code fence)."""
    query = re.sub(r"^(\s|`)*(?i:python)?\s*", "", query)
    return re.sub(r"(\s|`)*$", "", query)


class PythonREPLInput(BaseModel):
    """Arguments of ``Python_REPL`` (those of ``langchain_experimental``'s tool)."""

    query: str = Field(description="code snippet to run")


class ResetPythonInput(BaseModel):
    """``reset_python`` takes no arguments."""


class PythonREPLTool(StructuredTool):
    """``Python_REPL`` running in the thread's sandbox, in a persistent context.

    Args:
        toolkit: A ``ThreadboxToolkit(stateful=True)`` to share (its client, binding,
            timeouts and ``images`` option); made from ``toolkit_options`` otherwise.
        sanitize_input: Strip Markdown code fences from ``query`` (as the original).
        **toolkit_options: Passed to :class:`ThreadboxToolkit` (``client``, ``sandbox``,
            ``timeout``, ``images="none"``...).
    """

    toolkit: Any = None
    sanitize_input: bool = True

    def __init__(
        self, *, toolkit: ThreadboxToolkit | None = None, sanitize_input: bool = True, **toolkit_options: Any
    ) -> None:
        from .tools import ThreadboxToolkit

        if toolkit is None:
            toolkit = ThreadboxToolkit(stateful=True, **toolkit_options)
        elif toolkit_options:
            raise TypeError("pass either a toolkit or toolkit options, not both")
        if not toolkit.stateful:
            raise ValueError("PythonREPLTool needs a ThreadboxToolkit(stateful=True)")
        tk = toolkit
        clean = sanitize_input

        def run(query: str, config: RunnableConfig, runtime: ToolRuntime = None) -> ToolResult:  # type: ignore[assignment]
            return tk._run_code(config, runtime, sanitize(query, clean), None)

        async def arun(query: str, config: RunnableConfig, runtime: ToolRuntime = None) -> ToolResult:  # type: ignore[assignment]
            return await tk._arun_code(config, runtime, sanitize(query, clean), None)

        fields: dict[str, Any] = {
            "name": REPL_NAME,
            "description": REPL_DESCRIPTION,
            "args_schema": PythonREPLInput,
            "func": run,
            "coroutine": arun,
            "response_format": "content_and_artifact",
            "handle_tool_error": tk._handler(),
            "metadata": {"threadbox_tool": REPL_NAME},
            "toolkit": tk,
            "sanitize_input": sanitize_input,
        }
        super().__init__(**fields)


def sanitize(query: str, clean: bool) -> str:
    return sanitize_input(query) if clean else query


def _reset_result(info: ContextInfo, sb: Sandbox | AsyncSandbox) -> ToolResult:
    artifact = {"context_id": info.id, "generation": info.generation, "sandbox_id": sb.id}
    return RESET_NOTE, artifact


def reset_python(tk: ThreadboxToolkit, config: RunnableConfig | None) -> ToolResult:
    """Restarts the thread's ``python`` context (a fresh worker), making it if missing."""
    sb = tk._resolve(config, "reset_python")
    try:
        try:
            ctx = sb.contexts.create("python")
        except SandboxNotRunning:
            sb.ensure_running()
            ctx = sb.contexts.create("python")
        info = ctx.info if ctx.info.created else ctx.restart()
    except ThreadboxError as e:
        raise ToolException(f"reset_python failed: {e}") from e
    return _reset_result(info, sb)


async def areset_python(tk: ThreadboxToolkit, config: RunnableConfig | None) -> ToolResult:
    """Async twin of :func:`reset_python`."""
    sb = await tk._aresolve(config, "reset_python")
    try:
        try:
            ctx = await sb.contexts.create("python")
        except SandboxNotRunning:
            await sb.ensure_running()
            ctx = await sb.contexts.create("python")
        info = ctx.info if ctx.info.created else await ctx.restart()
    except ThreadboxError as e:
        raise ToolException(f"reset_python failed: {e}") from e
    return _reset_result(info, sb)
