"""Port previews through the SDK, against a live daemon (issue 13, ADR 0072)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from conftest import Names

from threadbox import AsyncThreadbox, Sandbox, Threadbox

DEADLINE = 30.0


def _serve_site(sb: Sandbox, port: int) -> None:
    """A stdlib http.server bound to 127.0.0.1 inside the sandbox, serving one page."""
    sb.files.write("site/index.html", "hello from inside the sandbox\n")
    sb.processes.start(["python3", "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", "site"])
    probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=1).close()"
    deadline = time.monotonic() + DEADLINE
    while sb.exec(["python3", "-c", probe]).exit_code != 0:
        assert time.monotonic() < deadline, "the server inside the sandbox never listened"
        time.sleep(0.1)


def test_private_preview_token_becomes_a_cookie(tb: Threadbox, names: Names) -> None:
    sb = tb.create(names.new("preview"))
    _serve_site(sb, 8000)
    p = sb.previews.create(8000)
    assert not p.public and p.token and p.token in p.path_url and p.token in p.url
    assert p.url.startswith(f"http://8000-{sb.id}.localhost:")
    bare = p.path_url.split("?")[0]
    with httpx.Client(follow_redirects=True, timeout=DEADLINE) as browser:
        assert browser.get(bare).status_code == 401
        r = browser.get(p.path_url)
        assert r.status_code == 200, r.text
        assert r.text == "hello from inside the sandbox\n"
        assert "tb_preview" not in str(r.url), "the token stays out of the final URL"
        # The cookie alone opens it now.
        again = browser.get(bare + "index.html")
        assert again.status_code == 200
    listed = sb.previews.list()
    assert [(x.port, x.public, x.token) for x in listed] == [(8000, False, None)]
    sb.previews.delete(8000)
    assert httpx.get(p.path_url, timeout=DEADLINE).status_code == 404
    with pytest.raises(ValueError):
        sb.previews.create(0)


async def test_async_public_preview(atb: AsyncThreadbox, names: Names) -> None:
    sb = await atb.create(names.new("apreview"))
    await sb.files.write("site/index.html", "public page\n")
    await sb.processes.start(["python3", "-m", "http.server", "8001", "--bind", "127.0.0.1", "--directory", "site"])
    p = await sb.previews.create(8001, public=True)
    assert p.public and p.token is None
    deadline = time.monotonic() + DEADLINE
    async with httpx.AsyncClient(timeout=DEADLINE) as client:
        while True:
            r = await client.get(p.path_url)
            if r.status_code == 200:
                break
            assert r.status_code == 502, r.text  # nothing listens yet
            assert time.monotonic() < deadline, r.text
            await asyncio.sleep(0.1)
        assert r.text == "public page\n"
    assert [x.port for x in await sb.previews.list()] == [8001]
    await sb.previews.delete(8001)
    assert await sb.previews.list() == []
