"""The stateful ``run_python`` (``ThreadboxToolkit(stateful=True)``) in a LangGraph graph with a
scripted model, against a real daemon: data loaded in turn 1 is used in turn 2, the sandbox
paused in between; images come back as image content blocks without bytes in the artifact."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Names
from graph_helpers import build_graph, turn_summary
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from langchain_threadbox import ThreadboxToolkit, thread_sandbox_name
from langchain_threadbox.testing import ScriptRule, call
from threadbox import Threadbox

pytestmark = pytest.mark.daemon

LOAD = "rows = [(i, i * i) for i in range(10)]\nlen(rows)"
USE = "sum(v for _, v in rows)"
PLOT = (
    "class Chart:\n"
    "    def _repr_png_(self):\n"
    "        import base64\n"
    "        return base64.b64decode('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk'"
    " 'YPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==')\n"
    "Chart()"
)

RULES = [
    ScriptRule("load the data", [[call("run_python", code=LOAD)]]),
    ScriptRule("sum the squares", [[call("run_python", code=USE)]]),
    ScriptRule("draw a chart", [[call("run_python", code=PLOT)]]),
]


def cfg(tid: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": tid}}


def turn(graph: Any, tid: str, text: str) -> dict[str, Any]:
    before = len(graph.get_state(cfg(tid)).values.get("messages", []))
    return turn_summary(graph.invoke({"messages": [HumanMessage(text)]}, cfg(tid)), before)


def test_variables_survive_turns_and_a_pause(tb: Threadbox, names: Names) -> None:
    graph = build_graph(ThreadboxToolkit(client=tb, timeout=30, stateful=True), InMemorySaver(), rules=RULES)
    tid = names.thread("stateful")
    r = turn(graph, tid, "load the data")
    assert "Out: 10" in r["tools"][0]["content"], r
    assert r["tools"][0]["artifact"]["status"] == "ok"
    sb = tb.get(thread_sandbox_name(tid))
    sb.pause()
    r = turn(graph, tid, "sum the squares")
    assert "Out: 285" in r["tools"][0]["content"], r
    assert r["tools"][0]["artifact"]["execution_count"] == 2

    r = turn(graph, tid, "draw a chart")
    content = r["tools"][0]["content"]
    assert isinstance(content, list), content
    assert content[0]["type"] == "text" and "image/png" in content[0]["text"]
    assert content[1]["type"] == "image" and content[1]["mime_type"] == "image/png"
    assert content[1]["base64"].startswith("iVBORw0KGgo")
    assert "iVBOR" not in repr(r["tools"][0]["artifact"]), "no image bytes in the artifact"

    # Another thread has its own sandbox and context.
    other = names.thread("stateful-other")
    r = turn(graph, other, "sum the squares")
    assert "NameError" in r["tools"][0]["content"], r


def test_images_none_sends_text_only(tb: Threadbox, names: Names) -> None:
    toolkit = ThreadboxToolkit(client=tb, timeout=30, stateful=True, images="none")
    graph = build_graph(toolkit, InMemorySaver(), rules=RULES)
    r = turn(graph, names.thread("noimg"), "draw a chart")
    content = r["tools"][0]["content"]
    assert isinstance(content, str) and "[image: image/png" in content and "not shown" in content
