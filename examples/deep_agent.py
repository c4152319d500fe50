"""A Deep Agent whose filesystem and `execute` tool live in a threadbox sandbox.

    python examples/deep_agent.py

Install (from the repository root): pip install -e python/threadbox -e "python/langchain-threadbox[examples]"

The model is scripted (no LLM key). With a real model pass e.g.
`model=init_chat_model("anthropic:claude-sonnet-4-5")` to `create_deep_agent` instead.
"""

from __future__ import annotations

import uuid

from deepagents import create_deep_agent
from langchain_core.messages import HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver

from langchain_threadbox import ThreadboxSandbox
from langchain_threadbox.testing import ScriptedChatModel, ScriptRule, call
from threadbox import Threadbox

STATS = """import statistics
data = [float(x) for x in open('/home/user/data.txt').read().split()]
print(f"n={len(data)} mean={statistics.mean(data):.2f} stdev={statistics.stdev(data):.2f}")
"""

SCRIPT = [
    ScriptRule(
        "analyse",
        [
            [call("write_file", file_path="/home/user/data.txt", content="3 1 4 1 5 9 2 6 5 3 5\n")],
            [call("write_file", file_path="/home/user/stats.py", content=STATS)],
            [call("execute", command="python3 /home/user/stats.py")],
            [call("ls", path="/home/user")],
        ],
        final="Analysis finished.",
    )
]


def main() -> None:
    tb = Threadbox()
    with tb.create(f"deep-agent-{uuid.uuid4().hex[:8]}") as sb:  # deleted at the end
        agent = create_deep_agent(
            model=ScriptedChatModel(rules=SCRIPT),
            backend=ThreadboxSandbox(sandbox=sb),
            checkpointer=InMemorySaver(),
        )
        out = agent.invoke(
            {"messages": [HumanMessage("Please analyse some numbers")]},
            {"configurable": {"thread_id": "deep-agent-demo"}},
        )
        for m in out["messages"]:
            if isinstance(m, ToolMessage):
                print(f"{m.name}: {str(m.content).strip()}")
        print(out["messages"][-1].content)
        stats = sb.exec(["python3", "/home/user/stats.py"]).stdout
        assert stats.startswith("n=11 mean=4.00"), stats
        print(f"(checked in the sandbox directly: {stats.strip()})")


if __name__ == "__main__":
    main()
