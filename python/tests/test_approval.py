"""Human approval through interrupt() with real graphs and a real daemon."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import Daemon, Names
from graph_helpers import build_graph
from langchain_core.messages import HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

import threadbox
from langchain_threadbox import ThreadboxToolkit, thread_sandbox_name
from threadbox import Threadbox

pytestmark = pytest.mark.daemon
HELPER = Path(__file__).with_name("graph_helpers.py")


def cfg(tid: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": tid}}


def _pause(tb: Threadbox, graph: Any, tid: str, text: str) -> dict[str, Any]:
    out = graph.invoke({"messages": [HumanMessage(text)]}, cfg(tid))
    (intr,) = out["__interrupt__"]
    # No side effect before the human answers: the thread's sandbox does not even exist.
    with pytest.raises(threadbox.SandboxNotFound):
        tb.get(thread_sandbox_name(tid))
    return dict(intr.value)


def _last_tool(out: dict[str, Any]) -> ToolMessage:
    return next(m for m in reversed(out["messages"]) if isinstance(m, ToolMessage))


def test_approve(tb: Threadbox, names: Names) -> None:
    graph = build_graph(ThreadboxToolkit(client=tb), InMemorySaver(), approval=True)
    tid = names.thread("approve")
    payload = _pause(tb, graph, tid, "compute primes")
    assert payload["tool"] == "run_python" and "sieve" in payload["code"]
    assert payload["allowed_decisions"] == ["approve", "reject", "edit"]
    out = graph.invoke(Command(resume="approve"), cfg(tid))
    msg = _last_tool(out)
    assert "168 primes" in msg.content and msg.artifact["approval"] == "approve"
    assert tb.get(thread_sandbox_name(tid)).files.exists("primes.json")


def test_reject(tb: Threadbox, names: Names) -> None:
    graph = build_graph(ThreadboxToolkit(client=tb), InMemorySaver(), approval=True)
    tid = names.thread("reject")
    _pause(tb, graph, tid, "compute primes")
    out = graph.invoke(Command(resume={"type": "reject", "message": "not now"}), cfg(tid))
    msg = _last_tool(out)
    assert "rejected" in msg.content and "not now" in msg.content and msg.artifact["rejected"] is True
    with pytest.raises(threadbox.SandboxNotFound):
        tb.get(thread_sandbox_name(tid))


def test_edit(tb: Threadbox, names: Names) -> None:
    graph = build_graph(ThreadboxToolkit(client=tb), InMemorySaver(), approval=True)
    tid = names.thread("edit")
    payload = _pause(tb, graph, tid, "shell id")
    assert payload["command"] == "id -u; pwd"
    out = graph.invoke(Command(resume={"type": "edit", "args": {"command": "echo edited"}}), cfg(tid))
    msg = _last_tool(out)
    assert str(msg.content).startswith("edited\n") and msg.artifact["edited_args"] == {"command": "echo edited"}


def test_resume_in_new_process(daemon: Daemon, names: Names, tmp_path: Path) -> None:
    db, tid = str(tmp_path / "approval.sqlite"), names.thread("newproc")
    base = [sys.executable, str(HELPER), "--url", daemon.url, "--db", db, "--thread", tid, "--approval"]

    def run(*args: str) -> dict[str, Any]:
        p = subprocess.run([*base, *args], capture_output=True, text=True, timeout=120, check=False)
        assert p.returncode == 0, p.stderr
        result: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
        return result

    first = run("--message", "write the note")
    assert first["interrupts"][0]["tool"] == "write_file" and first["tools"] == []
    second = run("--resume", json.dumps({"type": "approve"}))
    assert "Wrote 17 bytes" in second["tools"][0]["content"]
    with Threadbox(daemon.url) as tb:
        assert tb.get(thread_sandbox_name(tid)).files.read("notes/note.txt") == b"remember the milk"


# -- several calls in one AIMessage (P3) and bad resume values (P4) ----------------


def _scripted(toolkit: ThreadboxToolkit, plan: dict[str, list[tuple[str, dict[str, Any]]]]) -> Any:
    """The user trial's harness: an agent node that emits fixed calls in ONE AIMessage."""
    from uuid import uuid4

    from langchain_core.messages import AIMessage
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    from langchain_threadbox import with_approval

    def agent(state: MessagesState) -> dict[str, Any]:
        last = state["messages"][-1]
        if isinstance(last, HumanMessage):
            calls = [{"name": n, "args": a, "id": f"call_{uuid4().hex[:12]}"} for n, a in plan[str(last.content)]]
            return {"messages": [AIMessage("", tool_calls=calls)]}
        return {"messages": [AIMessage("done")]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode(with_approval(toolkit.get_tools())))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile(checkpointer=InMemorySaver())


