"""Offline tests of the LangChain layer: output cutting, tools and approval logic."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import StructuredTool, ToolException
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Command
from pydantic import BaseModel

from langchain_threadbox import (
    ThreadboxToolkit,
    cut_middle,
    format_exec,
    parse_decision,
    require_approval,
    thread_sandbox_name,
)
from langchain_threadbox._output import safe_text
from langchain_threadbox._paths import escape_name, raw_path
from threadbox import ExecResult, Threadbox


def _result(**kw: Any) -> ExecResult:
    base: dict[str, Any] = dict(
        exit_code=0,
        signal=None,
        stdout_bytes=b"",
        stderr_bytes=b"",
        timed_out=False,
        truncated=False,
        stdout_truncated=False,
        stderr_truncated=False,
        duration_ms=1,
    )
    base.update(kw)
    return ExecResult(**base)


def test_cut_middle_keeps_head_and_tail_with_marker() -> None:
    text = "H" * 500 + "M" * 10_000 + "T" * 500
    out, removed = cut_middle(text, 1000)
    assert removed == len(text) - 1000
    assert out.startswith("H" * 400) and out.endswith("T" * 500)
    assert f"[... {removed} characters cut here" in out
    assert cut_middle("short", 10) == ("short", 0)


def test_format_exec_non_zero_and_timeout() -> None:
    text, art = format_exec(_result(exit_code=2, stdout_bytes=b"out", stderr_bytes=b"Traceback"), max_chars=100)
    assert text == "out\n[stderr]\nTraceback\n[exit code 2]"
    assert art["exit_code"] == 2 and art["timed_out"] is False and art["truncated"] is False

    text, art = format_exec(_result(exit_code=None, timed_out=True, stdout_bytes=b"tick\n"), timeout=3)
    assert "timed out after 3s" in text and art["timed_out"] is True and art["exit_code"] is None

    big = _result(stdout_bytes=b"x" * 50_000, stderr_bytes=b"e" * 50_000, truncated=True)
    text, art = format_exec(big, max_chars=3000)
    assert len(text) < 3500 and "characters cut here" in text and "[stderr]" in text
    assert art["truncated"] is True and art["sandbox_truncated"] is True and art["cut_chars"] > 0
    assert format_exec(_result())[0] == "(no output)\n[exit code 0]"


def test_thread_sandbox_names() -> None:
    assert thread_sandbox_name("abc-1") == "thread-abc-1"
    weird = thread_sandbox_name("user@example.com/chat 1")
    assert weird.startswith("thread-h") and weird == thread_sandbox_name("user@example.com/chat 1")
    assert len(thread_sandbox_name("x" * 500)) < 64


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (True, "approve"),
        ("approve", "approve"),
        ({"type": "approve"}, "approve"),
        ({"decisions": [{"type": "approve"}]}, "approve"),
        (False, "reject"),
        ({"type": "reject", "message": "no"}, "reject"),
        ({"type": "edit", "args": {"code": "1"}}, "edit"),
        ({"type": "edit", "edited_action": {"name": "run_python", "args": {"code": "1"}}}, "edit"),
    ],
)
def test_parse_decision(value: Any, kind: str) -> None:
    assert parse_decision(value).kind == kind


def test_parse_decision_rejects_garbage() -> None:
    with pytest.raises(ToolException):
        parse_decision("maybe")
    with pytest.raises(ToolException):
        parse_decision({"type": "edit"})


# -- a fake daemon for the tools ------------------------------------------------


class FakeDaemon:
    def __init__(self) -> None:
        self.sandboxes: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str, Any]] = []
        self.exec_reply: dict[str, Any] = {"exit_code": 0, "stdout": "", "stderr": "", "encoding": "utf8"}
        self.fail_with: tuple[int, str] | None = None

    def handler(self, req: httpx.Request) -> httpx.Response:
        body: Any = json.loads(req.content) if req.content and req.method == "POST" else {}
        self.requests.append((req.method, req.url.path, body))
        if self.fail_with:
            return httpx.Response(self.fail_with[0], json={"error": {"code": self.fail_with[1], "message": "x"}})
        p = req.url.path
        if p == "/v1/sandboxes" and req.method == "POST":
            name = body["name"]
            if name in self.sandboxes:
                return httpx.Response(200, json=self.sandboxes[name])
            sb = {"id": f"id-{name}", "name": name, "state": "running", "labels": body.get("labels", {})}
            self.sandboxes[name] = sb
            self.sandboxes[sb["id"]] = sb
            return httpx.Response(201, json=sb)
        if p.endswith("/exec"):
            return httpx.Response(200, json=self.exec_reply)
        if p.endswith("/files") and req.method == "GET":
            return httpx.Response(404, json={"error": {"code": "not_found", "message": "no such file"}})
        return httpx.Response(404, json={"error": {"code": "not_found", "message": "?"}})


def toolkit(fake: FakeDaemon, **kw: Any) -> ThreadboxToolkit:
    client = Threadbox("http://fake", transport=httpx.MockTransport(fake.handler))
    return ThreadboxToolkit(client=client, **kw)


def test_tool_schema_hides_config() -> None:
    tools = {t.name: t for t in toolkit(FakeDaemon()).get_tools()}
    assert set(tools) == {"run_python", "run_shell", "read_file", "write_file", "list_files"}

    def props(name: str) -> set[str]:
        schema: Any = tools[name].tool_call_schema
        return set(schema.model_json_schema()["properties"])

    assert props("run_python") == {"code", "timeout"}  # runtime and config stay hidden
    assert props("run_shell") == {"command", "timeout"}
    assert props("read_file") == {"path", "offset", "limit"}
    assert props("write_file") == {"path", "content"}


def test_toolkit_is_a_base_toolkit_with_a_name_prefix() -> None:
    from langchain_core.tools import BaseToolkit

    tk = toolkit(FakeDaemon(), name_prefix="sandbox_")
    assert isinstance(tk, BaseToolkit)
    assert [t.name for t in tk.get_tools()] == [
        "sandbox_run_python",
        "sandbox_run_shell",
        "sandbox_read_file",
        "sandbox_write_file",
        "sandbox_list_files",
    ]
    assert [t.name for t in tk.get_tools(["read_file"])] == ["sandbox_read_file"]


def test_per_call_timeout_is_capped() -> None:
    fake = FakeDaemon()
    tk = toolkit(fake, timeout=5, max_timeout=30)
    cfg: RunnableConfig = {"configurable": {"thread_id": "t-to"}}
    msg = tk.run_shell.invoke({"type": "tool_call", "id": "c", "name": "run_shell", "args": {"command": "x"}}, cfg)
    assert fake.requests[-1][2]["timeout_secs"] == 5.0 and msg.artifact["timeout"] == 5.0
    tk.run_shell.invoke({"command": "x", "timeout": 20}, cfg)
    assert fake.requests[-1][2]["timeout_secs"] == 20.0
    msg = tk.run_shell.invoke(
        {"type": "tool_call", "id": "c", "name": "run_shell", "args": {"command": "x", "timeout": 999}}, cfg
    )
    assert fake.requests[-1][2]["timeout_secs"] == 30.0 and msg.artifact["timeout_capped"] is True
    assert "above the limit of 30s" in msg.content
    assert "at most 30" in tk.run_shell.description and "run in parallel" in tk.run_shell.description


def test_binary_and_nul_output_never_reach_the_message_raw() -> None:
    text, binary = safe_text(b"some text ab\xff\xfecd\x00ef\n")
    assert text == "some text ab\\xff\\xfecd\\x00ef\n" and not binary
    assert "\x00" not in text and "\ufffd" not in text
    text, binary = safe_text(bytes(range(256)) * 4)
    assert binary and text.startswith("[binary output: 1024 bytes")
    assert safe_text("héllo\n".encode())[0] == "héllo\n"


def test_oom_kill_is_named_in_the_text() -> None:
    r = _result(exit_code=137, signal=9, oom_killed=True, memory_limit_bytes=256 << 20)
    text, art = format_exec(r)
    assert "[killed: out of memory (limit 256 MiB)" in text and art["oom_killed"] is True
    assert art["memory_limit_bytes"] == 256 << 20


def test_escaped_names_round_trip() -> None:
    raw = b"caf\xe9-\xff.txt"
    shown = escape_name(raw)
    assert shown == "caf\\xe9-\\xff.txt"
    assert raw_path(shown) == raw
    assert raw_path("plain.txt") is None and raw_path("a\\x41.txt") is None  # valid once unescaped: a real name


def test_a_url_with_v1_gets_a_hint() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"error": {"code": "not_found", "message": "no such route"}})

    client = Threadbox("http://fake:7420/v1", transport=httpx.MockTransport(handler))
    tool = ThreadboxToolkit(client=client).run_python
    with pytest.raises(ToolException) as ei:
        tool.invoke({"code": "1"}, {"configurable": {"thread_id": "t"}})
    msg = str(ei.value)
    assert "without /v1" in msg and "http://fake:7420," in msg and "unavailable" not in msg


def test_run_python_non_zero_exit_is_content_and_artifact() -> None:
    fake = FakeDaemon()
    fake.exec_reply = {"exit_code": 1, "stdout": "", "stderr": "ZeroDivisionError", "encoding": "utf8"}
    tool = toolkit(fake, timeout=7).run_python
    msg = tool.invoke(
        {"type": "tool_call", "id": "c1", "name": "run_python", "args": {"code": "1/0"}},
        {"configurable": {"thread_id": "t-1"}},
    )
    assert isinstance(msg, ToolMessage) and msg.status == "success"
    assert "ZeroDivisionError" in msg.content and "[exit code 1]" in msg.content
    assert msg.artifact["exit_code"] == 1 and msg.artifact["sandbox_name"] == "thread-t-1"
    create = fake.requests[0]
    assert create[2]["name"] == "thread-t-1" and create[2]["labels"]["langchain-thread"] == "t-1"
    exec_body = fake.requests[1][2]
    assert exec_body["command"] == ["python3", "-"] and exec_body["stdin"] == "1/0"
    assert exec_body["timeout_secs"] == 7.0


def test_infra_failure_is_tool_exception() -> None:
    fake = FakeDaemon()
    fake.fail_with = (429, "quota_exceeded")
    tool = toolkit(fake).run_shell
    with pytest.raises(ToolException, match="quota_exceeded"):
        tool.invoke({"command": "ls"}, {"configurable": {"thread_id": "t"}})


def test_missing_thread_id_is_tool_exception() -> None:
    with pytest.raises(ToolException, match="thread_id"):
        toolkit(FakeDaemon()).run_shell.invoke({"command": "ls"})


def test_read_missing_file_is_reported_to_model() -> None:
    fake = FakeDaemon()
    content = toolkit(fake).read_file.invoke({"path": "nope.txt"}, {"configurable": {"thread_id": "t"}})
    assert content == "Error: nope.txt: no such file or directory"


def test_file_errors_are_error_tool_messages() -> None:
    """P12: what Deep Agents and the MCP adapter report as status="error"."""
    msg = toolkit(FakeDaemon()).read_file.invoke(
        {"type": "tool_call", "id": "c9", "name": "read_file", "args": {"path": "nope.txt"}},
        {"configurable": {"thread_id": "t"}},
    )
    assert isinstance(msg, ToolMessage) and msg.status == "error"
    assert msg.content == "Error: nope.txt: no such file or directory"


# -- approval wrapper without a daemon -----------------------------------------


class _Args(BaseModel):
    code: str


def _graph(calls: list[str]) -> Any:
    def fake_run(code: str) -> tuple[str, dict[str, Any]]:
        calls.append(code)
        return f"ran {code}", {"exit_code": 0}

    inner = StructuredTool(
        name="run_python",
        description="d",
        args_schema=_Args,
        func=fake_run,
        response_format="content_and_artifact",
    )
    g = StateGraph(MessagesState)
    g.add_node("tools", ToolNode([require_approval(inner)]))
    g.add_edge(START, "tools")
    return g.compile(checkpointer=InMemorySaver())


def _start(graph: Any, cfg: dict[str, Any]) -> Any:
    ai = AIMessage("", tool_calls=[{"name": "run_python", "args": {"code": "print(1)"}, "id": "c1"}])
    return graph.invoke({"messages": [ai]}, cfg)


@pytest.mark.parametrize(
    ("resume", "expect_calls", "expect_text"),
    [
        ("approve", ["print(1)"], "ran print(1)"),
        ({"type": "reject", "message": "too risky"}, [], "rejected"),
        ({"type": "edit", "args": {"code": "print(2)"}}, ["print(2)"], "ran print(2)"),
    ],
)
def test_approval_interrupt_resume(resume: Any, expect_calls: list[str], expect_text: str) -> None:
    calls: list[str] = []
    graph = _graph(calls)
    cfg = {"configurable": {"thread_id": "a1"}}
    out = _start(graph, cfg)
    (intr,) = out["__interrupt__"]
    assert intr.value["type"] == "threadbox_approval"
    assert intr.value["code"] == "print(1)" and intr.value["tool"] == "run_python"
    assert calls == []  # nothing ran before the human answered
    out = graph.invoke(Command(resume=resume), cfg)
    msg = out["messages"][-1]
    assert isinstance(msg, ToolMessage) and expect_text in msg.content
    assert calls == expect_calls
    assert msg.artifact["rejected"] is (resume != "approve" and resume.get("type") == "reject")
