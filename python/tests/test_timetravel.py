"""LangGraph time travel moves the thread's sandbox too (issue 14 scope 8, ADR 0115).

A real graph (scripted model, the toolkit's tools, ``ToolNode``) on a live daemon: turn 1
writes ``report.txt``, turn 2 overwrites it; resuming from turn 1's checkpoint sees turn
1's file; a copy of the thread (LangGraph's ``copy_thread``) resumed from turn 1 gets its
own sandbox, forked, with turn 1's file while the original keeps turn 2's. Sync with
InMemorySaver and SqliteSaver (and a second saver on the same database, as another
process would be), async with InMemorySaver.
"""

from __future__ import annotations

import asyncio
import logging
import operator
import sqlite3
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from conftest import Names
from graph_helpers import build_graph, turn_summary
from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

from langchain_threadbox import ClientFactory, ThreadboxToolkit, ThreadSandboxes, thread_sandbox_name
from langchain_threadbox.testing import ScriptRule, call
from langchain_threadbox.timetravel import BASE_LABEL, META_KEY, TimeTravelSaver, checkpoint_label
from threadbox import AsyncThreadbox, NotFound, Threadbox, ThreadboxError

pytestmark = pytest.mark.daemon

ONE, TWO = "ALPHA-turn-one", "BRAVO-turn-two"
RULES = [
    ScriptRule("turn one", [[call("write_file", path="report.txt", content=ONE)]]),
    ScriptRule("turn two", [[call("write_file", path="report.txt", content=TWO)]]),
    ScriptRule("read it", [[call("read_file", path="report.txt")]], final="{last}"),
    ScriptRule("just talk", []),
]
REPORT = "/home/user/report.txt"


class FanState(TypedDict):
    done: Annotated[list[str], operator.add]


