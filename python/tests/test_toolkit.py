"""The toolkit's behaviour a LangGraph user relies on, against a real daemon (user trial P9-P13)."""

from __future__ import annotations

import base64
import time
import zlib
from typing import Any
from uuid import uuid4

import pytest
from conftest import CountingTransport, Daemon, Names
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from langchain_threadbox import ThreadboxToolkit, thread_sandbox_name
from threadbox import Threadbox

pytestmark = pytest.mark.daemon


def build(tools: list[Any], plan: dict[str, list[tuple[str, dict[str, Any]]]]) -> Any:
    """The user trial's harness: one AIMessage of fixed tool calls per user text."""

    def agent(state: MessagesState) -> dict[str, Any]:
        last = state["messages"][-1]
        if isinstance(last, HumanMessage):
            calls = [{"name": n, "args": a, "id": f"call_{uuid4().hex[:12]}"} for n, a in plan[str(last.content)]]
            return {"messages": [AIMessage("", tool_calls=calls)]}
        return {"messages": [AIMessage("done")]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode(tools))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile(checkpointer=InMemorySaver())


def cfg(tid: str) -> RunnableConfig:
    return {"configurable": {"thread_id": tid}}


def tool_messages(out: dict[str, Any], since: int = 0) -> list[ToolMessage]:
    return [m for m in out["messages"][since:] if isinstance(m, ToolMessage)]


def run_turn(graph: Any, tid: str, text: str) -> list[ToolMessage]:
    before = len(graph.get_state(cfg(tid)).values.get("messages", []))
    return tool_messages(graph.invoke({"messages": [HumanMessage(text)]}, cfg(tid)), before)


def test_a_recreated_thread_sandbox_is_announced(tb: Threadbox, names: Names) -> None:
    """P9: the model is told when its thread's sandbox had to be created again."""
    graph = build(
        ThreadboxToolkit(client=tb).get_tools(),
        {"keep": [("write_file", {"path": "keep.txt", "content": "k"})], "ls": [("list_files", {})]},
    )
    tid = names.thread("recreate")
    (first,) = run_turn(graph, tid, "keep")
    assert not str(first.content).startswith("[new sandbox")  # the first sandbox of a conversation: no note
    assert first.artifact["sandbox_created"] is True
    tb.delete(thread_sandbox_name(tid), force=True)
    (again,) = run_turn(graph, tid, "ls")
    assert str(again.content).startswith("[new sandbox: this conversation's sandbox no longer existed")
    assert again.artifact["sandbox_created"] is True
    (later,) = run_turn(graph, tid, "ls")
    assert not str(later.content).startswith("[new sandbox") and "sandbox_created" not in later.artifact


def test_thread_sandboxes_pause_when_idle_by_default(tb: Threadbox, names: Names) -> None:
    """P9: "pauses it at no CPU cost while the agent waits" holds without options."""
    tk = ThreadboxToolkit(client=tb)
    tid = names.thread("idle")
    tk.run_shell.invoke({"command": "true"}, cfg(tid))
    info = tb.get(thread_sandbox_name(tid)).info
    assert info.idle_pause_secs == 60 and info.ttl_secs is None
    assert info.idle_stop_secs == 3600 and info.idle_hibernate_secs == 600
    tid2 = names.thread("idle-off")
    ThreadboxToolkit(client=tb, sandbox_options={"idle_pause_secs": None}).run_shell.invoke(
        {"command": "true"}, cfg(tid2)
    )
    assert tb.get(thread_sandbox_name(tid2)).info.idle_pause_secs is None


def test_file_errors_are_status_error(tb: Threadbox, names: Names) -> None:
    """P12: file-operation errors are ToolMessage(status="error")."""
    graph = build(
        ThreadboxToolkit(client=tb).get_tools(),
        {
            "bad": [
                ("read_file", {"path": "missing.txt"}),
                ("write_file", {"path": "/etc/x.conf", "content": "x"}),
                ("read_file", {"path": "/home"}),
            ]
        },
    )
    missing, denied, isdir = run_turn(graph, names.thread("ferr"), "bad")
    assert (missing.status, missing.content) == ("error", "Error: missing.txt: no such file or directory")
    assert denied.status == "error" and "permission denied" in denied.content
    assert isdir.status == "error" and "is a directory" in isdir.content


def test_oom_is_named_in_the_tool_text(tb: Threadbox, names: Names) -> None:
    tk = ThreadboxToolkit(client=tb, sandbox_options={"memory": "256M"})
    msg = tk.run_python.invoke(
        {"type": "tool_call", "id": "c1", "name": "run_python", "args": {"code": "x = bytearray(1 << 30)"}},
        cfg(names.thread("oom")),
    )
    assert "[killed: out of memory (limit 256 MiB)" in msg.content, msg.content
    assert msg.artifact["oom_killed"] is True and msg.artifact["memory_limit_bytes"] == 256 << 20


