"""One trace across the boundary (issue 17 "Done means", ADRs 0090-0091): a LangGraph graph
run with OpenTelemetry, whose scripted model calls ``run_shell``, yields one trace from the
tool's ``execute_tool`` span, through the daemon's request and operation spans, down to a
span the sandboxed program exported itself through the in-sandbox OTLP endpoint.

The daemon exports to a local OTLP/HTTP receiver this test starts (JSON encoding, so the
test reads it without protobuf); the graph's own spans go to an in-memory exporter. The
sandboxed program builds its OTLP/JSON by hand: the host image has no OpenTelemetry SDK,
and the wire format is what matters across the boundary. Every wait polls with a deadline.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import Daemon, _skip_reason, threadbox_bin
from graph_helpers import build_graph
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from langchain_threadbox import ThreadboxToolkit
from langchain_threadbox.testing import ScriptRule, call
from threadbox import Threadbox

sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

pytestmark = pytest.mark.daemon

# The sandboxed program: one span, child of the exec span TRACEPARENT names, exported to
# the endpoint the daemon put in OTEL_EXPORTER_OTLP_ENDPOINT. Prints the HTTP status.
EXPORT_ONE_SPAN = r"""
import json, os, time, urllib.request
tp = os.environ["TRACEPARENT"].split("-")
now = time.time_ns()
span = {"traceId": tp[1], "spanId": os.urandom(8).hex(), "parentSpanId": tp[2],
        "name": "inside-the-sandbox", "kind": 1,
        "startTimeUnixNano": str(now - 1000), "endTimeUnixNano": str(now)}
body = {"resourceSpans": [{"resource": {"attributes": []},
        "scopeSpans": [{"scope": {"name": "sandboxed"}, "spans": [span]}]}]}
req = urllib.request.Request(os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] + "/v1/traces",
                             data=json.dumps(body).encode(), method="POST",
                             headers={"Content-Type": "application/json"})
print("exported", urllib.request.urlopen(req, timeout=10).status)
"""

RULES = [ScriptRule("trace me", [[call("run_python", code=EXPORT_ONE_SPAN)]])]


class Receiver:
    """An OTLP/HTTP (JSON) receiver on a free loopback port; keeps every span it gets."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path == "/v1/traces":
                    receiver._take(json.loads(body))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def _take(self, envelope: dict[str, Any]) -> None:
        with self._lock:
            for rs in envelope.get("resourceSpans", []):
                for ss in rs.get("scopeSpans", []):
                    self.spans.extend(ss.get("spans", []))

    def wait_for(self, key: str, value: str, deadline_s: float = 30.0) -> dict[str, Any]:
        """The first span whose ``key`` is ``value``, waiting for the daemon's batch export
        (a parent span ends, and is exported, after its children)."""
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            with self._lock:
                for s in self.spans:
                    if s.get(key) == value:
                        return s
            time.sleep(0.05)
        with self._lock:
            names = sorted({s.get("name", "") for s in self.spans})
        raise AssertionError(f"no span with {key}={value!r} reached the receiver in {deadline_s}s; got {names}")

    def close(self) -> None:
        self._server.shutdown()


@pytest.fixture(scope="module")
def traced() -> Iterator[tuple[Receiver, Daemon]]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    receiver = Receiver()
    base = Path(tempfile.mkdtemp(prefix="threadbox-pytest-otel-"))
    d = Daemon(threadbox_bin(), base)
    d.extra_args = [*d.extra_args, "--otlp-endpoint", receiver.url]
    saved = {k: os.environ.get(k) for k in ("OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_BSP_SCHEDULE_DELAY")}
    os.environ["OTEL_EXPORTER_OTLP_PROTOCOL"] = "http/json"
    os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "50"
    try:
        d.start()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        yield receiver, d
    finally:
        d.stop()
        receiver.close()
        shutil.rmtree(base, ignore_errors=True)


def test_one_trace_from_the_tool_span_to_a_span_the_sandboxed_program_exported(
    traced: tuple[Receiver, Daemon],
) -> None:
    receiver, d = traced
    exporter = InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    # The global provider can be set once per process (another test may have set it):
    # make ours the one the tools' get_tracer() reaches either way.
    previous = trace._TRACER_PROVIDER
    trace.set_tracer_provider(provider)
    if trace.get_tracer_provider() is not provider:
        trace._TRACER_PROVIDER = provider

    tb = Threadbox(d.url)
    toolkit = ThreadboxToolkit(client=tb, sandbox_options={"otlp_relay": True})
    graph = build_graph(toolkit, InMemorySaver(), rules=RULES)
    tid = f"otel-{os.getpid()}-{time.monotonic_ns()}"
    try:
        with provider.get_tracer("test").start_as_current_span("graph run"):
            out = graph.invoke({"messages": [HumanMessage("trace me")]}, {"configurable": {"thread_id": tid}})
        tool_msgs = [m for m in out["messages"] if getattr(m, "type", "") == "tool"]
        assert tool_msgs and "exported 200" in str(tool_msgs[-1].content), tool_msgs

        tool = next(s for s in exporter.get_finished_spans() if s.name == "execute_tool run_python")
        trace_id = f"{tool.context.trace_id:032x}"
        tool_id = f"{tool.context.span_id:016x}"

        inside = receiver.wait_for("name", "inside-the-sandbox")
        assert inside["traceId"] == trace_id, "the sandboxed program's span is in the tool's trace"
        # Walk up from the program's span: exec operation -> daemon request -> the tool span.
        chain = [inside["name"]]
        span = inside
        while span.get("parentSpanId") and span["parentSpanId"] != tool_id:
            span = receiver.wait_for("spanId", span["parentSpanId"])
            assert span["traceId"] == trace_id
            chain.append(span["name"])
        assert span.get("parentSpanId") == tool_id, f"the chain {chain} does not reach the tool span"
        assert chain == ["inside-the-sandbox", "sandbox.exec", "POST /v1/sandboxes/{sandbox}/exec"], chain
    finally:
        # Later tests of the session find the global provider as it was.
        trace._TRACER_PROVIDER = previous
        try:
            tb.delete(f"thread-{tid}", force=True)
        finally:
            tb.close()
