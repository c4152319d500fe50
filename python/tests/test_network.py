"""Egress through the SDK, the async SDK and the toolkit (issue 13), against a live daemon
whose upstreams live in a netns of the test's own (``net_upstream.py``). Verdicts are
judged by what reached the upstream, never by a ``connect()`` that appeared to work."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from conftest import Daemon, _skip_reason
from net_upstream import Upstream, egress_daemon
from test_mcp import mcp_session, ok

from langchain_threadbox import ThreadboxToolkit
from threadbox import AsyncThreadbox, InvalidArgument, NetLogRecord, PreconditionFailed, Sandbox, Threadbox

pytestmark = pytest.mark.daemon

DEADLINE = 30.0


def wait_for(what: str, cond: Callable[[], bool], deadline: float = DEADLINE) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def net_base() -> Iterator[Path]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    base = Path(tempfile.mkdtemp(prefix="threadbox-pytest-net-"))
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def upstream(net_base: Path) -> Iterator[Upstream]:
    up = Upstream(net_base)
    try:
        yield up
    finally:
        up.close()


@pytest.fixture(scope="module")
def net_daemon(upstream: Upstream, net_base: Path) -> Iterator[Daemon]:
    d = egress_daemon(upstream, net_base / "daemon")
    try:
        yield d
    finally:
        # Sandboxes outlive the daemon by design: delete them so tests leave nothing.
        with Threadbox(url=d.url) as tb:
            for sb in tb.list():
                tb.delete(sb.id, missing_ok=True)
        d.stop()


@pytest.fixture
def ntb(net_daemon: Daemon) -> Iterator[Threadbox]:
    with Threadbox(url=net_daemon.url) as client:
        yield client


def sh(sb: Sandbox, script: str) -> tuple[int | None, str]:
    r = sb.exec(["bash", "-c", script], timeout=30)
    return r.exit_code, r.stdout


def send(sb: Sandbox, host: str, port: int, payload: str) -> int | None:
    """Sends ``payload`` over a new TCP connection from inside ``sb``, then closes it."""
    return sh(sb, f"exec 3<>/dev/tcp/{host}/{port} || exit 7; printf %s {payload} >&3; exec 3>&-")[0]


def test_bad_rules_are_refused_before_anything_is_made(ntb: Threadbox) -> None:
    with pytest.raises(InvalidArgument):
        ntb.create(network="pypi.org")  # a str is a Sequence[str]: refused at run time
    with pytest.raises(InvalidArgument):
        ntb.create(network=["a.test:"])
    before = {s.id for s in ntb.list()}
    with pytest.raises(InvalidArgument):
        ntb.create(network=["*.a.*.test"])  # the daemon names the bad rule
    assert {s.id for s in ntb.list()} == before


def test_sdk_network_create_update_and_log(ntb: Threadbox, upstream: Upstream) -> None:
    with ntb.create(network=["api.test:8080,9000"]) as sb:
        info = sb.network.get()
        assert info.generation == 1
        assert info.policy is not None and info.policy["rules"][0]["host"] == "api.test"

        code, out = sh(sb, "curl -sS --max-time 10 http://api.test:8080/py-sdk")
        assert code == 0 and out == "hello from the upstream\n", out
        assert "/py-sdk" in upstream.log("http.log")

        # Follow from here: the next connection's row arrives through the long poll.
        after = sb.network.log(limit=1000).next_after
        got: list[NetLogRecord] = []

        def follow() -> None:
            for r in sb.network.follow(after=after, wait=5):
                got.append(r)
                if r.kind == "tcp" and r.port == 9000:
                    return

        t = threading.Thread(target=follow, daemon=True)
        t.start()
        payload = "PYSDK" + uuid4().hex
        assert send(sb, "api.test", 9000, payload) == 0
        wait_for("the payload at the sink", lambda: payload in upstream.log("sink.log"))
        t.join(timeout=30)
        assert not t.is_alive(), f"the follower never saw the sink's row: {got}"
        row = got[-1]
        assert row.decision == "allow" and row.name == "api.test" and row.ip == upstream.addr
        assert row.bytes_up == len(payload), row

        # Conditional update: the right generation changes it, a stale one changes nothing.
        new = sb.network.update(["api.test:8080"], if_match=1)
        assert new.generation == 2
        with pytest.raises(PreconditionFailed):
            sb.network.update(["api.test:9000"], if_match=1)
        assert sb.network.get().generation == 2
        refused = "REFUSED" + uuid4().hex
        send(sb, "api.test", 9000, refused)
        # Positive control after it, on the same sink through a rule that allows it.
        sb.network.update({"rules": [{"action": "allow", "host": "api.test", "ports": ["9000"]}]})
        control = "CONTROL" + uuid4().hex
        assert send(sb, "api.test", 9000, control) == 0
        wait_for("the control bytes", lambda: control in upstream.log("sink.log"))
        assert refused not in upstream.log("sink.log")
        denied = [r for r in sb.network.log(after=after, limit=1000).entries if r.decision == "deny"]
        assert any(r.kind == "tcp" and r.port == 9000 for r in denied), denied


def test_policy_set_while_paused_or_stopped_applies_on_resume_and_start(ntb: Threadbox, upstream: Upstream) -> None:
    with ntb.create(network=["api.test:8080"]) as sb:
        sb.pause()
        sb.network.update(["api.test:9000"])
        sb.resume()
        paused = "PAUSED" + uuid4().hex
        assert send(sb, "api.test", 9000, paused) == 0
        wait_for("bytes sent after resume", lambda: paused in upstream.log("sink.log"))

        sb.stop()
        sb.network.update(["api.test:8080"])
        sb.start()
        code, out = sh(sb, "curl -sS --max-time 10 http://api.test:8080/after-start")
        assert code == 0, out
        # The stopped sandbox's change closed 9000 again: refused, then a control.
        blocked = "STOPPED" + uuid4().hex
        send(sb, "api.test", 9000, blocked)
        sb.network.update(["api.test:9000"])
        control = "RESTARTED" + uuid4().hex
        assert send(sb, "api.test", 9000, control) == 0
        wait_for("the control bytes", lambda: control in upstream.log("sink.log"))
        assert blocked not in upstream.log("sink.log")


async def test_async_sdk_network(net_daemon: Daemon, upstream: Upstream) -> None:
    async with AsyncThreadbox(url=net_daemon.url) as atb:
        sb = await atb.create(network={"rules": [{"action": "allow", "host": "api.test", "ports": ["8080"]}]})
        try:
            assert (await sb.network.get()).generation == 1
            r = await sb.exec(["curl", "-sS", "--max-time", "10", "http://api.test:8080/py-async"])
            assert r.exit_code == 0, r.stderr
            page: Any = None
            for _ in range(100):
                page = await sb.network.log(wait=1)
                if any(e.kind == "tcp" and e.port == 8080 for e in page.entries):
                    break
            assert page is not None and any(e.name == "api.test" and e.bytes_down > 0 for e in page.entries), page
            info = await sb.network.update(["api.test:9000"], if_match=1)
            assert info.generation == 2
        finally:
            await sb.delete()


def test_toolkit_network_for_per_thread_sandboxes(ntb: Threadbox, upstream: Upstream) -> None:
    tk = ThreadboxToolkit(client=ntb, network=["api.test:8080"])
    assert "api.test:8080" in tk.run_shell.description
    assert "no network access" not in tk.run_shell.description
    assert "no network access" in ThreadboxToolkit(client=ntb).run_shell.description
    tid = "net-" + uuid4().hex[:8]
    msg = tk.run_shell.invoke(
        {
            "type": "tool_call",
            "id": "c1",
            "name": "run_shell",
            "args": {"command": "curl -sS --max-time 10 http://api.test:8080/from-toolkit"},
        },
        {"configurable": {"thread_id": tid}},
    )
    try:
        assert "hello from the upstream" in msg.content, msg.content
        assert "/from-toolkit" in upstream.log("http.log")
        sb = tk.sandbox_for({"configurable": {"thread_id": tid}})
        assert sb.network.get().policy is not None
    finally:
        tk.release_thread(tid)
    with pytest.raises(InvalidArgument):
        ThreadboxToolkit(client=ntb, network=["a.test:"])


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_mcp_create_with_network_and_read_its_log(net_daemon: Daemon, upstream: Upstream, transport: str) -> None:
    name = "mcp-net-" + uuid4().hex[:8]
    async with mcp_session(net_daemon, transport) as session:
        created = await ok(
            session,
            "sandbox_create",
            name=name,
            network={"rules": [{"action": "allow", "host": "api.test", "ports": ["8080"]}]},
        )
        assert created["sandbox"]["network_generation"] == 1
        try:
            path = f"/mcp-{transport}"
            r = await ok(session, "exec", sandbox=name, command=f"curl -sS --max-time 10 http://api.test:8080{path}")
            assert r["exit_code"] == 0, r
            assert path in upstream.log("http.log")
            rows: list[dict[str, Any]] = []
            for _ in range(100):
                page = await ok(session, "network_log", sandbox=name)
                rows = page["entries"]
                if any(e["kind"] == "tcp" and e["port"] == 8080 for e in rows):
                    break
                await asyncio.sleep(0.1)
            tcp = [e for e in rows if e["kind"] == "tcp" and e["port"] == 8080]
            assert tcp and tcp[0]["name"] == "api.test" and tcp[0]["bytes_down"] > 0, rows
        finally:
            await ok(session, "sandbox_delete", sandbox=name)
