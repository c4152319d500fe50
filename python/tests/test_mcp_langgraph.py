"""threadbox's MCP tools in a real LangGraph graph through ``langchain-mcp-adapters``
(which opens a new MCP session for every tool call), with a scripted model node; the
sandboxes on each isolation tier under test (issue 16).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from conftest import Daemon, Names, threadbox_bin
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_mcp_adapters.client import MultiServerMCPClient
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from langchain_threadbox.testing import ScriptedChatModel, ScriptRule, call

pytestmark = pytest.mark.daemon


def connections(daemon: Daemon, transport: str) -> dict[str, Any]:
    if transport == "stdio":
        return {
            "threadbox": {
                "transport": "stdio",
                "command": str(threadbox_bin()),
                "args": ["mcp"],
                "env": {"THREADBOX_URL": daemon.url, "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            }
        }
    return {"threadbox": {"transport": "streamable_http", "url": daemon.url + "/mcp"}}


def rules_for(sandbox: str, secret: str, on_tier: str = "jail") -> list[ScriptRule]:
    """Scripts naming one sandbox: the sandbox travels in the tool arguments."""
    return [
        # `call()` takes the tool's name as its first parameter, so `name` goes in a dict.
        ScriptRule(
            f"[{sandbox}] setup",
            [[{"name": "sandbox_create", "args": {"name": sandbox, "labels": {"graph": "mcp"}, "tier": on_tier}}]],
        ),
        ScriptRule(
            f"[{sandbox}] remember",
            [[call("write_file", sandbox=sandbox, path="secret.txt", content=secret)]],
        ),
        ScriptRule(f"[{sandbox}] recall", [[call("read_file", sandbox=sandbox, path="secret.txt")]]),
        ScriptRule(
            f"[{sandbox}] compute",
            [[call("run_python", sandbox=sandbox, code="print(sum(range(10)))")]],
        ),
        ScriptRule(f"[{sandbox}] fail", [[call("exec", sandbox=sandbox, command="exit 7")]]),
        ScriptRule(f"[{sandbox}] list", [[call("list_files", sandbox=sandbox)]]),
    ]


def build(tools: list[Any], rules: list[ScriptRule]) -> Any:
    model = ScriptedChatModel(rules=rules).bind_tools(tools)

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode(tools))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile(checkpointer=InMemorySaver())


async def turn(graph: Any, thread: str, text: str) -> ToolMessage:
    cfg = {"configurable": {"thread_id": thread}}
    before = len((await graph.aget_state(cfg)).values.get("messages", []))
    out = await graph.ainvoke({"messages": [HumanMessage(text)]}, cfg)
    tool_msgs = [m for m in out["messages"][before:] if isinstance(m, ToolMessage)]
    assert len(tool_msgs) == 1, out["messages"][before:]
    return tool_msgs[0]


@pytest.mark.parametrize("transport", ["stdio", "streamable_http"])
async def test_two_graph_threads_with_two_named_sandboxes_stay_isolated(
    daemon: Daemon, names: Names, transport: str, tier: str
) -> None:
    client = MultiServerMCPClient(connections(daemon, transport))
    tools = await client.get_tools()
    by_name = {t.name for t in tools}
    assert {"sandbox_create", "exec", "run_python", "read_file", "write_file"} <= by_name

    a, b = names.new("mcp-a"), names.new("mcp-b")
    graph = build(tools, rules_for(a, "alpha-secret", tier) + rules_for(b, "beta-secret", tier))

    for sb, thread in ((a, "thread-a"), (b, "thread-b")):
        m = await turn(graph, thread, f"[{sb}] setup")
        assert m.status == "success", m.content
        assert m.artifact is not None
        assert m.artifact["structured_content"]["sandbox"]["tier"] == tier

    m = await turn(graph, "thread-a", f"[{a}] remember")
    assert m.status == "success", m.content
    m = await turn(graph, "thread-b", f"[{b}] remember")
    assert m.status == "success", m.content

    # Each thread reads back its own secret, never the other's.
    m = await turn(graph, "thread-a", f"[{a}] recall")
    assert "alpha-secret" in str(m.content) and "beta-secret" not in str(m.content)
    m = await turn(graph, "thread-b", f"[{b}] recall")
    assert "beta-secret" in str(m.content) and "alpha-secret" not in str(m.content)

    # Code runs; structuredContent comes through as the artifact.
    m = await turn(graph, "thread-a", f"[{a}] compute")
    assert m.status == "success" and "45" in str(m.content)
    assert m.artifact is not None and m.artifact["structured_content"]["exit_code"] == 0

    # A non-zero exit is a successful tool call that reports the code.
    m = await turn(graph, "thread-b", f"[{b}] fail")
    assert m.status == "success", m.content
    assert m.artifact["structured_content"]["exit_code"] == 7

    # The sandboxes' disks are separate: b has only its own file.
    m = await turn(graph, "thread-b", f"[{b}] list")
    files = [e["name"] for e in m.artifact["structured_content"]["entries"]]
    assert files == ["secret.txt"]


async def test_tool_errors_reach_the_graph_as_error_messages(daemon: Daemon, names: Names) -> None:
    client = MultiServerMCPClient(connections(daemon, "streamable_http"))
    tools = await client.get_tools()
    ghost = names.new("mcp-ghost")  # never created
    graph = build(tools, rules_for(ghost, "x"))
    m = await turn(graph, "t", f"[{ghost}] recall")
    assert m.status == "error"
    assert "sandbox_create" in str(m.content)