COUNT = "echo run >> count.txt; wc -l < count.txt"


def _tool_messages(out: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in out["messages"] if isinstance(m, ToolMessage)]


@pytest.mark.parametrize("async_", [False, True])
async def test_two_calls_one_interrupt_each_runs_once(tb: Threadbox, names: Names, async_: bool) -> None:
    graph = _scripted(
        ThreadboxToolkit(client=tb, timeout=20),
        {"two": [("run_shell", {"command": COUNT}), ("run_shell", {"command": "echo 2"})]},
    )
    c = cfg(names.thread("two"))
    out = (
        await graph.ainvoke({"messages": [HumanMessage("two")]}, c)
        if async_
        else graph.invoke({"messages": [HumanMessage("two")]}, c)
    )
    (intr,) = out["__interrupt__"]
    reqs = intr.value["action_requests"]
    assert [r["args"]["command"] for r in reqs] == [COUNT, "echo 2"]
    assert len(intr.value["review_configs"]) == 2
    resume: Command[Any] = Command(resume="approve")
    out = await graph.ainvoke(resume, c) if async_ else graph.invoke(resume, c)
    assert "__interrupt__" not in out
    sb = tb.get(thread_sandbox_name(c["configurable"]["thread_id"]))
    assert sb.files.read("count.txt") == b"run\n", "the approved call ran exactly once"
    first, second = _tool_messages(out)
    assert str(first.content).startswith("1\n") and str(second.content).startswith("2\n")


def test_three_calls_mixed_decisions(tb: Threadbox, names: Names) -> None:
    graph = _scripted(
        ThreadboxToolkit(client=tb, timeout=20),
        {
            "three": [
                ("run_shell", {"command": COUNT}),
                ("write_file", {"path": "secret.txt", "content": "no"}),
                ("run_python", {"code": "print('original')"}),
            ]
        },
    )
    c = cfg(names.thread("three"))
    out = graph.invoke({"messages": [HumanMessage("three")]}, c)
    (intr,) = out["__interrupt__"]
    assert [r["name"] for r in intr.value["action_requests"]] == ["run_shell", "write_file", "run_python"]
    decisions = [
        {"type": "approve"},
        {"type": "reject", "message": "not that file"},
        {"type": "edit", "edited_action": {"name": "run_python", "args": {"code": "print('edited')"}}},
    ]
    out = graph.invoke(Command(resume={"decisions": decisions}), c)
    assert "__interrupt__" not in out
    shell, write, py = _tool_messages(out)
    assert str(shell.content).startswith("1\n") and shell.artifact["approval"] == "approve"
    assert "rejected" in write.content and "not that file" in write.content and write.artifact["rejected"]
    assert str(py.content).startswith("edited\n") and py.artifact["edited_args"] == {"code": "print('edited')"}
    sb = tb.get(thread_sandbox_name(c["configurable"]["thread_id"]))
    assert sb.files.read("count.txt") == b"run\n" and not sb.files.exists("secret.txt")


