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
