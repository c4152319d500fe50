"""The ``PythonREPLTool`` drop-in and ``reset_python`` (issue 15, ADR 0086) in a LangGraph
graph with a scripted model, against a real daemon: the seed guide's swap is one import,
the tool keeps its globals between calls (in the thread's sandbox, not the host), each
thread has its own session, and ``reset_python`` starts it afresh."""

from __future__ import annotations

import os
from typing import Any

import pytest
from conftest import Names
from graph_helpers import turn_summary
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from langchain_threadbox import PythonREPLTool, ThreadboxToolkit
from langchain_threadbox.testing import ScriptedChatModel, ScriptRule, call
from threadbox import Threadbox

pytestmark = pytest.mark.daemon

RULES = [
    ScriptRule("remember", [[call("Python_REPL", query="```python\nimport os\nsecret = 6 * 7\nos.getpid()\n```")]]),
    ScriptRule("recall", [[call("Python_REPL", query="print(secret)")]]),
    ScriptRule("forget", [[call("reset_python")]]),
    ScriptRule("where am i", [[call("Python_REPL", query="os.getuid()")]]),
]


def build(tools: list[Any]) -> Any:
    model = ScriptedChatModel(rules=RULES).bind_tools(tools)

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode(tools))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile(checkpointer=InMemorySaver())


def turn(graph: Any, tid: str, text: str) -> dict[str, Any]:
    c = {"configurable": {"thread_id": tid}}
    before = len(graph.get_state(c).values.get("messages", []))
    out = turn_summary(graph.invoke({"messages": [HumanMessage(text)]}, c), before)
    tool: dict[str, Any] = out["tools"][-1]
    return tool


def test_drop_in_keeps_globals_per_thread_and_resets(tb: Threadbox, names: Names) -> None:
    toolkit = ThreadboxToolkit(client=tb, timeout=30, stateful=True)
    repl = PythonREPLTool(toolkit=toolkit)
    graph = build([repl, toolkit.reset_python])
    tid = names.thread("repl")

    r = turn(graph, tid, "remember")
    assert r["name"] == "Python_REPL" and r["artifact"]["status"] == "ok", r
    # Not the host process (langchain_experimental runs exec() in the caller).
    assert f"Out: {os.getpid()}" not in r["content"]
    r = turn(graph, tid, "recall")
    assert r["content"].startswith("42"), r
    r = turn(graph, tid, "where am i")
    assert "Out: 1000" in r["content"], "runs as the sandbox's user, not root on the host"

    # Another thread: another sandbox, another session.
    r = turn(graph, names.thread("repl-other"), "recall")
    assert "NameError" in r["content"] and r["artifact"]["status"] == "exception", r

    r = turn(graph, tid, "forget")
    assert r["name"] == "reset_python" and "restarted" in r["content"], r
    generation = r["artifact"]["generation"]
    assert generation >= 2, r
    r = turn(graph, tid, "recall")
    assert "NameError" in r["content"], "reset_python forgot the variables"
