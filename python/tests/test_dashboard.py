"""The dashboard at ``/ui/`` tested as a person would use it (ADR 0096): Debian's Chromium
driven by Playwright (``executable_path=/usr/bin/chromium``; never ``playwright install``)
against the session's daemon. Log in with a key, see a sandbox made through the API
appear, open its terminal, type, resize; a file only downloads; a page of another origin
can neither open a WebSocket nor read the API.

Screenshots go to ``target/ui-screenshots/`` (CI artifacts).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import REPO_ROOT, Daemon, Names

from threadbox import Threadbox

pytestmark = pytest.mark.daemon

CHROMIUM = Path("/usr/bin/chromium")
SHOTS = REPO_ROOT / "target" / "ui-screenshots"
EVIL = "http://evil.example"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.is_file():
        pytest.skip("Debian's chromium is not installed (scripts/test.sh installs it)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM))
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def dashboard_key(daemon: Daemon) -> str:
    """A key of the daemon's default tenant (the test daemon's TCP door is keyless for
    programs, but the dashboard always logs in by key)."""
    r = httpx.post(
        daemon.url + "/v1/keys",
        json={"tenant": "default", "scopes": ["sandboxes:read", "sandboxes:write", "admin"]},
        timeout=30,
    )
    assert r.status_code == 201, r.text
    return str(r.json()["key"])


def shot(page: Any, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path


def log_in(browser: Any, daemon: Daemon, key: str) -> tuple[Any, Any]:
    ctx = browser.new_context(viewport={"width": 1280, "height": 800}, accept_downloads=True)
    page = ctx.new_page()
    page.goto(daemon.url + "/ui/")
    page.fill("#key", key)
    page.click("button[type=submit]")
    page.wait_for_selector("#tenant:has-text('default')")
    return ctx, page


def terminal_text(page: Any) -> str:
    return str(page.inner_text(".xterm-rows"))


def wait_terminal(page: Any, pattern: str, timeout_s: float = 30) -> re.Match[str]:
    deadline = time.monotonic() + timeout_s
    rx = re.compile(pattern)
    while True:
        m = rx.search(terminal_text(page))
        if m:
            return m
        if time.monotonic() > deadline:
            raise AssertionError(f"{pattern!r} not on the terminal:\n{terminal_text(page)}")
        page.wait_for_timeout(100)


def test_log_in_and_see_a_sandbox_appear(
    browser: Any, daemon: Daemon, dashboard_key: str, tb: Threadbox, names: Names
) -> None:
    ctx, page = log_in(browser, daemon, dashboard_key)
    try:
        # The session is an HttpOnly, SameSite=Strict cookie; the key is in no URL.
        cookies = {c["name"]: c for c in ctx.cookies()}
        assert cookies["tb_ui"]["httpOnly"] is True
        assert cookies["tb_ui"]["sameSite"] == "Strict"
        assert dashboard_key not in page.url and dashboard_key not in cookies["tb_ui"]["value"]
        assert page.evaluate("document.cookie") == "", "no script can read the session"

        sb = tb.create(names.new("dash"))
        row = page.wait_for_selector(f"tr[data-id='{sb.id}']", timeout=20_000)
        assert row is not None
        assert "running" in row.inner_text()
        shot(page, "sandboxes")

        # Its page: facts, processes, files.
        page.click(f"tr[data-id='{sb.id}'] a >> nth=0")
        page.wait_for_selector("dl.facts")
        assert sb.id in page.inner_text("dl.facts")

        # The audit log with its verify badge, and usage against quota.
        page.goto(daemon.url + "/ui/#/audit")
        page.wait_for_selector("#audit-verify.ok", timeout=20_000)
        assert "sandbox.create" in page.inner_text("table")
        shot(page, "audit")
        page.goto(daemon.url + "/ui/#/usage")
        page.wait_for_selector("h3:has-text('Tenant default')", timeout=20_000)

        # Logout ends the session: the API refuses the old cookie, the page shows the login.
        page.click("#logout")
        page.wait_for_selector("#key")
        assert not [c for c in ctx.cookies() if c["name"] == "tb_ui" and c["value"]]
    finally:
        ctx.close()


def test_a_file_only_downloads(browser: Any, daemon: Daemon, dashboard_key: str, tb: Threadbox, names: Names) -> None:
    sb = tb.create(names.new("dashfile"))
    body = b"<script>document.title='ran'</script><h1>hostile</h1>"
    sb.files.write("/tmp/page.html", body)
    # The API answers a file read as an attachment, never renderable on this origin.
    r = httpx.get(f"{daemon.url}/v1/sandboxes/{sb.id}/files", params={"path": "/tmp/page.html"}, timeout=30)
    assert r.status_code == 200
    assert r.headers["content-disposition"] == "attachment"
    assert r.headers["content-type"] == "application/octet-stream"
    assert r.headers["content-security-policy"] == "sandbox"
    ctx, page = log_in(browser, daemon, dashboard_key)
    try:
        page.goto(f"{daemon.url}/ui/#/sb/{sb.id}/files")
        page.wait_for_selector("a:has-text('tmp/')")
        page.click("a:has-text('tmp/')")
        page.wait_for_selector("td:has-text('page.html')")
        with page.expect_download() as dl:
            page.click("tr:has(td:has-text('page.html')) button")
        d = dl.value
        assert d.suggested_filename == "page.html"
        assert Path(d.path()).read_bytes() == body
        assert page.title() == "threadbox", "the file's script never ran here"
    finally:
        ctx.close()


def test_a_cross_origin_page_cannot_open_a_websocket_or_read_the_api(
    browser: Any, daemon: Daemon, dashboard_key: str, tb: Threadbox, names: Names
) -> None:
    sb = tb.create(names.new("dashws"))
    ctx, page = log_in(browser, daemon, dashboard_key)
    try:
        # A page of another origin in the same browser, which holds the dashboard's cookie.
        page.route(
            f"{EVIL}/**",
            lambda route: route.fulfill(status=200, content_type="text/html", body="<title>evil</title>"),
        )
        page.goto(f"{EVIL}/")
        ws_url = f"ws://127.0.0.1:{daemon.port}/v1/sandboxes/{sb.id}/pty/x/ws"
        outcome = page.evaluate(
            """(url) => new Promise((done) => {
                const ws = new WebSocket(url);
                ws.onopen = () => done("open");
                ws.onerror = () => done("refused");
            })""",
            ws_url,
        )
        assert outcome == "refused"
        read = page.evaluate(
            """(url) => fetch(url, {credentials: "include"}).then(r => r.status, e => "refused")""",
            f"{daemon.url}/v1/sandboxes",
        )
        assert read == "refused"
    finally:
        ctx.close()
    # The daemon's own answer to that upgrade: 403 before anything else (the browser only
    # says "refused"); the same request without the foreign Origin is not refused for it.
    upgrade = {
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
    }
    path = f"{daemon.url}/v1/sandboxes/{sb.id}/pty/x/ws"
    r = httpx.get(path, headers={**upgrade, "Origin": EVIL}, timeout=30)
    assert r.status_code == 403, r.text
    r = httpx.get(path, headers=upgrade, timeout=30)
    assert r.status_code != 403, r.text


def pty_supported(daemon: Daemon, sandbox: str) -> bool:
    r = httpx.post(f"{daemon.url}/v1/sandboxes/{sandbox}/pty", json={"cols": 80, "rows": 24}, timeout=30)
    return not (r.status_code == 404 and "no such route" in r.text)


def test_open_a_terminal_type_a_command_and_resize(
    browser: Any, daemon: Daemon, dashboard_key: str, tb: Threadbox, names: Names
) -> None:
    sb = tb.create(names.new("dashpty"))
    if not pty_supported(daemon, sb.id):
        pytest.skip("this daemon has no PTY sessions yet (POST /v1/sandboxes/{id}/pty)")
    ctx, page = log_in(browser, daemon, dashboard_key)
    try:
        page.goto(f"{daemon.url}/ui/#/sb/{sb.id}/terminal")
        page.wait_for_selector("#term-status:has-text('connected')", timeout=30_000)
        page.click("#terminal")
        page.keyboard.type("echo $((6*7)); echo A=$(stty size)=A\n")
        wait_terminal(page, r"(?m)^42\s*$")
        m = wait_terminal(page, r"A=(\d+) (\d+)=A")
        rows, cols = int(m.group(1)), int(m.group(2))
        assert rows > 5 and cols > 40, (rows, cols)
        assert page.inner_text("#term-status").endswith(f"{cols}x{rows}")
        shot(page, "terminal")
        # Narrower window: the fit addon resizes, the daemon applies it, stty sees it.
        before = page.inner_text("#term-status")
        page.set_viewport_size({"width": 700, "height": 800})
        page.wait_for_function("(t) => document.querySelector('#term-status').textContent !== t", arg=before)
        page.keyboard.type("echo B=$(stty size)=B\n")
        m2 = wait_terminal(page, r"B=(\d+) (\d+)=B")
        assert int(m2.group(2)) < cols and int(m2.group(1)) == rows, (m2.group(0), rows, cols)
        page.keyboard.type("exit\n")
        page.wait_for_selector("#term-status:has-text('exited')", timeout=30_000)
    finally:
        ctx.close()


def test_the_terminal_page_speaks_the_pty_protocol(
    browser: Any, daemon: Daemon, dashboard_key: str, tb: Threadbox, names: Names
) -> None:
    """The page's half of the PTY protocol, with the daemon's half played by the test
    (Playwright's WebSocket routing): raw bytes as binary frames both ways, resize as a
    JSON text frame, the CSRF token offered as a subprotocol, exit shown. The test above
    runs the same page against the daemon's real PTY sessions."""
    sb = tb.create(names.new("dashproto"))
    ctx, page = log_in(browser, daemon, dashboard_key)
    got: list[str | bytes] = []
    offered: list[list[str]] = []
    try:
        csrf = page.get_attribute("meta[name=tb-csrf]", "content")
        page.route(
            f"**/v1/sandboxes/{sb.id}/pty",
            lambda route: route.fulfill(status=201, content_type="application/json", body='{"session":"pt-1"}'),
        )

        sockets: list[Any] = []

        def serve(ws: Any) -> None:
            sockets.append(ws)
            offered.append(list(ws.protocols))

            def on_message(m: str | bytes) -> None:
                got.append(m)
                if isinstance(m, bytes):
                    ws.send(m.replace(b"\r", b"\r\n"))  # a terminal's echo

            ws.on_message(on_message)
            ws.send(b"\x1b]52;c;cHduZWQ=\x07welcome\r\n$ ")

        page.route_web_socket(re.compile(rf".*/v1/sandboxes/{sb.id}/pty/pt-1/ws$"), serve)
        page.goto(f"{daemon.url}/ui/#/sb/{sb.id}/terminal")
        page.wait_for_selector("#term-status:has-text('connected')", timeout=30_000)
        assert offered == [[f"tb-csrf.{csrf}"]]
        wait_terminal(page, r"welcome")
        page.click("#terminal")
        page.keyboard.type("hello\n")
        wait_terminal(page, r"\$ hello")
        assert b"".join(m for m in got if isinstance(m, bytes)) == b"hello\r"
        before = page.inner_text("#term-status")
        page.set_viewport_size({"width": 700, "height": 800})
        page.wait_for_function("(t) => document.querySelector('#term-status').textContent !== t", arg=before)
        resizes = [json.loads(m) for m in got if isinstance(m, str)]
        assert resizes and resizes[-1]["type"] == "resize", got
        cols_before = int(before.split("·")[1].strip().split("x")[0])
        assert 0 < resizes[-1]["cols"] < cols_before, (resizes, before)
        # OSC 52 (a clipboard write) was swallowed, not shown and not obeyed.
        assert "52;" not in terminal_text(page)
        sockets[0].send('{"type":"exit","code":3}')
        page.wait_for_selector("#term-status:has-text('exited with 3')")
    finally:
        ctx.close()


HOSTILE_PAGE = """<!doctype html><title>preview</title><script>
window.results = (async () => {
  const out = {};
  out.cookieRead = (await fetch("/v1/sandboxes")).status;
  out.guessedToken = (await fetch("/v1/sandboxes", {headers: {"X-Threadbox-CSRF": "0".repeat(64)}})).status;
  const ui = await fetch("/ui/");
  out.uiStatus = ui.status;
  out.uiHasToken = /name="tb-csrf" content="[0-9a-f]{64}"/.test(await ui.text());
  out.write = (await fetch("/v1/keys", {method: "POST", headers: {"Content-Type": "application/json"},
    body: JSON.stringify({tenant: "default", scopes: ["admin"]})})).status;
  out.ws = await new Promise((done) => {
    const ws = new WebSocket(location.origin.replace("http", "ws") + "/v1/sandboxes/SANDBOX/pty/x/ws");
    ws.onopen = () => done("open");
    ws.onerror = () => done("refused");
  });
  const w = window.open("/ui/");
  await new Promise((r) => setTimeout(r, 1500));
  try { out.openedReadable = !!(w && w.document && w.document.querySelector("meta[name=tb-csrf]")); }
  catch (e) { out.openedReadable = false; }
  try { w && w.close(); } catch (e) {}
  return out;
})();
</script>"""


def test_a_preview_page_on_the_dashboards_origin_gets_nothing(
    browser: Any, daemon: Daemon, dashboard_key: str, tb: Threadbox, names: Names
) -> None:
    """A path-form preview (ADR 0072) lives on the daemon's origin, so the browser sends
    it the dashboard's cookie and calls its requests same-origin. Without the session's
    CSRF token, which it cannot obtain, it can read nothing, write nothing and open no
    WebSocket; the dashboard's page in the same browser (the positive control) can."""
    sb = tb.create(names.new("dashprev"))
    sb.files.write("site/index.html", HOSTILE_PAGE.replace("SANDBOX", sb.id))
    sb.processes.start(["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1", "--directory", "site"])
    probe = "import socket; socket.create_connection(('127.0.0.1', 8000), timeout=1).close()"
    deadline = time.monotonic() + 30
    while sb.exec(["python3", "-c", probe]).exit_code != 0:
        assert time.monotonic() < deadline, "the server inside the sandbox never listened"
        time.sleep(0.1)
    preview = sb.previews.create(8000, public=True)
    assert preview.path_url.startswith(daemon.url + "/preview/")
    ctx, page = log_in(browser, daemon, dashboard_key)
    try:
        control = page.evaluate(
            """() => fetch("/v1/sandboxes", {headers: {"X-Threadbox-CSRF":
                document.querySelector("meta[name=tb-csrf]").content}}).then(r => r.status)"""
        )
        assert control == 200
        hostile = ctx.new_page()
        hostile.goto(preview.path_url)
        out = hostile.evaluate("window.results")
        shot(hostile, "preview-page")
        assert out == {
            "cookieRead": 401,
            "guessedToken": 401,
            "uiStatus": 403,
            "uiHasToken": False,
            "write": 401,
            "ws": "refused",
            "openedReadable": False,
        }, out
    finally:
        ctx.close()
