"""Human approval for threadbox tools through LangGraph's ``interrupt()``.

One interrupt per tool node: when an ``AIMessage`` carries several calls of approval
tools, the human is asked about **all of them at once**, before any runs (the payload
is ``HumanInTheLoopMiddleware``'s ``action_requests`` / ``review_configs``). A node
that is re-run on resume therefore never runs an approved call twice. A resume value
that cannot be understood never raises: the same question is asked again, with an
``error`` field saying what was wrong, so a typo cannot wedge the thread.
"""

from __future__ import annotations

import inspect
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_type_hints

from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool, ToolException
from langgraph.prebuilt import ToolRuntime
from langgraph.types import interrupt
from pydantic import BaseModel

__all__ = [
    "APPROVAL_TYPE",
    "Decision",
    "InvalidDecision",
    "parse_decision",
    "require_approval",
    "with_approval",
]

APPROVAL_TYPE = "threadbox_approval"
DecisionKind = Literal["approve", "reject", "edit"]
_ALL: tuple[DecisionKind, ...] = ("approve", "reject", "edit")

_APPROVE = {"approve", "approved", "accept", "accepted", "yes", "y", "ok"}
_REJECT = {"reject", "rejected", "deny", "denied", "no", "n", "response", "ignore"}
_ACCEPTED_FORMS = (
    '"approve", "reject", {"type": "reject", "message": "..."}, {"type": "edit", "args": {...}}, '
    'or {"decisions": [one per action request, in order]}'
)


class InvalidDecision(ToolException):
    """A resume value that is not a decision (never escapes a tool: the question is asked again)."""


@dataclass(frozen=True)
class Decision:
    """A reviewer's decision, parsed from the value given to ``Command(resume=...)``."""

    kind: DecisionKind
    message: str | None = None
    args: dict[str, Any] = field(default_factory=dict)


def parse_decision(value: Any) -> Decision:
    """Parses one decision; raises :class:`InvalidDecision` when it is not one.

    Accepted forms: ``True`` / ``"approve"`` / ``{"type": "approve"}``;
    ``False`` / ``"reject"`` / ``{"type": "reject", "message": "why"}``;
    ``{"type": "edit", "args": {...}}`` (the arguments to change; also
    ``{"type": "edit", "edited_action": {"args": {...}}}``); and the
    ``HumanInTheLoopMiddleware`` shape ``{"decisions": [<one of the above>]}``
    (its first decision).
    """
    if isinstance(value, dict) and isinstance(value.get("decisions"), list):
        if not value["decisions"]:
            raise InvalidDecision("the 'decisions' list is empty")
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
        raise InvalidDecision(f"unrecognized approval decision {value!r}")
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
                raise InvalidDecision("an 'edit' decision needs the new arguments in 'args'")
            return Decision("edit", args=dict(args))
    raise InvalidDecision(f"unrecognized approval decision {value!r}")


# -- what is asked ---------------------------------------------------------------


@dataclass(frozen=True)
class _Request:
    """One call awaiting a decision."""

    call_id: str | None
    tool: BaseTool
    args: dict[str, Any]
    allowed: tuple[DecisionKind, ...]
    description: str


def _meta(tool: BaseTool) -> dict[str, Any] | None:
    m = (tool.metadata or {}).get("threadbox_approval")
    return m if isinstance(m, dict) else None


def _messages_of(state: Any) -> list[Any]:
    if isinstance(state, list):
        return state
    msgs = state.get("messages") if isinstance(state, Mapping) else getattr(state, "messages", None)
    return list(msgs) if isinstance(msgs, (list, tuple)) else []


