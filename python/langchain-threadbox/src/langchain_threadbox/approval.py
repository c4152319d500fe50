"""Human approval for threadbox tools through LangGraph's ``interrupt()``."""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_type_hints

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool, ToolException
from langgraph.types import interrupt
from pydantic import BaseModel

__all__ = ["APPROVAL_TYPE", "Decision", "parse_decision", "require_approval", "with_approval"]

APPROVAL_TYPE = "threadbox_approval"
DecisionKind = Literal["approve", "reject", "edit"]
_ALL: tuple[DecisionKind, ...] = ("approve", "reject", "edit")

_APPROVE = {"approve", "approved", "accept", "accepted", "yes", "y", "ok"}
_REJECT = {"reject", "rejected", "deny", "denied", "no", "n", "response", "ignore"}


@dataclass(frozen=True)
class Decision:
    """A reviewer's decision, parsed from the value given to ``Command(resume=...)``."""

    kind: DecisionKind
    message: str | None = None
    args: dict[str, Any] = field(default_factory=dict)


def parse_decision(value: Any) -> Decision:
    """Parses a resume value.

    Accepted forms: ``True`` / ``"approve"`` / ``{"type": "approve"}``;
    ``False`` / ``"reject"`` / ``{"type": "reject", "message": "why"}``;
    ``{"type": "edit", "args": {...}}`` (the arguments to change; also
    ``{"type": "edit", "edited_action": {"args": {...}}}``); and the
    ``HumanInTheLoopMiddleware`` shape ``{"decisions": [<one of the above>]}``.
    """
    if isinstance(value, dict) and isinstance(value.get("decisions"), list):
        if not value["decisions"]:
            raise ToolException("approval resume value has an empty 'decisions' list")
        value = value["decisions"][0]
    if value is True:
        return Decision("approve")
    if value is False or value is None:
        return Decision("reject")
    if isinstance(value, str):
        v = value.strip().lower()
        if v in _APPROVE:
            return Decision("approve")
        if v in _REJECT:
            return Decision("reject")
        raise ToolException(f"unrecognized approval decision {value!r}")
    if isinstance(value, dict):
        kind = str(value.get("type") or value.get("action") or value.get("decision") or "").lower()
        if kind in _APPROVE:
            return Decision("approve")
        if kind in _REJECT:
            msg = value.get("message") or value.get("reason")
            if msg is None and kind == "response" and isinstance(value.get("args"), str):
                msg = value["args"]  # Agent Inbox "response": a text reply to the agent
            return Decision("reject", message=str(msg) if msg else None)
        if kind == "edit":
            args = value.get("args") or value.get("edited_args")
            if args is None and isinstance(value.get("edited_action"), dict):
                args = value["edited_action"].get("args")
            if not isinstance(args, dict):
                raise ToolException("an 'edit' decision needs the new arguments in 'args'")
            return Decision("edit", args=dict(args))
    raise ToolException(f"unrecognized approval decision {value!r}")


def _config_param(func: Any) -> str | None:
    try:
        hints = get_type_hints(func)
    except Exception:
        return None
    for name, t in hints.items():
        if t is RunnableConfig:
            return name
    return None


def _normalize(tool: BaseTool, result: Any) -> tuple[str, dict[str, Any]]:
    if tool.response_format == "content_and_artifact" and isinstance(result, tuple) and len(result) == 2:
        content, artifact = result
        return (content if isinstance(content, str) else str(content)), dict(artifact or {})
    return (result if isinstance(result, str) else str(result)), {}


def _call(tool: BaseTool, args: dict[str, Any], config: RunnableConfig) -> tuple[str, dict[str, Any]]:
    if isinstance(tool, StructuredTool) and tool.func is not None:
        kwargs = dict(args)
        if p := _config_param(tool.func):
            kwargs[p] = config
        return _normalize(tool, tool.func(**kwargs))
    return _normalize(tool, tool.invoke(args, config))


async def _acall(tool: BaseTool, args: dict[str, Any], config: RunnableConfig) -> tuple[str, dict[str, Any]]:
    if isinstance(tool, StructuredTool) and tool.coroutine is not None:
        kwargs = dict(args)
        if p := _config_param(tool.coroutine):
            kwargs[p] = config
        return _normalize(tool, await tool.coroutine(**kwargs))
    return _normalize(tool, await tool.ainvoke(args, config))


