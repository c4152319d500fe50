"""The tool's own span, and the daemon's trace id on the LangSmith run (issue 17, ADR 0090).

Each exec tool call runs inside an OpenTelemetry ``execute_tool {name}`` span (GenAI
semantic conventions) when ``opentelemetry-api`` is importable, so the SDK's requests carry
it as their parent and a traced LangGraph run shows tool call -> daemon -> process as one
tree. Not every LangChain tracer leaves its tool span current (see
docs/observability.md); this span makes the chain independent of which one is used.
Arguments and results are never put on the span: they can hold secrets.

LangSmith's runs are not W3C spans, so they cannot be the daemon's parent. Instead, when a
LangSmith run is current (LangChain's tracer makes the tool's run current while the tool
runs), the daemon's trace id (``x-threadbox-trace-id``) is recorded in that run's metadata
as ``threadbox_trace_id``: one click from the LangSmith tool run to the daemon's trace.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from threadbox._tracing import recording_trace_ids

_trace: Any
try:
    from opentelemetry import trace as _otel_trace

    _trace = _otel_trace
except ImportError:  # pragma: no cover - exercised where opentelemetry is absent
    _trace = None

_current_run_tree: Any
try:
    from langsmith.run_helpers import get_current_run_tree as _get_current_run_tree

    _current_run_tree = _get_current_run_tree
except ImportError:  # pragma: no cover - exercised where langsmith is absent
    _current_run_tree = None

#: The metadata key of the daemon's trace id on a LangSmith tool run.
LANGSMITH_TRACE_KEY = "threadbox_trace_id"


@contextlib.contextmanager
def tool_span(name: str, tool_call_id: str | None) -> Iterator[None]:
    """Runs the body inside ``execute_tool {name}`` (no span without OpenTelemetry) and
    records the daemon's trace id on the current LangSmith run, if any."""
    with recording_trace_ids() as ids:
        try:
            if _trace is None:
                yield
            else:
                attrs: dict[str, str] = {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": name,
                    "gen_ai.tool.type": "function",
                }
                if tool_call_id:
                    attrs["gen_ai.tool.call.id"] = tool_call_id
                tracer = _trace.get_tracer("langchain-threadbox")
                with tracer.start_as_current_span(f"execute_tool {name}", attributes=attrs):
                    yield
        finally:
            # Also on failure: a failed call's trace is the one worth opening.
            _annotate_langsmith(ids)


def _annotate_langsmith(ids: list[str]) -> None:
    if not ids or _current_run_tree is None:
        return
    run = _current_run_tree()
    if run is None:
        return
    # The last request's trace is the exec itself (a resume before it has its own).
    meta: dict[str, Any] = {LANGSMITH_TRACE_KEY: ids[-1]}
    if len(ids) > 1:
        meta["threadbox_trace_ids"] = list(ids)
    run.add_metadata(meta)
