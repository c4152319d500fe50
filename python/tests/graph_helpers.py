"""Graphs shared by the integration tests, and a CLI to run one turn in a new process.

    python graph_helpers.py --url URL --db FILE --thread T --message TEXT [--approval] [--resume JSON]

prints one JSON object: the last message, the tool messages of the turn and any interrupt.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from typing import Any

from langchain_core.messages import HumanMessage, ToolMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command

from langchain_threadbox import ThreadboxToolkit, with_approval
from langchain_threadbox.testing import ScriptedChatModel, ScriptRule, call
from threadbox import Threadbox

PRIMES = """
import json
n = 1000
sieve = bytearray([1]) * n
sieve[0:2] = b"\\x00\\x00"
for i in range(2, int(n ** 0.5) + 1):
    if sieve[i]:
        sieve[i * i :: i] = bytearray(len(sieve[i * i :: i]))
primes = [i for i, v in enumerate(sieve) if v]
json.dump(primes, open("primes.json", "w"))
print(len(primes), "primes, the last is", primes[-1])
"""

RULES = [
    ScriptRule("write the note", [[call("write_file", path="notes/note.txt", content="remember the milk")]]),
    ScriptRule("read the note", [[call("read_file", path="notes/note.txt")]]),
    ScriptRule("list notes", [[call("list_files", path="notes")]]),
    ScriptRule("compute primes", [[call("run_python", code=PRIMES)]]),
    ScriptRule("count primes", [[call("run_python", code="import json; print(len(json.load(open('primes.json'))))")]]),
    ScriptRule("fail please", [[call("run_python", code="import sys; print('partial'); sys.exit(3)")]]),
    ScriptRule("spin forever", [[call("run_python", code="print('spinning', flush=True)\nwhile True:\n    pass")]]),
    ScriptRule("shell id", [[call("run_shell", command="id -u; pwd")]]),
    ScriptRule("two steps", [[call("run_shell", command="echo one > step.txt")], [call("read_file", path="step.txt")]]),
]


def build_graph(
    toolkit: ThreadboxToolkit,
    checkpointer: BaseCheckpointSaver[Any],
    *,
    approval: bool = False,
    rules: list[ScriptRule] | None = None,
) -> Any:
    tools = toolkit.get_tools()
    if approval:
        tools = with_approval(tools)
    model = ScriptedChatModel(rules=rules or RULES).bind_tools(tools)

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode(tools))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile(checkpointer=checkpointer)


def turn_summary(out: dict[str, Any], before: int = 0) -> dict[str, Any]:
    msgs = out.get("messages", [])[before:]
    tools = [
        {"name": m.name, "content": m.content, "artifact": m.artifact, "status": m.status}
        for m in msgs
        if isinstance(m, ToolMessage)
    ]
    interrupts = [i.value for i in out.get("__interrupt__", [])]
    return {"last": msgs[-1].content if msgs else None, "tools": tools, "interrupts": interrupts}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--db", required=True)
    ap.add_argument("--thread", required=True)
    ap.add_argument("--message")
    ap.add_argument("--resume")
    ap.add_argument("--approval", action="store_true")
    ap.add_argument("--timeout", type=float, default=30)
    a = ap.parse_args()
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(a.db, check_same_thread=False)
    try:
        saver = SqliteSaver(conn)
        toolkit = ThreadboxToolkit(client=Threadbox(a.url), timeout=a.timeout)
        graph = build_graph(toolkit, saver, approval=a.approval)
        cfg = {"configurable": {"thread_id": a.thread}}
        before = len(graph.get_state(cfg).values.get("messages", []))
        if a.resume is not None:
            out = graph.invoke(Command(resume=json.loads(a.resume)), cfg)
        else:
            out = graph.invoke({"messages": [HumanMessage(a.message)]}, cfg)
        print(json.dumps(turn_summary(out, before), default=str))
    finally:
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