def _validate(tool: BaseTool, args: dict[str, Any]) -> dict[str, Any]:
    schema = tool.args_schema
    if inspect.isclass(schema) and issubclass(schema, BaseModel):
        try:
            return schema.model_validate(args).model_dump()
        except Exception as e:
            raise ToolException(f"edited arguments for {tool.name} are invalid: {e}") from e
    return args


def require_approval(
    tool: BaseTool,
    *,
    allowed: Sequence[DecisionKind] = _ALL,
    description: str | None = None,
) -> StructuredTool:
    """Wraps a threadbox tool so that every call first asks a human.

    The wrapped tool calls LangGraph's ``interrupt()`` with a payload such as::

        {"type": "threadbox_approval", "tool": "run_python", "args": {...},
         "code": "<the program>", "allowed_decisions": ["approve", "reject", "edit"],
         "description": "...", "action_requests": [...], "review_configs": [...]}

    (``command`` instead of ``code`` for ``run_shell``). Resume the graph with
    ``Command(resume="approve")``, ``Command(resume={"type": "reject", "message":
    "..."})`` or ``Command(resume={"type": "edit", "args": {"code": "..."}})``; the
    ``HumanInTheLoopMiddleware`` form ``{"decisions": [...]}`` also works.

    Nothing touches the sandbox before the interrupt (not even get-or-create), so
    re-running the node on resume is safe. A rejected call returns a message saying
    so (the artifact has ``rejected: True``) and runs nothing. Needs a checkpointer.
    """
    allowed_list = [d for d in _ALL if d in allowed]
    name = tool.name
    desc = description or f"The agent wants to run {name}. Approve, reject or edit the call."

    def payload(args: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
        p: dict[str, Any] = {
            "type": APPROVAL_TYPE,
            "tool": name,
            "args": dict(args),
            "description": desc,
            "allowed_decisions": allowed_list,
            "action_requests": [{"name": name, "args": dict(args), "description": desc}],
            "review_configs": [{"action_name": name, "allowed_decisions": allowed_list}],
        }
        for key in ("code", "command", "path"):
            if key in args:
                p[key] = args[key]
        tid = ((config or {}).get("configurable") or {}).get("thread_id")
        if tid is not None:
            p["thread_id"] = str(tid)
        return p

    def decide(args: dict[str, Any], config: RunnableConfig) -> tuple[Decision, dict[str, Any]]:
        decision = parse_decision(interrupt(payload(args, config)))
        if decision.kind not in allowed_list:
            raise ToolException(f"decision {decision.kind!r} is not allowed for {name}")
        if decision.kind == "edit":
            args = _validate(tool, {**args, **decision.args})
        return decision, args

    def rejected(decision: Decision) -> tuple[str, dict[str, Any]]:
        text = f"The user rejected this {name} call; nothing was run."
        if decision.message:
            text += f" Their message: {decision.message}"
        return text, {"approval": "reject", "rejected": True, "message": decision.message}

    def run(config: RunnableConfig, **kwargs: Any) -> tuple[str, dict[str, Any]]:
        decision, args = decide(kwargs, config)
        if decision.kind == "reject":
            return rejected(decision)
        content, artifact = _call(tool, args, config)
        artifact.update({"approval": decision.kind, "rejected": False})
        if decision.kind == "edit":
            artifact["edited_args"] = args
        return content, artifact

    async def arun(config: RunnableConfig, **kwargs: Any) -> tuple[str, dict[str, Any]]:
        decision, args = decide(kwargs, config)
        if decision.kind == "reject":
            return rejected(decision)
        content, artifact = await _acall(tool, args, config)
        artifact.update({"approval": decision.kind, "rejected": False})
        if decision.kind == "edit":
            artifact["edited_args"] = args
        return content, artifact

    return StructuredTool(
        name=name,
        description=tool.description,
        args_schema=tool.args_schema if tool.args_schema is not None else tool.tool_call_schema,
        func=run,
        coroutine=arun,
        response_format="content_and_artifact",
        handle_tool_error=tool.handle_tool_error,
        metadata={**(tool.metadata or {}), "threadbox_approval": True},
        tags=tool.tags,
    )


def with_approval(
    tools: Iterable[BaseTool],
    *,
    only: Iterable[str] | None = None,
    allowed: Sequence[DecisionKind] = _ALL,
) -> list[BaseTool]:
    """Wraps every tool (or those named in ``only``) with :func:`require_approval`."""
    names = set(only) if only is not None else None
    return [require_approval(t, allowed=allowed) if names is None or t.name in names else t for t in tools]