def test_long_output_keeps_the_real_end(tb: Threadbox, names: Names) -> None:
    """P13: the tail the model sees is the program's end, not the end of the first 4 MiB."""
    tk = ThreadboxToolkit(client=tb, max_output_chars=2000)
    msg = tk.run_shell.invoke(
        {"command": "yes abcdefghij | head -c 50000000; echo; echo '=== 3 passed, 1 failed ==='"},
        cfg(names.thread("tail")),
    )
    assert "=== 3 passed, 1 failed ===" in msg and "characters cut here" in msg


def test_binary_stdout_is_escaped(tb: Threadbox, names: Names) -> None:
    tk = ThreadboxToolkit(client=tb)
    text = tk.run_shell.invoke({"command": r"printf 'ab\377\376cd\000ef\n'"}, cfg(names.thread("bin")))
    assert "\x00" not in text and "\ufffd" not in text and "ab\\xff\\xfecd\\x00ef" in text
    text = tk.run_shell.invoke({"command": "head -c 4096 /dev/urandom"}, cfg(names.thread("bin2")))
    assert text.startswith("[binary output: 4096 bytes, not shown") and "\x00" not in text


def test_non_utf8_names_round_trip(tb: Threadbox, names: Names) -> None:
    tk = ThreadboxToolkit(client=tb)
    c = cfg(names.thread("names"))
    tk.run_python.invoke({"code": "open(b'caf\\xe9-\\xff.txt', 'wb').write(b'bonjour')"}, c)
    listing = tk.list_files.invoke({}, c)
    assert "caf\\xe9-\\xff.txt  (7 bytes)" in listing and "\ufffd" not in listing
    assert tk.read_file.invoke({"path": "caf\\xe9-\\xff.txt"}, c) == "bonjour"
    tk.write_file.invoke({"path": "caf\\xe9-\\xff.txt", "content": "salut"}, c)
    assert tk.read_file.invoke({"path": "caf\\xe9-\\xff.txt"}, c) == "salut"
    assert tk.read_file.invoke({"path": "caf\\xe9-\\xfe.txt"}, c).endswith("no such file or directory")
    # A directory whose own name is not UTF-8 lists, and its files read back.
    tk.run_python.invoke({"code": "import os; os.mkdir(b'd\\xff'); open(b'd\\xff/n\\xe9', 'wb').write(b'deep')"}, c)
    assert "n\\xe9  (4 bytes)" in tk.list_files.invoke({"path": "d\\xff"}, c)
    assert tk.read_file.invoke({"path": "d\\xff/n\\xe9"}, c) == "deep"


def test_read_file_offset_limit_without_downloading_it_all(tb: Threadbox, names: Names) -> None:
    tk = ThreadboxToolkit(client=tb)
    c = cfg(names.thread("big"))
    tk.run_shell.invoke({"command": "seq 1 6000000 > big.txt; ls -l big.txt"}, c)  # ~47 MB
    msg = tk.read_file.invoke({"type": "tool_call", "id": "r", "name": "read_file", "args": {"path": "big.txt"}}, c)
    assert str(msg.content).startswith("1\n2\n3\n") and "call read_file with offset=" in msg.content
    assert msg.artifact["truncated"] is True and msg.artifact["size"] > 40_000_000
    assert msg.artifact["bytes_read"] < 1 << 20, "a 47 MB file was downloaded to show 20 000 characters"
    part = tk.read_file.invoke({"path": "big.txt", "offset": 99, "limit": 3}, c)
    assert part.startswith("100\n101\n102\n[lines 99-101 of big.txt")


def test_read_file_fetches_byte_ranges(daemon: Daemon, names: Names) -> None:
    """The daemon sends only the windows the tool asks for (counted at the SDK's transport)."""
    counter = CountingTransport()
    with Threadbox(daemon.url, transport=counter) as tb:
        tk = ThreadboxToolkit(client=tb)
        c = cfg(names.thread("ranges"))
        tk.run_shell.invoke({"command": "seq 1 6000000 > big.txt"}, c)
        counter.received = 0
        part = tk.read_file.invoke({"path": "big.txt", "offset": 99, "limit": 3}, c)
        assert part.startswith("100\n101\n102\n[lines 99-101 of big.txt")
        # One 64 KiB window, plus the small JSON answer of the stat before it.
        assert counter.received <= (64 << 10) + 2048, counter.received
        counter.received = 0
        msg = tk.read_file.invoke({"type": "tool_call", "id": "r", "name": "read_file", "args": {"path": "big.txt"}}, c)
        assert msg.artifact["truncated"] is True
        assert msg.artifact["bytes_read"] <= 64 << 10
        assert counter.received <= msg.artifact["bytes_read"] + 2048, counter.received