def test_decisions_by_call_id(tb: Threadbox, names: Names) -> None:
    graph = _scripted(
        ThreadboxToolkit(client=tb, timeout=20),
        {"ids": [("run_shell", {"command": "echo a"}), ("run_shell", {"command": "echo b"})]},
    )
    c = cfg(names.thread("ids"))
    (intr,) = graph.invoke({"messages": [HumanMessage("ids")]}, c)["__interrupt__"]
    a, b = (r["id"] for r in intr.value["action_requests"])
    out = graph.invoke(Command(resume={a: "reject", b: "approve"}), c)
    ra, rb = _tool_messages(out)
    assert ra.artifact["rejected"] and str(rb.content).startswith("b\n")


def test_a_bad_resume_value_asks_again_and_never_wedges(tb: Threadbox, names: Names) -> None:
    graph = _scripted(ThreadboxToolkit(client=tb, timeout=20), {"hello": [("run_python", {"code": "print('hi')"})]})
    c = cfg(names.thread("wedge"))
    graph.invoke({"messages": [HumanMessage("hello")]}, c)
    out = graph.invoke(Command(resume="lgtm"), c)  # a UI typo
    (intr,) = out["__interrupt__"]
    assert "unrecognized approval decision 'lgtm'" in intr.value["error"]
    assert intr.value["code"] == "print('hi')", "the same question again"
    out = graph.invoke(None, c)  # re-running without an answer only asks again
    (intr2,) = out["__interrupt__"]
    assert "error" in intr2.value
    out = graph.invoke(Command(resume={"decisions": [1, 2]}), c)  # wrong count: asked again
    assert "2 decisions were given for 1" in out["__interrupt__"][0].value["error"]
    out = graph.invoke(Command(resume="approve"), c)
    assert "__interrupt__" not in out
    (msg,) = _tool_messages(out)
    assert str(msg.content).startswith("hi\n")


def test_a_bad_edit_asks_again(tb: Threadbox, names: Names) -> None:
    graph = _scripted(ThreadboxToolkit(client=tb, timeout=20), {"edit": [("run_shell", {"command": "echo x"})]})
    c = cfg(names.thread("badedit"))
    graph.invoke({"messages": [HumanMessage("edit")]}, c)
    out = graph.invoke(Command(resume={"type": "edit", "args": {"command": 42}}), c)
    assert "edited arguments for run_shell are invalid" in out["__interrupt__"][0].value["error"]
    out = graph.invoke(Command(resume={"type": "edit", "args": {"command": "echo fixed"}}), c)
    (msg,) = _tool_messages(out)
    assert str(msg.content).startswith("fixed\n")


def test_create_agent_runs_each_approved_call_once(tb: Threadbox, names: Names) -> None:
    """create_agent runs each call as its own task: one interrupt per call, each listing the message."""
    from langchain.agents import create_agent

    from langchain_threadbox import with_approval
    from langchain_threadbox.testing import ScriptedChatModel, ScriptRule, call

    model = ScriptedChatModel(
        rules=[ScriptRule("two", [[call("run_shell", command=COUNT), call("run_shell", command="echo 2")]])]
    )
    agent: Any = create_agent(
        model, with_approval(ThreadboxToolkit(client=tb).get_tools()), checkpointer=InMemorySaver()
    )
    c = cfg(names.thread("agent"))
    out = agent.invoke({"messages": [HumanMessage("two")]}, c)
    interrupts = out["__interrupt__"]
    assert [len(i.value["action_requests"]) for i in interrupts] == [2, 2]
    decisions = {"decisions": [{"type": "approve"}, {"type": "reject", "message": "no"}]}
    out = agent.invoke(Command(resume={i.id: decisions for i in interrupts}), c)
    assert "__interrupt__" not in out
    first, second = _tool_messages(out)
    assert str(first.content).startswith("1\n") and second.artifact["rejected"] is True
    assert tb.get(thread_sandbox_name(c["configurable"]["thread_id"])).files.read("count.txt") == b"run\n"