def _sibling_requests(me: _Request, runtime: ToolRuntime | None) -> list[_Request]:
    """Every approval call of the ``AIMessage`` that holds this call, in its order.

    Without a ``ToolRuntime`` (the tool was invoked outside a ``ToolNode``) or when the
    message cannot be found, only this call is asked about.
    """
    if runtime is None or me.call_id is None:
        return [me]
    message = next(
        (
            m
            for m in reversed(_messages_of(runtime.state))
            if isinstance(m, AIMessage) and any(tc.get("id") == me.call_id for tc in m.tool_calls)
        ),
        None,
    )
    if message is None:
        return [me]
    tools = {t.name: t for t in (runtime.tools or []) if isinstance(t, BaseTool)}
    out: list[_Request] = []
    for tc in message.tool_calls:
        if tc.get("id") == me.call_id:
            out.append(me)
            continue
        tool = tools.get(tc["name"])
        meta = _meta(tool) if tool is not None else None
        if tool is None or meta is None:
            continue
        out.append(
            _Request(
                call_id=tc.get("id"),
                tool=tool,
                args=dict(tc.get("args") or {}),
                allowed=tuple(meta["allowed"]),
                description=str(meta["description"]),
            )
        )
    return out


def _payload(requests: Sequence[_Request], config: RunnableConfig, error: str | None) -> dict[str, Any]:
    action_requests = [
        {"name": r.tool.name, "args": dict(r.args), "description": r.description, "id": r.call_id} for r in requests
    ]
    p: dict[str, Any] = {
        "type": APPROVAL_TYPE,
        "action_requests": action_requests,
        "review_configs": [{"action_name": r.tool.name, "allowed_decisions": list(r.allowed)} for r in requests],
    }
    if len(requests) == 1:
        # The single-call fields a simple UI reads directly.
        r = requests[0]
        p.update(
            {
                "tool": r.tool.name,
                "args": dict(r.args),
                "description": r.description,
                "allowed_decisions": list(r.allowed),
            }
        )
        for key in ("code", "command", "path"):
            if key in r.args:
                p[key] = r.args[key]
    else:
        names = ", ".join(r.tool.name for r in requests)
        p["description"] = (
            f"The agent wants to make {len(requests)} calls ({names}). Decide on each: resume with "
            '{"decisions": [...]} (one per action request, in order), or one decision for all.'
        )
    tid = ((config or {}).get("configurable") or {}).get("thread_id")
    if tid is not None:
        p["thread_id"] = str(tid)
    if error is not None:
        p["error"] = f"{error}. Accepted: {_ACCEPTED_FORMS}."
    return p


def _validate(tool: BaseTool, args: dict[str, Any]) -> dict[str, Any]:
    schema = tool.args_schema
    if inspect.isclass(schema) and issubclass(schema, BaseModel):
        try:
            return schema.model_validate(args).model_dump(exclude_unset=True)
        except Exception as e:
            raise InvalidDecision(f"the edited arguments for {tool.name} are invalid: {e}") from e
    return args


def _resolve(value: Any, requests: Sequence[_Request]) -> list[tuple[Decision, dict[str, Any]]]:
    """One ``(decision, args)`` per request; raises :class:`InvalidDecision`."""
    n = len(requests)
    raw: list[Any]
    ids = [r.call_id for r in requests]
    if isinstance(value, dict) and isinstance(value.get("decisions"), list):
        raw = list(value["decisions"])
        if len(raw) == 1 and n > 1:
            raw = raw * n
        if len(raw) != n:
            raise InvalidDecision(f"{len(raw)} decisions were given for {n} action requests")
    elif isinstance(value, dict) and value and all(k in ids for k in value):
        missing = [i for i in ids if i not in value]
        if missing:
            raise InvalidDecision(f"no decision for the call(s) {missing}")
        raw = [value[i] for i in ids]
    else:
        raw = [value] * n
    out: list[tuple[Decision, dict[str, Any]]] = []
    for req, v in zip(requests, raw, strict=True):
        d = parse_decision(v)
        if d.kind not in req.allowed:
            raise InvalidDecision(f"decision {d.kind!r} is not allowed for {req.tool.name}")
        args = _validate(req.tool, {**req.args, **d.args}) if d.kind == "edit" else req.args
        out.append((d, args))
    return out


# -- one question per tool node --------------------------------------------------


class _Gate:
    """The decisions of one execution of one tool node, shared by its calls."""

    def __init__(self, scratchpad: object) -> None:
        self.scratchpad = scratchpad  # held so its id() cannot be reused while cached
        self.lock = threading.Lock()
        self.decisions: dict[str | None, tuple[Decision, dict[str, Any]]] | None = None
        self.pending: BaseException | None = None