def _png(width: int = 2, height: int = 2) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return len(data).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")

    raw = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    ihdr = width.to_bytes(4, "big") + height.to_bytes(4, "big") + b"\x08\x02\x00\x00\x00"
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def test_read_file_returns_an_image_block(tb: Threadbox, names: Names) -> None:
    tk = ThreadboxToolkit(client=tb)
    c = cfg(names.thread("img"))
    tk.run_shell.invoke({"command": "true"}, c)
    png = _png()
    tk.sandbox_for(c).files.write("red.png", png)
    msg = tk.read_file.invoke({"type": "tool_call", "id": "i", "name": "read_file", "args": {"path": "red.png"}}, c)
    text, image = msg.content
    assert text["type"] == "text" and "image/png" in text["text"]
    assert image == {"type": "image", "base64": base64.b64encode(png).decode(), "mime_type": "image/png"}
    small = ThreadboxToolkit(client=tb, max_image_bytes=10)
    assert "larger than the 10 bytes" in small.read_file.invoke({"path": "red.png"}, c)


def test_output_streams_through_the_custom_stream_writer(tb: Threadbox, names: Names) -> None:
    graph = build(
        ThreadboxToolkit(client=tb).get_tools(),
        {"count": [("run_shell", {"command": "for i in 1 2 3; do echo tick $i; sleep 0.3; done"})]},
    )
    c = cfg(names.thread("stream"))
    chunks: list[tuple[float, dict[str, Any]]] = []
    t0 = time.monotonic()
    for chunk in graph.stream({"messages": [HumanMessage("count")]}, c, stream_mode="custom"):
        chunks.append((time.monotonic() - t0, chunk))
    outs = [ch for _, ch in chunks if ch.get("type") == "threadbox_output"]
    assert "".join(ch["text"] for ch in outs) == "tick 1\ntick 2\ntick 3\n"
    assert outs[0]["tool"] == "run_shell" and outs[0]["tool_call_id"].startswith("call_")
    assert chunks[0][0] < chunks[-1][0] - 0.3, "output arrived as it was printed"
    (msg,) = tool_messages(graph.get_state(c).values)
    assert str(msg.content).startswith("tick 1\ntick 2\ntick 3\n")


async def test_async_tools_stream_and_report_errors(tb: Threadbox, names: Names) -> None:
    graph = build(
        ThreadboxToolkit(client=tb).get_tools(),
        {"go": [("run_shell", {"command": "echo one; echo two"}), ("read_file", {"path": "nope"})]},
    )
    c = cfg(names.thread("astream"))
    texts = [
        ch["text"]
        async for ch in graph.astream({"messages": [HumanMessage("go")]}, c, stream_mode="custom")
        if ch.get("type") == "threadbox_output"
    ]
    assert "".join(texts) == "one\ntwo\n"
    shell, missing = tool_messages((await graph.aget_state(c)).values)
    assert shell.status == "success" and missing.status == "error"


def test_read_file_shows_the_start_of_one_huge_line(tb: Threadbox, names: Names) -> None:
    tk = ThreadboxToolkit(client=tb, max_output_chars=1000)
    c = cfg(names.thread("oneline"))
    tk.run_shell.invoke({"command": "head -c 3000000 /dev/zero | tr '\\0' z > line.txt"}, c)
    msg = tk.read_file.invoke({"type": "tool_call", "id": "r", "name": "read_file", "args": {"path": "line.txt"}}, c)
    assert str(msg.content).startswith("z" * 1000) and msg.artifact["truncated"] is True
    assert msg.artifact["bytes_read"] < 1 << 20


def test_without_custom_streaming_the_plain_exec_is_used(
    tb: Threadbox, names: Names, monkeypatch: pytest.MonkeyPatch
) -> None:
    graph = build(ThreadboxToolkit(client=tb).get_tools(), {"hi": [("run_shell", {"command": "echo hi"})]})

    def no_stream(*a: Any, **k: Any) -> Any:
        raise AssertionError("exec_stream used although nobody streams custom events")

    from threadbox import Sandbox

    monkeypatch.setattr(Sandbox, "exec_stream", no_stream)
    (msg,) = run_turn(graph, names.thread("plain"), "hi")
    assert str(msg.content).startswith("hi\n") and msg.status == "success"
    updates = list(graph.stream({"messages": [HumanMessage("hi")]}, cfg(names.thread("upd")), stream_mode="updates"))
    (msg,) = [m for u in updates for m in (u.get("tools") or {}).get("messages", [])]
    assert str(msg.content).startswith("hi\n")


async def test_async_file_tools_match_the_sync_ones(tb: Threadbox, names: Names) -> None:
    """The async twins run the same steps (read ranges, escaped names, errors)."""
    tk = ThreadboxToolkit(client=tb)
    c = cfg(names.thread("afiles"))
    await tk.write_file.ainvoke({"path": "caf\\xe9.txt", "content": "a\nb\nc\n"}, c)
    assert "caf\\xe9.txt  (6 bytes)" in await tk.list_files.ainvoke({}, c)
    part = await tk.read_file.ainvoke({"path": "caf\\xe9.txt", "offset": 1, "limit": 1}, c)
    assert part.startswith("b\n[lines 1-1"), part
    assert (await tk.read_file.ainvoke({"path": "caf\\xe9.txt"}, c)) == tk.read_file.invoke({"path": "caf\\xe9.txt"}, c)
    missing = await tk.read_file.ainvoke({"path": "missing.txt"}, c)
    assert missing.endswith("no such file or directory"), missing
