"""CodeAct with LangGraph and threadbox: one sandbox per conversation thread.

Run against a daemon (THREADBOX_URL, default http://127.0.0.1:7420):

    python examples/codeact_graph.py

Install (from the repository root): pip install -e python/threadbox -e "python/langchain-threadbox[examples]"

The "model" is scripted so no LLM key is needed. To use a real model, replace the
`model = ...` line below with:

    model = init_chat_model("anthropic:claude-sonnet-4-5").bind_tools(tools)  # from langchain.chat_models
"""

from __future__ import annotations

import uuid
from typing import Any

from langchain_core.messages import HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from langchain_threadbox import ThreadboxToolkit
from langchain_threadbox.testing import ScriptedChatModel, ScriptRule, call

PRIMES = """
import json
n = 1_000_000
sieve = bytearray([1]) * n
sieve[0:2] = b"\\x00\\x00"
for i in range(2, int(n ** 0.5) + 1):
    if sieve[i]:
        sieve[i * i :: i] = bytearray(len(sieve[i * i :: i]))
primes = [i for i, v in enumerate(sieve) if v]
with open("primes.json", "w") as f:
    json.dump(primes, f)
print(f"{len(primes)} primes below {n:,}; the largest is {primes[-1]}")
"""

READ_BACK = """
import json
primes = json.load(open("primes.json"))
print(f"primes.json holds {len(primes)} primes, the last five: {primes[-5:]}")
"""

SCRIPT = [
    ScriptRule("primes below", [[call("run_python", code=PRIMES)]], final="{last}"),
    ScriptRule("read primes.json", [[call("run_python", code=READ_BACK)]], final="{last}"),
    ScriptRule("loop forever", [[call("run_python", code="while True:\n    pass")]], final="{last}"),
]


def main() -> None:
    toolkit = ThreadboxToolkit(timeout=20)  # each thread_id gets sandbox "thread-<id>"
    tools = toolkit.get_tools()
    model = ScriptedChatModel(rules=SCRIPT).bind_tools(tools)

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode(tools))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    graph = builder.compile(checkpointer=InMemorySaver())

    run = uuid.uuid4().hex[:8]
    thread1, thread2 = f"codeact-{run}-1", f"codeact-{run}-2"

    def ask(thread: str, text: str) -> ToolMessage:
        out = graph.invoke({"messages": [HumanMessage(text)]}, {"configurable": {"thread_id": thread}})
        tool_msg = next(m for m in reversed(out["messages"]) if isinstance(m, ToolMessage))
        print(f"[{thread}] user: {text}")
        print(f"[{thread}] tool: {str(tool_msg.content).strip()}")
        print(f"[{thread}] artifact: {tool_msg.artifact}\n")
        return tool_msg

    try:
        m = ask(thread1, "Compute the primes below 1,000,000 and save them to primes.json")
        assert m.artifact["exit_code"] == 0 and "78498 primes" in str(m.content)
        m = ask(thread1, "Now read primes.json back")
        assert "78498" in str(m.content)
        m = ask(thread2, "Please read primes.json")
        assert m.artifact["exit_code"] != 0 and "FileNotFoundError" in str(m.content)
        print("thread 2 does not see thread 1's files.\n")
        m = ask(thread2, "Run a loop forever")
        assert m.artifact["timed_out"] and "timed out" in str(m.content)
        print("the endless loop ended with a timeout message instead of hanging.")
    finally:
        for t in (thread1, thread2):
            toolkit.release_thread(t, action="delete")
        print("sandboxes deleted.")


if __name__ == "__main__":
    main()
