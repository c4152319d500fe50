"""MCP ``run_code`` (issue 15, ADR 0085) against the real daemon, on both doors (stdio
and the daemon's ``/mcp``): variables persist in a context, a figure comes back as
``ImageContent`` (a real PNG) with the typed result in ``structuredContent`` (validated
by the ``mcp`` client against the tool's output schema) without the image bytes, an
exception is a result, and a named context is independent of the default one; on each
isolation tier under test (issue 16)."""

from __future__ import annotations

import base64

import pytest
from conftest import Daemon, Names
from mcp.types import ImageContent
from test_mcp import mcp_session, ok, text_of

pytestmark = pytest.mark.daemon

# A 1x1 PNG through `_repr_png_`: no matplotlib needed in the image.
PNG_B64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
CHART = (
    "import base64\n"
    "class Chart:\n"
    f"    def _repr_png_(self): return base64.b64decode('{PNG_B64}')\n"
    "display(Chart())\n"
    "'drawn'"
)


@pytest.fixture(params=["stdio", "http"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_run_code_keeps_state_and_returns_images(daemon: Daemon, transport: str, names: Names, tier: str) -> None:
    async with mcp_session(daemon, transport) as session:
        name = names.new("mcp-code")
        await ok(session, "sandbox_create", name=name, tier=tier)
        first = await ok(session, "run_code", sandbox=name, code="x = 20\nprint('set')\nx + 1")
        assert first["status"] == "ok" and first["stdout"] == "set\n"
        assert first["result"]["data"]["text/plain"] == "21"
        again = await ok(session, "run_code", sandbox=name, code="x * 2")
        assert again["result"]["data"]["text/plain"] == "40"
        assert again["execution_count"] == first["execution_count"] + 1

        r = await session.call_tool("run_code", {"sandbox": name, "code": CHART})
        assert not r.isError, text_of(r)
        images = [c for c in r.content if isinstance(c, ImageContent)]
        assert len(images) == 1 and images[0].mimeType == "image/png"
        assert base64.b64decode(images[0].data).startswith(b"\x89PNG")
        assert "[display 1: image/png image, content block 1]" in text_of(r)
        assert "result:\n'drawn'" in text_of(r)
        s = r.structuredContent
        assert s is not None and s["outputs"][0]["metadata"]["threadbox"]["content_block"]["image/png"] == 1
        assert PNG_B64[:24] not in str(s), "the image bytes are sent once, as ImageContent"

        r = await session.call_tool("run_code", {"sandbox": name, "code": "1/0"})
        assert not r.isError, "an exception in the code is a result"
        assert r.structuredContent is not None and r.structuredContent["status"] == "exception"
        assert "ZeroDivisionError" in text_of(r)

        # A named context is get-or-create and has its own variables.
        other = await ok(session, "run_code", sandbox=name, code="'x' in globals()", context="scratch")
        assert other["result"]["data"]["text/plain"] == "False"
        assert other["context_id"] != first["context_id"]
        still = await ok(session, "run_code", sandbox=name, code="x")
        assert still["result"]["data"]["text/plain"] == "20"

        timed = await ok(session, "run_code", sandbox=name, code="while True:\n    pass", timeout_secs=1)
        assert timed["status"] == "timed_out" and not timed["context_restarted"]
        kept = await ok(session, "run_code", sandbox=name, code="x")
        assert kept["result"]["data"]["text/plain"] == "20"
        await ok(session, "sandbox_delete", sandbox=name)
