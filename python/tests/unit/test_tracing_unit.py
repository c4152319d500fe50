"""Trace context from the SDK and the tools (issue 17, ADR 0090), offline.

The SDK puts the current OpenTelemetry context on every request (sync and async), keeps a
``traceparent`` the caller set, and adds nothing without an active span; the exec tools
open an ``execute_tool`` span that is the requests' parent.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from langchain_threadbox import ThreadboxToolkit  # noqa: E402
from langchain_threadbox.binding import ClientFactory, ThreadSandboxes  # noqa: E402
from threadbox import AsyncThreadbox, Threadbox  # noqa: E402

_EXPORTER = InMemorySpanExporter()
_PROVIDER = sdk_trace.TracerProvider()
_PROVIDER.add_span_processor(SimpleSpanProcessor(_EXPORTER))


@pytest.fixture
def tracer() -> Iterator[Any]:
    # The global provider can be set once per process; tests use this one directly and
    # make it current for the tools through set_tracer_provider where it is not yet set.
    trace.set_tracer_provider(_PROVIDER)
    if trace.get_tracer_provider() is not _PROVIDER:
        # Another test of the session set the global first (it can be set once): make
        # ours the one `get_tracer()` answers for this test.
        trace._TRACER_PROVIDER = _PROVIDER
    _EXPORTER.clear()
    yield _PROVIDER.get_tracer("test")


def _recorder() -> tuple[list[httpx.Request], httpx.MockTransport, httpx.MockTransport]:
    seen: list[httpx.Request] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        if req.url.path.endswith("/exec"):
            return httpx.Response(200, json={"exit_code": 0, "stdout": "", "stderr": "", "encoding": "utf8"})
        if req.method == "POST" and req.url.path.endswith("/sandboxes"):
            body = json.loads(req.content)
            return httpx.Response(201, json={"id": "sb-1", "name": body.get("name"), "state": "running", "labels": {}})
        return httpx.Response(200, json={"sandboxes": []})

    return seen, httpx.MockTransport(handler), httpx.MockTransport(handler)


def _traceparent_of(span: Any) -> str:
    """The version, trace id and parent id of the span's traceparent (flags vary: 01 or 03)."""
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}"


def _sent(req: httpx.Request) -> str:
    return req.headers["traceparent"].rsplit("-", 1)[0]


def test_sync_client_injects_the_current_span(tracer: Any) -> None:
    seen, transport, _ = _recorder()
    tb = Threadbox("http://daemon.test", transport=transport)
    with tracer.start_as_current_span("caller") as span:
        tb.list()
    assert _sent(seen[-1]) == _traceparent_of(span)


async def test_async_client_injects_the_current_span(tracer: Any) -> None:
    seen, _, transport = _recorder()
    tb = AsyncThreadbox("http://daemon.test", transport=transport)
    with tracer.start_as_current_span("caller") as span:
        await tb.list()
    await tb.aclose()
    assert _sent(seen[-1]) == _traceparent_of(span)


def test_no_active_span_adds_nothing_and_an_explicit_header_wins(tracer: Any) -> None:
    seen, transport, _ = _recorder()
    tb = Threadbox("http://daemon.test", transport=transport)
    tb.list()
    assert "traceparent" not in seen[-1].headers
    mine = "00-11111111111111111111111111111111-2222222222222222-01"
    tb2 = Threadbox("http://daemon.test", transport=transport, headers={"traceparent": mine})
    with tracer.start_as_current_span("caller"):
        tb2.list()
    assert seen[-1].headers["traceparent"] == mine


def test_the_exec_tool_span_is_the_parent_of_its_requests(tracer: Any) -> None:
    seen, transport, _ = _recorder()
    tk = ThreadboxToolkit(client=Threadbox("http://daemon.test", transport=transport))
    with tracer.start_as_current_span("graph") as root:
        tk.run_shell.invoke(
            {"type": "tool_call", "id": "call-1", "name": "run_shell", "args": {"command": "true"}},
            {"configurable": {"thread_id": "t1"}},
        )
    spans = {s.name: s for s in _EXPORTER.get_finished_spans()}
    tool = spans["execute_tool run_shell"]
    assert tool.parent is not None and tool.parent.span_id == root.get_span_context().span_id
    assert tool.attributes is not None
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
    exec_req = next(r for r in seen if r.url.path.endswith("/exec"))
    assert _sent(exec_req) == _traceparent_of(tool)