def cfg(tid: str, checkpoint_id: str | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": tid}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def turn(graph: Any, config: dict[str, Any], text: str) -> dict[str, Any]:
    before = len(graph.get_state(config).values.get("messages", []))
    return turn_summary(graph.invoke({"messages": [HumanMessage(text)]}, config), before)


def head(graph: Any, tid: str) -> str:
    """The thread's latest LangGraph checkpoint id."""
    return str(graph.get_state(cfg(tid)).config["configurable"]["checkpoint_id"])


def lg_labels(tb: Threadbox, tid: str) -> list[str]:
    sb = tb.get(thread_sandbox_name(tid))
    return [c.label for c in sb.checkpoints() if c.label and c.label.startswith("lg-")]


def read(tb: Threadbox, tid: str) -> bytes:
    return tb.get(thread_sandbox_name(tid)).files.read(REPORT)


def _graph(tb: Threadbox, inner: Any, **kw: Any) -> tuple[Any, TimeTravelSaver]:
    saver = TimeTravelSaver(inner, ThreadSandboxes(ClientFactory(tb)), **kw)
    return build_graph(ThreadboxToolkit(binding=saver.sandboxes), saver, rules=RULES), saver


def _two_turns(graph: Any, tb: Threadbox, tid: str) -> str:
    """Turn 1 writes ONE, a turn that does not touch the sandbox, turn 2 writes TWO;
    returns turn 1's last checkpoint id."""
    turn(graph, cfg(tid), "turn one")
    assert read(tb, tid) == ONE.encode()
    t1 = head(graph, tid)
    labels = lg_labels(tb, tid)
    assert labels[0] == BASE_LABEL and len(labels) == 2, labels
    turn(graph, cfg(tid), "just talk")
    assert lg_labels(tb, tid) == labels, "a turn that did not touch the sandbox took a checkpoint"
    turn(graph, cfg(tid), "turn two")
    assert read(tb, tid) == TWO.encode()
    assert len(lg_labels(tb, tid)) == 3
    return t1


def test_resume_and_fork_follow_the_graph_sync(tb: Threadbox, names: Names) -> None:
    graph, saver = _graph(tb, InMemorySaver())
    tid, tid2 = names.thread("tt"), names.thread("tt2")
    t1 = _two_turns(graph, tb, tid)
    t2 = head(graph, tid)
    # The step that wrote names its sandbox checkpoint in LangGraph's metadata.
    marks = [s.metadata[META_KEY] for s in graph.get_state_history(cfg(tid)) if META_KEY in (s.metadata or {})]
    assert [m["sandbox"] for m in marks] == [thread_sandbox_name(tid)] * 2
    assert {m["checkpoint"] for m in marks} <= set(lg_labels(tb, tid))
    sb_id = tb.get(thread_sandbox_name(tid)).id

    # A fork of turn 1 into a new thread: its own sandbox with turn 1's file.
    saver.copy_thread(tid, tid2)
    with pytest.raises(NotFound):
        tb.get(thread_sandbox_name(tid2))
    r = turn(graph, cfg(tid2, t1), "read it")
    assert ONE in r["last"] and TWO not in r["last"], r
    fork = tb.get(thread_sandbox_name(tid2))
    assert fork.id != sb_id
    assert fork.labels["langchain-thread"] == tid2, fork.labels
    assert read(tb, tid) == TWO.encode(), "the original thread keeps turn 2's file"
    # The fork goes on by itself.
    turn(graph, cfg(tid2), "turn two")
    assert read(tb, tid2) == TWO.encode()

    # Resuming the original thread from turn 1: same sandbox, turn 1's file.
    r = turn(graph, cfg(tid, t1), "read it")
    assert ONE in r["last"] and TWO not in r["last"], r
    assert tb.get(thread_sandbox_name(tid)).id == sb_id
    assert read(tb, tid) == ONE.encode()
    # The branch is now the thread's head: the next turn stays on it.
    r = turn(graph, cfg(tid), "read it")
    assert ONE in r["last"], r
    # And forward again to turn 2's checkpoint.
    r = turn(graph, cfg(tid, t2), "read it")
    assert TWO in r["last"], r


def test_sqlite_and_a_second_process(tb: Threadbox, names: Names, tmp_path: Path) -> None:
    db = tmp_path / "graph.db"
    tid = names.thread("sq")
    conn = sqlite3.connect(db, check_same_thread=False)
    try:
        graph, _ = _graph(tb, SqliteSaver(conn))
        t1 = _two_turns(graph, tb, tid)
    finally:
        conn.close()
    # Another process: a new saver on the same database knows nothing of the disk.
    conn = sqlite3.connect(db, check_same_thread=False)
    try:
        graph, _ = _graph(tb, SqliteSaver(conn))
        r = turn(graph, cfg(tid), "read it")
        assert TWO in r["last"], r
        r = turn(graph, cfg(tid, t1), "read it")
        assert ONE in r["last"] and TWO not in r["last"], r
    finally:
        conn.close()
    conn = sqlite3.connect(db, check_same_thread=False)
    try:
        # A third one resumes the thread's head (the branch from turn 1): no rewind needed.
        graph, _ = _graph(tb, SqliteSaver(conn))
        before = tb.get(thread_sandbox_name(tid)).checkpoints()
        r = turn(graph, cfg(tid), "read it")
        assert ONE in r["last"], r
        assert tb.get(thread_sandbox_name(tid)).checkpoints() == before
    finally:
        conn.close()


def test_resume_and_fork_follow_the_graph_async(daemon_url: str, tb: Threadbox, names: Names) -> None:
    tid, tid2 = names.thread("at"), names.thread("at2")

    async def main() -> None:
        async with AsyncThreadbox(daemon_url) as atb:
            saver = TimeTravelSaver(InMemorySaver(), ThreadSandboxes(ClientFactory(tb, async_client=atb)))
            graph = build_graph(ThreadboxToolkit(binding=saver.sandboxes), saver, rules=RULES)

            async def aturn(config: dict[str, Any], text: str) -> dict[str, Any]:
                before = len((await graph.aget_state(config)).values.get("messages", []))
                return turn_summary(await graph.ainvoke({"messages": [HumanMessage(text)]}, config), before)

            await aturn(cfg(tid), "turn one")
            t1 = (await graph.aget_state(cfg(tid))).config["configurable"]["checkpoint_id"]
            await aturn(cfg(tid), "just talk")
            await aturn(cfg(tid), "turn two")
            assert len(lg_labels(tb, tid)) == 3
            await saver.acopy_thread(tid, tid2)
            r = await aturn(cfg(tid2, t1), "read it")
            assert ONE in r["last"] and TWO not in r["last"], r
            assert read(tb, tid) == TWO.encode()
            r = await aturn(cfg(tid, t1), "read it")
            assert ONE in r["last"] and TWO not in r["last"], r

    asyncio.run(main())


def test_bound_missing_checkpoint_and_delete_thread(
    tb: Threadbox, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    graph, saver = _graph(tb, InMemorySaver(), max_checkpoints=2)
    tid = names.thread("bd")
    t1 = _two_turns(graph, tb, tid)
    turn(graph, cfg(tid), "turn one")
    # The bound: the oldest lg- checkpoint went, lg-base stays.
    labels = lg_labels(tb, tid)
    assert labels[0] == BASE_LABEL and len(labels) == 3, labels
    # Turn 1's sandbox checkpoint is gone: resuming there warns and falls back to the
    # nearest older point (the empty disk).
    assert checkpoint_label(t1) not in labels
    with caplog.at_level(logging.WARNING, logger="langchain_threadbox.timetravel"):
        r = turn(graph, cfg(tid, t1), "read it")
    assert ONE not in r["last"] and TWO not in r["last"], r
    assert any("pruned" in m for m in caplog.messages), caplog.messages
    # delete_thread: the graph's checkpoints and the sandbox's lg- ones go, files stay.
    saver.delete_thread(tid)
    assert lg_labels(tb, tid) == []
    assert graph.get_state(cfg(tid)).values == {}


def test_fork_by_exact_name_from_a_checkpoint(tb: Threadbox, names: Names) -> None:
    """What the saver forks with: ``fork(names=[...], checkpoint=label)``."""
    sb = tb.create(names.new("fk"), labels={"kind": "a", "keep": "yes"})
    sb.files.write(REPORT, ONE.encode())
    sb.checkpoint("one")
    sb.files.write(REPORT, TWO.encode())
    (fork,) = sb.fork(names=[names.new("fk-into")], checkpoint="one", labels={"kind": "b"})
    assert fork.name == names.names[-1] and fork.state == "running"
    assert fork.labels == {"kind": "b", "keep": "yes"}
    assert fork.files.read(REPORT) == ONE.encode()
    assert sb.files.read(REPORT) == TWO.encode()
    assert [c.label for c in sb.checkpoints()] == ["one"], "the checkpoint forked from is kept"
    with pytest.raises(ThreadboxError) as e:
        sb.fork(names=["a", "a"])
    assert e.value.code == "invalid_argument"
    with pytest.raises(NotFound):
        sb.fork(names=[names.new("fk-x")], checkpoint="nope")
    with pytest.raises(NotFound):
        tb.get(names.names[-1])


def test_send_fan_out_shares_the_sandbox_and_one_checkpoint(tb: Threadbox, names: Names) -> None:
    """What happens with parallel branches (ADR 0115): the ``Send`` branches of one step
    write into the thread's one sandbox, and the step takes one sandbox checkpoint."""
    saver = TimeTravelSaver(InMemorySaver(), ThreadSandboxes(ClientFactory(tb)))
    toolkit = ThreadboxToolkit(binding=saver.sandboxes)

    def worker(arg: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
        sb = toolkit.sandbox_for(config)
        sb.files.write(f"/home/user/branch-{arg['i']}.txt", str(arg["i"]).encode())
        return {"done": [str(arg["i"])]}

    g: Any = StateGraph(FanState)
    g.add_node("worker", worker)
    g.add_conditional_edges(START, lambda s: [Send("worker", {"i": i}) for i in range(3)])
    g.add_edge("worker", END)
    graph = g.compile(checkpointer=saver)
    tid = names.thread("fan")
    out = graph.invoke({"done": []}, cfg(tid))
    assert sorted(out["done"]) == ["0", "1", "2"]
    labels = lg_labels(tb, tid)
    assert labels[0] == BASE_LABEL and len(labels) == 2, labels
    sb = tb.get(thread_sandbox_name(tid))
    assert sorted(e.name for e in sb.files.list("/home/user") if e.name.startswith("branch-")) == [
        "branch-0.txt",
        "branch-1.txt",
        "branch-2.txt",
    ]


def test_deep_agents_backend_follows_time_travel(tb: Threadbox, names: Names) -> None:
    """``ThreadboxSandbox(binding=saver.sandboxes)``: a Deep Agent's sandbox rewinds too."""
    pytest.importorskip("deepagents")
    from deepagents import create_deep_agent

    from langchain_threadbox import ThreadboxSandbox
    from langchain_threadbox.testing import ScriptedChatModel

    rules = [
        ScriptRule("turn one", [[call("execute", command=f"printf {ONE} > {REPORT}")]]),
        ScriptRule("turn two", [[call("execute", command=f"printf {TWO} > {REPORT}")]]),
        ScriptRule("read it", [[call("execute", command=f"cat {REPORT}")]], final="{last}"),
    ]
    saver = TimeTravelSaver(InMemorySaver(), ThreadSandboxes(ClientFactory(tb)))
    agent: Any = create_deep_agent(
        model=ScriptedChatModel(rules=rules),
        backend=ThreadboxSandbox(binding=saver.sandboxes),
        checkpointer=saver,
    )
    tid = names.thread("da")
    turn(agent, cfg(tid), "turn one")
    t1 = head(agent, tid)
    turn(agent, cfg(tid), "turn two")
    assert read(tb, tid) == TWO.encode()
    r = turn(agent, cfg(tid, t1), "read it")
    assert ONE in str(r["last"]) and TWO not in str(r["last"]), r


class _CrashingPut(InMemorySaver):
    """Fails the first put that names a sandbox checkpoint: a crash between the sandbox
    checkpoint and LangGraph's checkpoint (ADR 0115)."""

    crashed = False

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        if META_KEY in metadata and not self.crashed:
            self.crashed = True
            raise RuntimeError("crash before LangGraph's put")
        return super().put(config, checkpoint, metadata, new_versions)


@pytest.mark.parametrize("same_process", [True, False], ids=["same-process", "new-process"])
def test_crash_between_the_sandbox_checkpoint_and_langgraphs_put(
    tb: Threadbox, names: Names, same_process: bool
) -> None:
    """LangGraph's saver is the truth: the resumed run finishes the step from what it
    stored; the disk is not changed twice (one ``X``), and the step's checkpoint as
    LangGraph saves it now names a sandbox checkpoint (not the orphan)."""
    rules = [ScriptRule("append", [[call("run_shell", command="echo X >> log.txt; cat log.txt")]], final="{last}")]
    inner = _CrashingPut()
    saver = TimeTravelSaver(inner, ThreadSandboxes(ClientFactory(tb)))
    graph = build_graph(ThreadboxToolkit(binding=saver.sandboxes), saver, rules=rules)
    tid = names.thread("cr")
    with pytest.raises(RuntimeError, match="crash before"):
        graph.invoke({"messages": [HumanMessage("append")]}, cfg(tid))
    assert inner.crashed
    orphan = lg_labels(tb, tid)[-1]
    assert tb.get(thread_sandbox_name(tid)).files.read("/home/user/log.txt") == b"X\n"
    if not same_process:
        saver = TimeTravelSaver(inner, ThreadSandboxes(ClientFactory(tb)))
        graph = build_graph(ThreadboxToolkit(binding=saver.sandboxes), saver, rules=rules)
    out = graph.invoke(None, cfg(tid))
    assert tb.get(thread_sandbox_name(tid)).files.read("/home/user/log.txt") == b"X\n"
    assert "X" in str(out["messages"][-1].content)
    marks = {s.metadata[META_KEY]["checkpoint"] for s in graph.get_state_history(cfg(tid)) if META_KEY in s.metadata}
    assert len(marks) == 1 and orphan not in marks, "no LangGraph checkpoint names the orphan"


def test_durability_exit_and_sync(tb: Threadbox, names: Names, caplog: pytest.LogCaptureFixture) -> None:
    """``durability="exit"`` saves only at the end (the dirty run takes one checkpoint
    then, and no tool call waits for a put that comes later); ``"sync"`` as "async"."""
    graph, _ = _graph(tb, InMemorySaver())
    tid = names.thread("du")
    with caplog.at_level(logging.WARNING, logger="langchain_threadbox.timetravel"):
        graph.invoke({"messages": [HumanMessage("turn one")]}, cfg(tid), durability="exit")
    assert not [m for m in caplog.messages if "was not saved" in m], caplog.messages
    assert read(tb, tid) == ONE.encode() and len(lg_labels(tb, tid)) == 2
    t1 = head(graph, tid)
    graph.invoke({"messages": [HumanMessage("turn two")]}, cfg(tid), durability="sync")
    assert read(tb, tid) == TWO.encode() and len(lg_labels(tb, tid)) == 3
    out = graph.invoke({"messages": [HumanMessage("read it")]}, cfg(tid, t1), durability="sync")
    assert ONE in str(out["messages"][-1].content), out["messages"][-1]
