"""LangChain / LangGraph / Deep Agents integration for threadbox sandboxes.

- :class:`ThreadboxToolkit`: ``run_python``, ``run_shell``, ``read_file``,
  ``write_file`` and ``list_files`` tools, bound to the graph's thread by default.
- :func:`require_approval` / :func:`with_approval`: ask a human through
  ``interrupt()`` before a tool runs.
- :class:`ThreadboxSandbox`: a Deep Agents ``BaseSandbox`` backend (needs the
  ``deepagents`` extra).
- :class:`PythonREPLTool`: a sandboxed, stateful drop-in for LangChain's tool of the
  same name (``Python_REPL``, argument ``query``).
- :func:`release_thread_sandbox`: delete, stop, pause or hibernate a thread's sandbox.
- :data:`THREADBOX_SYSTEM_PROMPT`: tells the model where it may write.
- :class:`TimeTravelSaver`: a checkpointer wrapper that rewinds or forks the thread's
  sandbox when the graph goes back in time (``langchain_threadbox.timetravel``)::

      saver = TimeTravelSaver(InMemorySaver())            # any LangGraph checkpointer
      tools = ThreadboxToolkit(binding=saver.sandboxes).get_tools()
      graph = builder.compile(checkpointer=saver)
      graph.invoke(msg, {"configurable": {"thread_id": "t", "checkpoint_id": earlier}})
      # -> the tools see the files of `earlier`; saver.copy_thread("t", "t2") forks them
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._output import cut_middle, format_exec
from .approval import Decision, parse_decision, require_approval, with_approval
from .binding import (
    ClientFactory,
    FixedSandbox,
    ReleaseAction,
    SandboxBinding,
    ThreadIdMissing,
    ThreadSandboxes,
    arelease_thread_sandbox,
    release_thread_sandbox,
    thread_id_from_config,
    thread_sandbox_name,
)
from .prompts import THREADBOX_SYSTEM_PROMPT
from .repl import PythonREPLTool
from .timetravel import SandboxHistoryLost, TimeTravelSaver
from .tools import ThreadboxToolkit

if TYPE_CHECKING:
    from .sandbox import ThreadboxSandbox

__version__ = "0.1.0"

__all__ = [
    "THREADBOX_SYSTEM_PROMPT",
    "ClientFactory",
    "Decision",
    "FixedSandbox",
    "PythonREPLTool",
    "SandboxBinding",
    "SandboxHistoryLost",
    "ThreadIdMissing",
    "ThreadSandboxes",
    "ThreadboxSandbox",
    "ThreadboxToolkit",
    "TimeTravelSaver",
    "ReleaseAction",
    "arelease_thread_sandbox",
    "cut_middle",
    "format_exec",
    "parse_decision",
    "release_thread_sandbox",
    "require_approval",
    "thread_id_from_config",
    "thread_sandbox_name",
    "with_approval",
]


def __getattr__(name: str) -> Any:
    if name == "ThreadboxSandbox":  # imports deepagents only when asked for
        from .sandbox import ThreadboxSandbox

        return ThreadboxSandbox
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
