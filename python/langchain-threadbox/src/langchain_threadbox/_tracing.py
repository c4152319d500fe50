"""The tool's own span (issue 17, ADR 0090).

Each exec tool call runs inside an OpenTelemetry ``execute_tool {name}`` span (GenAI
semantic conventions) when ``opentelemetry-api`` is importable, so the SDK's requests carry
it as their parent and a traced LangGraph run shows tool call -> daemon -> process as one
tree. Not every LangChain tracer leaves its tool span current (see
docs/observability.md); this span makes the chain independent of which one is used.
Arguments and results are never put on the span: they can hold secrets.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

_trace: Any
try:
    from opentelemetry import trace as _otel_trace

    _trace = _otel_trace
except ImportError:  # pragma: no cover - exercised where opentelemetry is absent
    _trace = None


@contextlib.contextmanager
def tool_span(name: str, tool_call_id: str | None) -> Iterator[None]:
    """Runs the body inside ``execute_tool {name}`` (a no-op without OpenTelemetry)."""
    if _trace is None:
        yield
        return
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
