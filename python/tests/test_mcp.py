"""threadbox over MCP, driven by the official Python ``mcp`` client SDK against the real
daemon: over stdio (``threadbox mcp``) and over Streamable HTTP (the daemon's ``/mcp``).

Every test runs on both doors: they share one tool implementation, so they must answer
alike. Every test that makes a sandbox also runs on each isolation tier under test
(``THREADBOX_TEST_TIERS``, default ``jail,gvisor``): the tools are the same whichever
driver is behind them (issue 16).
"""

from __future__ import annotations

import base64
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import jsonschema  # type: ignore[import-untyped]
import pytest
from conftest import Daemon, Names, threadbox_bin
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import McpError
from mcp.types import CallToolResult, TextContent

pytestmark = pytest.mark.daemon

TOOLS = {
    "sandbox_create",
    "sandbox_list",
    "sandbox_info",
    "exec",
    "run_python",
    "run_code",
    "read_file",
    "write_file",
    "list_files",
    "sandbox_pause",
    "sandbox_hibernate",
    "sandbox_resume",
    "sandbox_delete",
    "preview",
    "checkpoint",
    "rewind",
    "fork",
    "network_log",
}


@asynccontextmanager
async def mcp_session(daemon: Daemon, transport: str) -> AsyncIterator[ClientSession]:
    if transport == "stdio":
        params = StdioServerParameters(
            command=str(threadbox_bin()),
            args=["mcp"],
            env={"THREADBOX_URL": daemon.url, "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        )
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            yield session
    else:
        async with (
            httpx.AsyncClient(timeout=httpx.Timeout(60.0)) as http,
            streamable_http_client(daemon.url + "/mcp", http_client=http) as (read, write, _),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


@pytest.fixture(params=["stdio", "http"])
def transport(request: pytest.FixtureRequest) -> str:
    # Sessions are opened inside each test, not in a fixture: anyio's task groups must
    # be entered and left in the same task.
    return str(request.param)


def text_of(r: CallToolResult) -> str:
    return "\n".join(c.text for c in r.content if isinstance(c, TextContent))


async def ok(session: ClientSession, tool: str, **args: Any) -> dict[str, Any]:
    r = await session.call_tool(tool, args)
    assert not r.isError, f"{tool} failed: {text_of(r)}"
    assert r.structuredContent is not None, f"{tool}: no structuredContent"
    return r.structuredContent


async def test_lists_every_tool_with_schemas(daemon: Daemon, transport: str) -> None:
    async with mcp_session(daemon, transport) as session:
        listed = await session.list_tools()
        tools = {t.name: t for t in listed.tools}
        assert set(tools) == TOOLS
        for t in tools.values():
            assert t.description
            assert t.inputSchema["type"] == "object"
            jsonschema.Draft202012Validator.check_schema(t.inputSchema)
            assert t.outputSchema is not None and t.outputSchema["type"] == "object"
            if t.name not in ("sandbox_create", "sandbox_list"):
                assert "sandbox" in t.inputSchema["required"], t.name
        exec_props = tools["exec"].inputSchema["properties"]
        assert {"sandbox", "command", "timeout_secs", "env", "cwd"} <= set(exec_props)
        create_props = tools["sandbox_create"].inputSchema["properties"]
        assert {"name", "labels", "limits", "tier"} <= set(create_props)
        assert tools["read_file"].annotations is not None and tools["read_file"].annotations.readOnlyHint
        assert tools["sandbox_delete"].annotations is not None and tools["sandbox_delete"].annotations.destructiveHint


async def test_create_run_code_and_files(daemon: Daemon, transport: str, names: Names, tier: str) -> None:
    async with mcp_session(daemon, transport) as session:
        name = names.new("mcp")
        created = await ok(
            session,
            "sandbox_create",
            name=name,
            labels={"via": "mcp"},
            limits={"memory_bytes": 256 << 20},
            tier=tier,
        )
        assert created["created"] is True
        sb = created["sandbox"]
        assert sb["name"] == name and sb["state"] == "running" and sb["tier"] == tier
        assert sb["labels"] == {"via": "mcp"} and sb["limits"]["memory_bytes"] == 256 << 20
        again = await ok(session, "sandbox_create", name=name, tier=tier)
        assert again["created"] is False and again["sandbox"]["id"] == sb["id"]

        r = await session.call_tool("run_python", {"sandbox": name, "code": "print(6*7)"})
        assert not r.isError
        assert r.structuredContent is not None
        assert r.structuredContent["exit_code"] == 0 and r.structuredContent["stdout"] == "42\n"
        assert "42" in text_of(r)

        out = await ok(
            session, "exec", sandbox=sb["id"], command="echo $GREETING from $(pwd)", env={"GREETING": "hi"}, cwd="/tmp"
        )
        assert out["stdout"] == "hi from /tmp\n" and out["timed_out"] is False

        wrote = await ok(session, "write_file", sandbox=name, path="notes/todo.txt", content="milk\neggs\n")
        assert wrote["bytes_written"] == 10
        read = await ok(session, "read_file", sandbox=name, path="/home/user/notes/todo.txt")
        assert read["content"] == "milk\neggs\n" and read["encoding"] == "utf8" and read["truncated"] is False
        out = await ok(session, "exec", sandbox=name, command="wc -l < notes/todo.txt")
        assert out["stdout"].strip() == "2"
        listing = await ok(session, "list_files", sandbox=name, path="notes")
        assert [e["name"] for e in listing["entries"]] == ["todo.txt"]

        blob = bytes(range(255, -1, -1))  # starts with 0xff: never valid UTF-8
        await ok(
            session,
            "write_file",
            sandbox=name,
            path="b.bin",
            content=base64.b64encode(blob).decode(),
            encoding="base64",
        )
        read = await ok(session, "read_file", sandbox=name, path="b.bin")
        assert read["encoding"] == "base64" and base64.b64decode(read["content"]) == blob
        part = await ok(session, "read_file", sandbox=name, path="b.bin", max_bytes=16)
        assert (
            part["truncated"] is True
            and part["encoding"] == "base64"
            and base64.b64decode(part["content"]) == blob[:16]
        )

        listed = await ok(session, "sandbox_list", labels={"via": "mcp"})
        assert name in [s["name"] for s in listed["sandboxes"]]


async def test_non_zero_exit_and_timeout_are_results_not_errors(
    daemon: Daemon, transport: str, names: Names, tier: str
) -> None:
    async with mcp_session(daemon, transport) as session:
        name = names.new("mcp-exit")
        await ok(session, "sandbox_create", name=name, tier=tier)
        r = await session.call_tool("exec", {"sandbox": name, "command": "echo oops >&2; exit 3"})
        assert not r.isError
        assert r.structuredContent is not None
        assert r.structuredContent["exit_code"] == 3 and r.structuredContent["stderr"] == "oops\n"
        assert "exit_code: 3" in text_of(r)

        r = await session.call_tool("run_python", {"sandbox": name, "code": "raise ValueError('boom')"})
        assert not r.isError
        assert r.structuredContent is not None
        assert r.structuredContent["exit_code"] == 1 and "ValueError: boom" in r.structuredContent["stderr"]

        r = await session.call_tool("exec", {"sandbox": name, "command": "echo started; sleep 60", "timeout_secs": 1})
        assert not r.isError
        assert r.structuredContent is not None
        assert r.structuredContent["timed_out"] is True and r.structuredContent["stdout"] == "started\n"
        assert "timed out" in text_of(r)


async def test_errors_are_actionable_tool_errors(daemon: Daemon, transport: str, names: Names, tier: str) -> None:
    async with mcp_session(daemon, transport) as session:
        missing = names.new("never-created")
        r = await session.call_tool("exec", {"sandbox": missing, "command": "true"})
        assert r.isError
        assert r.structuredContent is not None and r.structuredContent["code"] == "not_found"
        assert "sandbox_create" in text_of(r)

        r = await session.call_tool("exec", {"sandbox": missing})  # no command
        assert r.isError and "command" in text_of(r)

        r = await session.call_tool("sandbox_create", {"name": "bad name with spaces"})
        assert r.isError
        assert r.structuredContent is not None and r.structuredContent["code"] == "invalid_argument"

        name = names.new("mcp-err")
        await ok(session, "sandbox_create", name=name, tier=tier)
        r = await session.call_tool("read_file", {"sandbox": name, "path": "does/not/exist"})
        assert r.isError
        assert r.structuredContent is not None and r.structuredContent["code"] == "not_found"

        with pytest.raises(McpError):
            await session.call_tool("no_such_tool", {})


async def test_pause_resume_and_delete(daemon: Daemon, transport: str, names: Names, tier: str) -> None:
    async with mcp_session(daemon, transport) as session:
        name = names.new("mcp-life")
        await ok(session, "sandbox_create", name=name, tier=tier)
        await ok(session, "exec", sandbox=name, command="echo kept > f.txt")
        assert (await ok(session, "sandbox_pause", sandbox=name))["state"] == "paused"
        assert (await ok(session, "sandbox_info", sandbox=name))["state"] == "paused"
        assert (await ok(session, "sandbox_resume", sandbox=name))["state"] == "running"
        assert (await ok(session, "read_file", sandbox=name, path="f.txt"))["content"] == "kept\n"
        # A paused sandbox is resumed by a call that runs something.
        await ok(session, "sandbox_pause", sandbox=name)
        assert (await ok(session, "exec", sandbox=name, command="cat f.txt"))["stdout"] == "kept\n"
        deleted = await ok(session, "sandbox_delete", sandbox=name)
        assert deleted["deleted"] is True
        r = await session.call_tool("sandbox_info", {"sandbox": name})
        assert r.isError


def _exec_count(daemon: Daemon) -> int:
    text = httpx.get(daemon.url + "/metrics", timeout=30).text
    for line in text.splitlines():
        if line.startswith("threadbox_exec_duration_seconds_count "):
            return int(float(line.split()[1]))
    raise AssertionError(f"no exec histogram in /metrics:\n{text[:2000]}")


async def test_execs_are_counted_in_metrics(daemon: Daemon, transport: str, names: Names, tier: str) -> None:
    # Both doors run the same exec operation, and /metrics counts it whichever door
    # it came through (stdio reaches the daemon over REST; HTTP runs it in process).
    async with mcp_session(daemon, transport) as session:
        name = names.new("mcp-metrics")
        await ok(session, "sandbox_create", name=name, tier=tier)
        before = _exec_count(daemon)
        await ok(session, "exec", sandbox=name, command="true")
        await ok(session, "run_python", sandbox=name, code="print(1)")
        assert _exec_count(daemon) == before + 2
        await ok(session, "sandbox_delete", sandbox=name)


async def test_resume_boots_a_stopped_sandbox_as_rest_start_does(
    daemon: Daemon, transport: str, names: Names, tier: str
) -> None:
    async with mcp_session(daemon, transport) as session:
        name = names.new("mcp-start")
        await ok(session, "sandbox_create", name=name, tier=tier)
        await ok(session, "exec", sandbox=name, command="echo kept > f.txt")
        async with httpx.AsyncClient(timeout=60) as http:
            stopped = await http.post(f"{daemon.url}/v1/sandboxes/{name}/stop")
        assert stopped.json()["state"] == "stopped"
        assert (await ok(session, "sandbox_resume", sandbox=name))["state"] == "running"
        assert (await ok(session, "read_file", sandbox=name, path="f.txt"))["content"] == "kept\n"
        await ok(session, "sandbox_delete", sandbox=name)


@pytest.mark.parametrize("version", ["2025-03-26", "2025-06-18", "2025-11-25"])
def test_http_negotiates_protocol_versions(daemon: Daemon, version: str) -> None:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
    }
    r = httpx.post(
        daemon.url + "/mcp",
        json=body,
        headers={"Accept": "application/json, text/event-stream"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert r.json()["result"]["protocolVersion"] == version


def test_http_refuses_unknown_hosts_and_origins(daemon: Daemon) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    headers = {"Accept": "application/json, text/event-stream"}
    r = httpx.post(daemon.url + "/mcp", json=body, headers={**headers, "Host": "evil.example"}, timeout=30)
    assert r.status_code == 403
    r = httpx.post(daemon.url + "/mcp", json=body, headers={**headers, "Origin": "https://evil.example"}, timeout=30)
    assert r.status_code == 403


def test_tools_validate_against_their_own_output_schemas(daemon: Daemon) -> None:
    # The mcp client validates structuredContent against outputSchema itself; this is
    # the same check without the client, on a list result.
    r = httpx.post(
        daemon.url + "/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
        headers={"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    tools = {t["name"]: t for t in r.json()["result"]["tools"]}
    r = httpx.post(
        daemon.url + "/mcp",
        json={"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "sandbox_list", "arguments": {}}},
        headers={"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    result = r.json()["result"]
    assert result.get("isError") in (None, False)
    jsonschema.validate(result["structuredContent"], tools["sandbox_list"]["outputSchema"])


async def test_stdio_fails_at_initialize_when_the_daemon_is_unreachable() -> None:
    """P5: a stdio client learns at once that THREADBOX_URL did not reach the server."""
    from mcp.shared.exceptions import McpError

    params = StdioServerParameters(
        command=str(threadbox_bin()),
        args=["mcp", "--url", "http://127.0.0.1:1"],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    errors: list[BaseException] = []
    try:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
    except BaseException as e:  # anyio wraps it in an exception group
        pending = [e]
        while pending:
            x = pending.pop()
            errors.append(x)
            pending.extend(getattr(x, "exceptions", []))
    (err,) = [e for e in errors if isinstance(e, McpError)]
    msg = str(err)
    assert "cannot connect to the threadbox daemon at http://127.0.0.1:1" in msg
    assert '"--url"' in msg and "THREADBOX_URL" in msg


async def test_preview_tool_publishes_a_port(daemon: Daemon, transport: str, names: Names, tier: str) -> None:
    name = names.new("mcp-preview")
    async with mcp_session(daemon, transport) as session:
        if tier == "gvisor":
            # A gvisor sandbox made without a network policy boots without a network
            # namespace (ADR 0140): a preview is refused with what to do instead.
            bare = names.new("mcp-preview-bare")
            await ok(session, "sandbox_create", name=bare, tier=tier)
            r = await session.call_tool("preview", {"sandbox": bare, "port": 8000})
            assert r.isError and "create it with one" in text_of(r), text_of(r)
            await ok(session, "sandbox_delete", sandbox=bare)
        # An empty policy opens nothing outside, and gives the sandbox its namespace.
        await ok(session, "sandbox_create", name=name, tier=tier, network={})
        p = await ok(session, "preview", sandbox=name, port=8000)
        assert not p["public"] and p["token"] and p["token"] in p["url"]
        assert p["path_url"].startswith(daemon.url + "/preview/sb-")
        public = await ok(session, "preview", sandbox=name, port=8001, public=True)
        assert public["public"] and "token" not in public
        bad = await session.call_tool("preview", {"sandbox": name, "port": 0})
        assert bad.isError, text_of(bad)
        await ok(session, "sandbox_delete", sandbox=name)