def _traced_transport(trace_id: str) -> httpx.MockTransport:
    """A daemon stand-in that names its trace, as a daemon exporting traces does."""

    def handler(req: httpx.Request) -> httpx.Response:
        headers = {"x-threadbox-trace-id": trace_id}
        if req.url.path.endswith("/exec"):
            body = {"exit_code": 0, "stdout": "", "stderr": "", "encoding": "utf8"}
            return httpx.Response(200, json=body, headers=headers)
        if req.method == "POST" and req.url.path.endswith("/sandboxes"):
            name = json.loads(req.content).get("name")
            return httpx.Response(
                201, json={"id": "sb-1", "name": name, "state": "running", "labels": {}}, headers=headers
            )
        return httpx.Response(200, json={"sandboxes": []}, headers=headers)

    return httpx.MockTransport(handler)


def _langsmith_tracer() -> Any:
    """LangChain's LangSmith tracer with the upload cut off (the runs are kept here)."""
    tracers = pytest.importorskip("langchain_core.tracers.langchain")
    langsmith = pytest.importorskip("langsmith")
    ls_schemas = pytest.importorskip("langsmith.schemas")

    class Kept(tracers.LangChainTracer):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            # A client that never calls out (no /info probe, no batch thread): the runs
            # are read here, never uploaded.
            client = langsmith.Client(
                api_url="http://127.0.0.1:9", api_key="test", info=ls_schemas.LangSmithInfo(), auto_batch_tracing=False
            )
            super().__init__(project_name="threadbox-test", client=client)
            self.tool_runs: list[Any] = []

        def _persist_run_single(self, run: Any) -> None:
            pass

        @staticmethod
        def _update_run_single(run: Any) -> None:
            pass

        def _on_tool_end(self, run: Any) -> None:
            self.tool_runs.append(run)

    return Kept()


def test_the_langsmith_tool_run_records_the_daemons_trace_id() -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    tracer = _langsmith_tracer()
    tk = ThreadboxToolkit(client=Threadbox("http://daemon.test", transport=_traced_transport(trace_id)))
    tk.run_shell.invoke(
        {"type": "tool_call", "id": "call-1", "name": "run_shell", "args": {"command": "true"}},
        {"configurable": {"thread_id": "t1"}, "callbacks": [tracer]},
    )
    (run,) = tracer.tool_runs
    assert run.metadata["threadbox_trace_id"] == trace_id


async def test_the_async_langsmith_tool_run_records_the_daemons_trace_id() -> None:
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    tracer = _langsmith_tracer()
    client = AsyncThreadbox("http://daemon.test", transport=_traced_transport(trace_id))
    factory = ClientFactory(url="http://daemon.test", async_client=client)
    tk = ThreadboxToolkit(binding=ThreadSandboxes(factory))
    await tk.run_shell.ainvoke(
        {"type": "tool_call", "id": "call-1", "name": "run_shell", "args": {"command": "true"}},
        {"configurable": {"thread_id": "t1"}, "callbacks": [tracer]},
    )
    await client.aclose()
    (run,) = tracer.tool_runs
    assert run.metadata["threadbox_trace_id"] == trace_id


def test_without_a_traced_daemon_the_langsmith_run_gets_no_trace_id() -> None:
    seen, transport, _ = _recorder()
    tracer = _langsmith_tracer()
    tk = ThreadboxToolkit(client=Threadbox("http://daemon.test", transport=transport))
    tk.run_shell.invoke(
        {"type": "tool_call", "id": "call-1", "name": "run_shell", "args": {"command": "true"}},
        {"configurable": {"thread_id": "t1"}, "callbacks": [tracer]},
    )
    (run,) = tracer.tool_runs
    assert "threadbox_trace_id" not in run.metadata
    assert any(r.url.path.endswith("/exec") for r in seen)


def test_create_sends_tier_and_otlp_relay_only_when_asked() -> None:
    seen, transport, _ = _recorder()
    tb = Threadbox("http://daemon.test", transport=transport)
    tb.create("a")
    first = json.loads(seen[-1].content)
    assert "tier" not in first and "otlp_relay" not in first
    tb.create("b", tier="jail", otlp_relay=True)
    second = json.loads(seen[-1].content)
    assert second["tier"] == "jail" and second["otlp_relay"] is True


def test_file_tools_run_in_their_own_span_too(tracer: Any) -> None:
    seen, transport, _ = _recorder()
    tk = ThreadboxToolkit(client=Threadbox("http://daemon.test", transport=transport))
    with tracer.start_as_current_span("graph"):
        try:
            tk.list_files.invoke(
                {"type": "tool_call", "id": "call-2", "name": "list_files", "args": {"path": "."}},
                {"configurable": {"thread_id": "t1"}},
            )
        except Exception:  # the stand-in daemon has no file API; the span is the point
            pass
    spans = {s.name: s for s in _EXPORTER.get_finished_spans()}
    tool = spans["execute_tool list_files"]
    assert tool.attributes is not None and tool.attributes["gen_ai.tool.name"] == "list_files"
    after_create = [r for r in seen if "traceparent" in r.headers]
    assert after_create and all(_sent(r) == _traceparent_of(tool) for r in after_create)
