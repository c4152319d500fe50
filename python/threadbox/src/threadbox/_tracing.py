"""Trace context on every request (issue 17, ADR 0090).

When ``opentelemetry-api`` is importable, each request carries the current context as
W3C ``traceparent``/``tracestate``/``baggage`` headers, so the daemon's spans (and the
sandboxed process, through ``TRACEPARENT``) join the caller's trace. Without it, or with
no active span, nothing is added: OpenTelemetry stays an optional dependency.

The daemon names its trace in the ``x-threadbox-trace-id`` response header; callers whose
tracer is not a W3C parent (LangSmith) record that id instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import httpx

TRACE_ID_HEADER = "x-threadbox-trace-id"

# The daemon trace ids seen while a `recording_trace_ids()` block runs. A list (mutable,
# shared) rather than a value, so a request made in a copied context (an executor thread,
# a task) still reports to the block that asked.
_recording: ContextVar[list[str] | None] = ContextVar("threadbox_trace_ids", default=None)

_propagate: Any
try:
    from opentelemetry import propagate as _otel_propagate

    _propagate = _otel_propagate
except ImportError:  # pragma: no cover - exercised where opentelemetry is absent
    _propagate = None


def inject(headers: httpx.Headers) -> None:
    """Adds the current trace context to ``headers`` (a no-op without OpenTelemetry).

    A header the caller set explicitly is kept: the propagator would replace it.
    """
    if _propagate is None:
        return
    carrier: dict[str, str] = {}
    _propagate.inject(carrier)
    for key, value in carrier.items():
        if value and key not in headers:
            headers[key] = value


def request_hook(request: httpx.Request) -> None:
    """httpx ``event_hooks["request"]`` entry for the sync client."""
    inject(request.headers)


async def async_request_hook(request: httpx.Request) -> None:
    """httpx ``event_hooks["request"]`` entry for the async client."""
    inject(request.headers)


@contextlib.contextmanager
def recording_trace_ids() -> Iterator[list[str]]:
    """Collects, in order and once each, the daemon's trace ids of the requests made
    inside the block (from ``x-threadbox-trace-id``; none when the daemon exports no
    traces)."""
    ids: list[str] = []
    token = _recording.set(ids)
    try:
        yield ids
    finally:
        _recording.reset(token)


def _note(response: httpx.Response) -> None:
    ids = _recording.get()
    if ids is None:
        return
    value = response.headers.get(TRACE_ID_HEADER)
    if value and value not in ids:
        ids.append(value)


def response_hook(response: httpx.Response) -> None:
    """httpx ``event_hooks["response"]`` entry for the sync client."""
    _note(response)


async def async_response_hook(response: httpx.Response) -> None:
    """httpx ``event_hooks["response"]`` entry for the async client."""
    _note(response)
