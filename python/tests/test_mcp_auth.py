"""``/mcp`` and ``threadbox mcp`` are authenticated like the REST API: a daemon that
requires API keys refuses ``/mcp`` without one, and each tool call acts for its key's
tenant and scopes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from conftest import Daemon, _skip_reason, threadbox_bin
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent

pytestmark = pytest.mark.daemon


@pytest.fixture(scope="module")
def keyed_daemon() -> Iterator[Daemon]:
    """A daemon of its own that requires API keys on TCP."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    help_text = subprocess.run(
        [str(threadbox_bin()), "keys", "create", "--help"], capture_output=True, timeout=20, check=False
    )
    if help_text.returncode != 0:
        pytest.skip("this build has no API keys")
    base = Path(tempfile.mkdtemp(prefix="threadbox-pytest-mcp-auth-", dir=os.environ.get("THREADBOX_TEST_TMPDIR")))
    d = Daemon(threadbox_bin(), base)
    d.extra_args = [a for a in d.extra_args if a != "--insecure-no-auth"]
    d.start()
    try:
        yield d
    finally:
        d.stop()
        shutil.rmtree(base, ignore_errors=True)


def make_key(d: Daemon, tenant: str, *scopes: str) -> str:
    args = [str(threadbox_bin()), "--url", f"unix://{d.socket_path}", "keys", "create", "--tenant", tenant, "--json"]
    for s in scopes:
        args += ["--scope", s]
    out = subprocess.run(args, capture_output=True, timeout=30, check=True)
    return str(json.loads(out.stdout)["key"])


@asynccontextmanager
async def http_session(d: Daemon, key: str) -> AsyncIterator[ClientSession]:
    async with (
        httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=60) as http,
        streamable_http_client(d.url + "/mcp", http_client=http) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


@asynccontextmanager
async def stdio_session(d: Daemon, key: str) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=str(threadbox_bin()),
        args=["mcp"],
        env={"THREADBOX_URL": d.url, "THREADBOX_API_KEY": key, "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def text_of(r: CallToolResult) -> str:
    return "\n".join(c.text for c in r.content if isinstance(c, TextContent))


def test_http_mcp_without_a_key_is_refused(keyed_daemon: Daemon) -> None:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
    }
    headers = {"Accept": "application/json, text/event-stream"}
    r = httpx.post(keyed_daemon.url + "/mcp", json=body, headers=headers, timeout=30)
    assert r.status_code == 401, r.text
    assert r.json()["error"]["code"] == "unauthenticated"
    r = httpx.post(
        keyed_daemon.url + "/mcp", json=body, headers={**headers, "Authorization": "Bearer tb_wrong"}, timeout=30
    )
    assert r.status_code == 401


async def test_tool_calls_act_for_the_keys_tenant_and_scopes(keyed_daemon: Daemon) -> None:
    tenant, other = f"mcp{uuid.uuid4().hex[:8]}", f"oth{uuid.uuid4().hex[:8]}"
    rw = make_key(keyed_daemon, tenant, "sandboxes:read", "sandboxes:write")
    admin = make_key(keyed_daemon, tenant, "admin")
    stranger = make_key(keyed_daemon, other, "sandboxes:read", "sandboxes:write")
    name = f"pt-auth-{uuid.uuid4().hex[:8]}"
    try:
        async with http_session(keyed_daemon, rw) as s:
            r = await s.call_tool("sandbox_create", {"name": name})
            assert not r.isError, text_of(r)
            r = await s.call_tool("run_python", {"sandbox": name, "code": "print('hello')"})
            assert not r.isError and r.structuredContent is not None
            assert r.structuredContent["stdout"] == "hello\n"
            # No delete scope on this key.
            r = await s.call_tool("sandbox_delete", {"sandbox": name})
            assert r.isError
            assert r.structuredContent is not None and r.structuredContent["code"] == "permission_denied"

        # Over stdio, THREADBOX_API_KEY is the key.
        async with stdio_session(keyed_daemon, rw) as s:
            r = await s.call_tool("exec", {"sandbox": name, "command": "echo via-stdio"})
            assert not r.isError and r.structuredContent is not None
            assert r.structuredContent["stdout"] == "via-stdio\n"

        # Another tenant does not see it, through either door.
        async with http_session(keyed_daemon, stranger) as s:
            r = await s.call_tool("sandbox_info", {"sandbox": name})
            assert r.isError
            assert r.structuredContent is not None and r.structuredContent["code"] == "not_found"
        async with stdio_session(keyed_daemon, stranger) as s:
            r = await s.call_tool("sandbox_list", {})
            assert not r.isError and r.structuredContent is not None
            assert name not in [sb["name"] for sb in r.structuredContent["sandboxes"]]
    finally:
        async with http_session(keyed_daemon, admin) as s:
            await s.call_tool("sandbox_delete", {"sandbox": name})
