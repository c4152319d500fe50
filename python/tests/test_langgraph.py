"""The LangChain integration in real LangGraph graphs against a real daemon."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Daemon, Names
from graph_helpers import build_graph, turn_summary
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver

import threadbox
from langchain_threadbox import ThreadboxToolkit, release_thread_sandbox, thread_sandbox_name
from langchain_threadbox.testing import ScriptedChatModel, ScriptRule, call
from threadbox import Threadbox

pytestmark = pytest.mark.daemon
HELPER = Path(__file__).with_name("graph_helpers.py")


def cfg(tid: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": tid}}


def turn(graph: Any, tid: str, text: str) -> dict[str, Any]:
    before = len(graph.get_state(cfg(tid)).values.get("messages", []))
    return turn_summary(graph.invoke({"messages": [HumanMessage(text)]}, cfg(tid)), before)


def test_threads_are_isolated_and_files_persist(tb: Threadbox, names: Names) -> None:
    graph = build_graph(ThreadboxToolkit(client=tb, timeout=30), InMemorySaver())
    t1, t2 = names.thread("iso1"), names.thread("iso2")
    r = turn(graph, t1, "please write the note")
    assert r["tools"][0]["status"] == "success" and "Wrote 17 bytes" in r["tools"][0]["content"]
    r = turn(graph, t1, "now read the note")
    assert r["tools"][0]["content"] == "remember the milk"
    r = turn(graph, t1, "list notes")
    assert "note.txt" in r["tools"][0]["content"]
    r = turn(graph, t2, "read the note")
    assert "no such file" in r["tools"][0]["content"]
    a, b = tb.get(thread_sandbox_name(t1)), tb.get(thread_sandbox_name(t2))
    assert a.id != b.id
    assert a.labels.get("langchain-thread") == t1


def test_codeact_primes_and_exit_codes(tb: Threadbox, names: Names) -> None:
    graph = build_graph(ThreadboxToolkit(client=tb, timeout=60), InMemorySaver())
    tid = names.thread("primes")
    r = turn(graph, tid, "compute primes")
    assert "168 primes, the last is 997" in r["tools"][0]["content"]
    assert r["tools"][0]["artifact"]["exit_code"] == 0
    r = turn(graph, tid, "count primes")
    assert r["tools"][0]["content"].startswith("168")
    r = turn(graph, tid, "fail please")
    tool = r["tools"][0]
    assert tool["status"] == "success" and "partial" in tool["content"] and "[exit code 3]" in tool["content"]
    assert tool["artifact"]["exit_code"] == 3 and tool["artifact"]["timed_out"] is False
    r = turn(graph, tid, "shell id")
    assert r["tools"][0]["content"].startswith("1000\n/home/user")
    r = turn(graph, tid, "two steps")
    assert [t["name"] for t in r["tools"]] == ["run_shell", "read_file"] and r["tools"][1]["content"] == "one\n"


def test_timeout_returns_a_message(tb: Threadbox, names: Names) -> None:
    graph = build_graph(ThreadboxToolkit(client=tb, timeout=2), InMemorySaver())
    t0 = time.monotonic()
    r = turn(graph, names.thread("spin"), "spin forever")
    assert time.monotonic() - t0 < 30
    tool = r["tools"][0]
    assert "timed out after 2s" in tool["content"] and "spinning" in tool["content"]
    assert tool["artifact"]["timed_out"] is True


def test_long_output_is_cut_for_the_model(tb: Threadbox, names: Names) -> None:
    rules = [ScriptRule("big", [[call("run_python", code="print('A' * 100000); print('THE END')")]])]
    graph = build_graph(ThreadboxToolkit(client=tb, max_output_chars=2000), InMemorySaver(), rules=rules)
    tool = turn(graph, names.thread("big"), "big output")["tools"][0]
    assert len(tool["content"]) < 2500 and "characters cut here" in tool["content"] and "THE END" in tool["content"]
    assert tool["artifact"]["truncated"] is True


def test_sqlite_checkpointer_and_new_process(daemon: Daemon, tb: Threadbox, names: Names, tmp_path: Path) -> None:
    db = tmp_path / "cp.sqlite"
    tid = names.thread("sqlite")
    conn = sqlite3.connect(db, check_same_thread=False)
    graph = build_graph(ThreadboxToolkit(client=tb), SqliteSaver(conn))
    assert "Wrote" in turn(graph, tid, "write the note")["tools"][0]["content"]
    conn.close()
    sandbox_id = tb.get(thread_sandbox_name(tid)).id
    # The next turn happens in a brand-new process that only has the SQLite file.
    out = subprocess.run(
        [
            sys.executable,
            str(HELPER),
            "--url",
            daemon.url,
            "--db",
            str(db),
            "--thread",
            tid,
            "--message",
            "read the note",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["tools"][0]["content"] == "remember the milk"
    assert r["tools"][0]["artifact"]["sandbox_id"] == sandbox_id  # found by name, not recreated


def test_daemon_kill9_between_turns(
    daemon: Daemon, restart_daemon: Callable[[], None], tb: Threadbox, names: Names
) -> None:
    graph = build_graph(ThreadboxToolkit(client=tb), InMemorySaver())
    tid = names.thread("restart")
    turn(graph, tid, "write the note")
    turn(graph, tid, "compute primes")
    before = tb.get(thread_sandbox_name(tid))
    restart_daemon()
    after = tb.get(thread_sandbox_name(tid))
    assert after.id == before.id
    r = turn(graph, tid, "read the note")
    assert r["tools"][0]["content"] == "remember the milk"
    r = turn(graph, tid, "count primes")
    assert r["tools"][0]["content"].startswith("168")


def test_release_thread_stop_and_delete(tb: Threadbox, names: Names) -> None:
    toolkit = ThreadboxToolkit(client=tb)
    graph = build_graph(toolkit, InMemorySaver())
    tid = names.thread("release")
    turn(graph, tid, "write the note")
    assert toolkit.release_thread(tid, action="stop")
    assert tb.get(thread_sandbox_name(tid)).state == "stopped"
    # The next turn starts the stopped sandbox again: same files.
    assert turn(graph, tid, "read the note")["tools"][0]["content"] == "remember the milk"
    assert release_thread_sandbox(tid, client=tb)
    with pytest.raises(threadbox.SandboxNotFound):
        tb.get(thread_sandbox_name(tid))
    assert not release_thread_sandbox(tid, client=tb)


def test_release_thread_pause_keeps_processes(tb: Threadbox, names: Names) -> None:
    toolkit = ThreadboxToolkit(client=tb)
    graph = build_graph(toolkit, InMemorySaver())
    tid = names.thread("release-pause")
    turn(graph, tid, "write the note")
    sb = tb.get(thread_sandbox_name(tid))
    proc = sb.processes.start("sleep 300")
    assert toolkit.release_thread(tid, action="pause")
    assert tb.get(thread_sandbox_name(tid)).state == "paused"
    # The next turn resumes it: the files and the process started before are still there.
    assert turn(graph, tid, "read the note")["tools"][0]["content"] == "remember the milk"
    assert tb.get(thread_sandbox_name(tid)).state == "running"
    assert any(q.id == proc.id and q.running for q in sb.processes.list())


def test_paused_sandbox_is_resumed(tb: Threadbox, names: Names) -> None:
    graph = build_graph(ThreadboxToolkit(client=tb), InMemorySaver())
    tid = names.thread("paused")
    turn(graph, tid, "write the note")
    tb.get(thread_sandbox_name(tid)).pause()
    assert turn(graph, tid, "read the note")["tools"][0]["content"] == "remember the milk"


async def test_async_graph(tb: Threadbox, names: Names) -> None:
    graph = build_graph(ThreadboxToolkit(client=tb), InMemorySaver())
    t1, t2 = names.thread("async1"), names.thread("async2")

    async def aturn(tid: str, text: str) -> dict[str, Any]:
        before = len((await graph.aget_state(cfg(tid))).values.get("messages", []))
        return turn_summary(await graph.ainvoke({"messages": [HumanMessage(text)]}, cfg(tid)), before)

    import asyncio

    await asyncio.gather(aturn(t1, "write the note"), aturn(t2, "compute primes"))
    r1, r2 = await asyncio.gather(aturn(t1, "read the note"), aturn(t2, "read the note"))
    assert r1["tools"][0]["content"] == "remember the milk"
    assert "no such file" in r2["tools"][0]["content"]


def test_create_agent(tb: Threadbox, names: Names) -> None:
    from langchain.agents import create_agent

    toolkit = ThreadboxToolkit(client=tb)
    model = ScriptedChatModel(rules=[ScriptRule("go", [[call("run_python", code="print(6*7)")]], final="ok {last}")])
    agent: Any = create_agent(model, toolkit.get_tools(), checkpointer=InMemorySaver())
    tid = names.thread("agent")
    out = agent.invoke({"messages": [HumanMessage("go")]}, cfg(tid))
    assert out["messages"][-1].content.startswith("ok 42")


def test_fixed_sandbox_binding(tb: Threadbox, names: Names) -> None:
    sb = tb.create(names.new("fixed"))
    tools = {t.name: t for t in ThreadboxToolkit(client=tb, sandbox=sb).get_tools()}
    tools["write_file"].invoke({"path": "f.txt", "content": "x"})
    assert sb.files.read("f.txt") == b"x"
    name = names.new("fixed-lazy")
    lazy = {t.name: t for t in ThreadboxToolkit(client=tb, sandbox=name, create=True).get_tools()}
    assert lazy["run_shell"].invoke({"command": "echo hi"}).startswith("hi")
    assert tb.get(name).created is False
