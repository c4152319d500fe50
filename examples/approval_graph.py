"""Human approval before code runs, resumed in a *new process* from SQLite.

    python examples/approval_graph.py

Install (from the repository root): pip install -e python/threadbox -e "python/langchain-threadbox[examples]"

Phase 1 runs the graph until `interrupt()` asks for approval (nothing has touched the
sandbox yet) and exits. Phase 2 is started as a separate process: it opens the same
SQLite checkpoint, resumes with `Command(resume={"type": "approve"})`, and the code
runs. With a real model, replace the `model = ...` line with:

    model = init_chat_model("anthropic:claude-sonnet-4-5").bind_tools(tools)  # from langchain.chat_models
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from langchain_core.messages import HumanMessage, ToolMessage
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command

from langchain_threadbox import ThreadboxToolkit, with_approval
from langchain_threadbox.testing import ScriptedChatModel, ScriptRule, call

CODE = "import platform, os\nprint('hello from', platform.python_version(), 'as uid', os.getuid())"
SCRIPT = [ScriptRule("say hello", [[call("run_python", code=CODE)]], final="{last}")]


def build(conn: sqlite3.Connection, toolkit: ThreadboxToolkit) -> Any:
    tools = with_approval(toolkit.get_tools())  # every tool call asks first
    model = ScriptedChatModel(rules=SCRIPT).bind_tools(tools)

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode(tools))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=SqliteSaver(conn))


def phase1(db: str, thread: str) -> None:
    toolkit = ThreadboxToolkit()
    with sqlite3.connect(db, check_same_thread=False) as conn:
        graph = build(conn, toolkit)
        out = graph.invoke({"messages": [HumanMessage("say hello")]}, {"configurable": {"thread_id": thread}})
    (pending,) = out["__interrupt__"]
    print(f"[process 1] paused for approval of {pending.value['tool']}:\n{pending.value['code']}\n")


def phase2(db: str, thread: str) -> None:
    toolkit = ThreadboxToolkit()
    with sqlite3.connect(db, check_same_thread=False) as conn:
        graph = build(conn, toolkit)
        cfg = {"configurable": {"thread_id": thread}}
        assert graph.get_state(cfg).next == ("tools",), "nothing to resume"
        out = graph.invoke(Command(resume={"type": "approve"}), cfg)
    msg = next(m for m in reversed(out["messages"]) if isinstance(m, ToolMessage))
    print(f"[process 2] approved; the tool said: {str(msg.content).strip()}")
    print(f"[process 2] artifact: {json.dumps(msg.artifact)}")
    assert msg.artifact["exit_code"] == 0 and "hello from" in str(msg.content)
    toolkit.release_thread(thread, action="delete")


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--resume":
        phase2(sys.argv[2], sys.argv[3])
        return
    thread = f"approval-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "checkpoints.sqlite")
        phase1(db, thread)
        subprocess.run([sys.executable, __file__, "--resume", db, thread], check=True)
    print("done.")


if __name__ == "__main__":
    main()
