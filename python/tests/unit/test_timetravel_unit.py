"""Offline tests of the time-travel checkpointer (ADR 0115): labels, the plan a walk
makes, and that a graph which never touches a sandbox makes no daemon call."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import httpx
import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph

from langchain_threadbox import ClientFactory, SandboxHistoryLost, ThreadSandboxes, TimeTravelSaver
from langchain_threadbox.timetravel import BASE_LABEL, _Mark, checkpoint_label
from threadbox import Threadbox


def test_labels_are_lg_plus_the_checkpoint_id() -> None:
    cid = "1f1edc47-a1c3-6774-800a-6c8190512af5"
    assert checkpoint_label(cid) == "lg-" + cid
    odd = checkpoint_label("a/b c")
    assert odd.startswith("lg-h") and len(odd) == 44 and odd == checkpoint_label("a/b c")


def _saver(on_missing: Any = "warn") -> TimeTravelSaver:
    return TimeTravelSaver(
        InMemorySaver(), ThreadSandboxes(ClientFactory(url="http://127.0.0.1:9")), on_missing=on_missing
    )


def test_plan_nearest_mark_own_other_base_fresh() -> None:
    s = _saver()
    own, other = "thread-a", "thread-b"
    m_own, m_other = _Mark("2", own, "lg-2"), _Mark("1", other, "lg-1")
    # The nearest mark that still exists wins: own -> rewind, another thread's -> fork.
    assert s._plan(own, "3", [m_own, m_other], {own: {"lg-2"}, other: {"lg-1"}}).kind == "rewind"
    act = s._plan(own, "3", [m_other], {own: None, other: {"lg-1"}})
    assert (act.kind, act.sandbox, act.label) == ("fork", other, "lg-1")
    # A pruned label falls back to an older mark, then to lg-base, then to a fresh sandbox.
    assert s._plan(own, "3", [m_own, m_other], {own: set(), other: {"lg-1"}}).kind == "fork"
    assert s._plan(own, "3", [m_own], {own: {BASE_LABEL}}).kind == "base"
    assert s._plan(own, "3", [], {own: None}).kind == "fresh"
    assert s._plan(own, "3", [], {own: set()}).kind == "keep"


def test_plan_raises_when_asked() -> None:
    s = _saver("raise")
    with pytest.raises(SandboxHistoryLost, match="pruned"):
        s._plan("thread-a", "3", [_Mark("2", "thread-a", "lg-2")], {"thread-a": {BASE_LABEL}})
    with pytest.raises(SandboxHistoryLost, match="deleted"):
        s._plan("thread-a", "3", [_Mark("1", "thread-b", "lg-1")], {"thread-a": None, "thread-b": None})


class S(TypedDict):
    n: Annotated[list[int], operator.add]


def test_a_graph_without_sandbox_calls_copies_threads_and_looks_once_per_process() -> None:
    calls: list[httpx.Request] = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(req)
        return httpx.Response(404, json={"error": {"code": "not_found", "message": "no such sandbox"}})

    tb = Threadbox("http://threadbox.test", transport=httpx.MockTransport(handler))
    saver = TimeTravelSaver(InMemorySaver(), ThreadSandboxes(ClientFactory(tb)))
    g: Any = StateGraph(S)
    g.add_node("step", lambda s: {"n": [len(s["n"])]})
    g.add_edge(START, "step")
    g.add_edge("step", END)
    graph = g.compile(checkpointer=saver)
    c = {"configurable": {"thread_id": "a"}}
    graph.invoke({"n": []}, c)
    first = graph.get_state(c).config
    graph.invoke({"n": []}, c)
    assert graph.get_state(c).values["n"] == [0, 1]
    # Time travel and a copy, still without a tool call: nothing to do on the sandbox.
    graph.invoke({"n": []}, first)
    saver.copy_thread("a", "b")
    cb = {"configurable": {"thread_id": "b"}}
    assert graph.get_state(cb).values == graph.get_state(c).values
    assert len(list(graph.get_state_history(cb))) == len(list(graph.get_state_history(c)))
    graph.invoke({"n": []}, cb)
    assert calls == []
    # Another process: one look per thread for a crash's leftover (there is no sandbox).
    again = TimeTravelSaver(saver.inner, ThreadSandboxes(ClientFactory(tb)))
    graph = g.compile(checkpointer=again)
    graph.invoke({"n": []}, c)
    graph.invoke({"n": []}, c)
    assert [(r.method, r.url.path) for r in calls] == [("GET", "/v1/sandboxes/thread-a")]