try:
    from langgraph._internal._constants import CONFIG_KEY_SCRATCHPAD as _SCRATCHPAD_KEY
except ImportError:  # pragma: no cover - the constant moved; its value has been stable
    _SCRATCHPAD_KEY = "__pregel_scratchpad"

_GATES: OrderedDict[int, _Gate] = OrderedDict()
_GATES_LOCK = threading.Lock()
_MAX_GATES = 1024


def _gate(config: RunnableConfig) -> _Gate | None:
    # LangGraph's per-task scratchpad: a new object for every (re-)execution of a node,
    # shared by the calls ToolNode runs in parallel within it.
    scratchpad = ((config or {}).get("configurable") or {}).get(_SCRATCHPAD_KEY)
    if scratchpad is None:
        return None
    with _GATES_LOCK:
        g = _GATES.get(id(scratchpad))
        if g is None or g.scratchpad is not scratchpad:
            g = _Gate(scratchpad)
            _GATES[id(scratchpad)] = g
            while len(_GATES) > _MAX_GATES:
                _GATES.popitem(last=False)
        return g


def _ask(requests: Sequence[_Request], config: RunnableConfig) -> dict[str | None, tuple[Decision, dict[str, Any]]]:
    error: str | None = None
    while True:
        value = interrupt(_payload(requests, config, error))
        try:
            resolved = _resolve(value, requests)
        except InvalidDecision as e:
            error = str(e)
            continue  # ask again (the next interrupt of this node), never raise
        return {r.call_id: d for r, d in zip(requests, resolved, strict=True)}


def _decide(me: _Request, runtime: ToolRuntime | None, config: RunnableConfig) -> tuple[Decision, dict[str, Any]]:
    gate = _gate(config)
    if gate is None:  # not inside a graph: interrupt() itself will say so
        return _ask([me], config)[me.call_id]
    with gate.lock:
        if gate.pending is not None:
            raise gate.pending
        if gate.decisions is None or me.call_id not in gate.decisions:
            requests = _sibling_requests(me, runtime)
            try:
                decided = _ask(requests, config)
            except BaseException as e:  # GraphInterrupt: every call of the node stops
                gate.pending = e
                raise
            gate.decisions = {**(gate.decisions or {}), **decided}
        return gate.decisions[me.call_id]


# -- the wrapper -----------------------------------------------------------------


def _config_param(func: Any) -> str | None:
    try:
        hints = get_type_hints(func)
    except Exception:
        return None
    for name, t in hints.items():
        if t is RunnableConfig:
            return name
    return None


def _normalize(tool: BaseTool, result: Any) -> tuple[Any, dict[str, Any]]:
    if tool.response_format == "content_and_artifact" and isinstance(result, tuple) and len(result) == 2:
        content, artifact = result
        return (content if isinstance(content, (str, list)) else str(content)), dict(artifact or {})
    return (result if isinstance(result, (str, list)) else str(result)), {}


def _kwargs(func: Any, args: dict[str, Any], config: RunnableConfig, runtime: ToolRuntime | None) -> dict[str, Any]:
    kwargs = dict(args)
    if p := _config_param(func):
        kwargs[p] = config
    if runtime is not None and "runtime" in inspect.signature(func).parameters:
        kwargs["runtime"] = runtime  # the inner tool streams output and sees the conversation
    return kwargs


def _call(
    tool: BaseTool, args: dict[str, Any], config: RunnableConfig, runtime: ToolRuntime | None
) -> tuple[Any, dict[str, Any]]:
    if isinstance(tool, StructuredTool) and tool.func is not None:
        return _normalize(tool, tool.func(**_kwargs(tool.func, args, config, runtime)))
    return _normalize(tool, tool.invoke(args, config))


async def _acall(
    tool: BaseTool, args: dict[str, Any], config: RunnableConfig, runtime: ToolRuntime | None
) -> tuple[Any, dict[str, Any]]:
    if isinstance(tool, StructuredTool) and tool.coroutine is not None:
        return _normalize(tool, await tool.coroutine(**_kwargs(tool.coroutine, args, config, runtime)))
    return _normalize(tool, await tool.ainvoke(args, config))


def require_approval(
    tool: BaseTool,
    *,
    allowed: Sequence[DecisionKind] = _ALL,
    description: str | None = None,
) -> StructuredTool:
    """Wraps a threadbox tool so that every call first asks a human.

    The wrapped tool calls LangGraph's ``interrupt()`` with a payload in the shape of
    ``HumanInTheLoopMiddleware``'s, listing **every** approval call of the model's
    message (calls of one message are decided together, before any of them runs)::

        {"type": "threadbox_approval",
         "action_requests": [{"name": "run_python", "args": {...}, "description": "...", "id": "<call id>"}, ...],
         "review_configs": [{"action_name": "run_python", "allowed_decisions": [...]}, ...],
         "description": "...", "thread_id": "..."}

    With one call the payload also has ``tool``, ``args``, ``allowed_decisions`` and
    ``code`` / ``command`` / ``path``. Resume with one decision for every call
    (``Command(resume="approve")``, ``{"type": "reject", "message": "..."}``,
    ``{"type": "edit", "args": {"code": "..."}}``), with ``{"decisions": [...]}``
    (one per action request, in order), or with ``{<call id>: <decision>, ...}``.

    A resume value that is not a decision is never an error of the thread: the node
    interrupts again with the same requests and an ``error`` field. Nothing touches
    the sandbox before every decision is in, so re-running the node on resume is
    safe. A rejected call returns a message saying so (the artifact has
    ``rejected: True``) and runs nothing. Needs a checkpointer.
    """
    allowed_list = tuple(d for d in _ALL if d in allowed)
    name = tool.name
    desc = description or f"The agent wants to run {name}. Approve, reject or edit the call."

    def rejected(decision: Decision) -> tuple[str, dict[str, Any]]:
        text = f"The user rejected this {name} call; nothing was run."
        if decision.message:
            text += f" Their message: {decision.message}"
        return text, {"approval": "reject", "rejected": True, "message": decision.message}

    def request(kwargs: dict[str, Any], runtime: ToolRuntime | None) -> _Request:
        call_id = runtime.tool_call_id if runtime is not None else None
        # Optional arguments the model left out arrive as None: not part of its request.
        args = {k: v for k, v in kwargs.items() if v is not None}
        return _Request(call_id=call_id, tool=tool, args=args, allowed=allowed_list, description=desc)

    def finish(decision: Decision, args: dict[str, Any], artifact: dict[str, Any]) -> dict[str, Any]:
        artifact.update({"approval": decision.kind, "rejected": False})
        if decision.kind == "edit":
            artifact["edited_args"] = args
        return artifact

    def run(config: RunnableConfig, runtime: ToolRuntime = None, **kwargs: Any) -> tuple[Any, dict[str, Any]]:  # type: ignore[assignment]
        decision, args = _decide(request(kwargs, runtime), runtime, config)
        if decision.kind == "reject":
            return rejected(decision)
        content, artifact = _call(tool, args, config, runtime)
        return content, finish(decision, args, artifact)

    async def arun(config: RunnableConfig, runtime: ToolRuntime = None, **kwargs: Any) -> tuple[Any, dict[str, Any]]:  # type: ignore[assignment]
        decision, args = _decide(request(kwargs, runtime), runtime, config)
        if decision.kind == "reject":
            return rejected(decision)
        content, artifact = await _acall(tool, args, config, runtime)
        return content, finish(decision, args, artifact)

    return StructuredTool(
        name=name,
        description=tool.description,
        args_schema=tool.args_schema if tool.args_schema is not None else tool.tool_call_schema,
        func=run,
        coroutine=arun,
        response_format="content_and_artifact",
        handle_tool_error=tool.handle_tool_error,
        metadata={
            **(tool.metadata or {}),
            "threadbox_approval": {"allowed": list(allowed_list), "description": desc},
        },
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
