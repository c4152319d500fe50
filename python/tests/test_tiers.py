"""The SDK's core calls on every isolation tier under test (issue 16, ADR 0123).

``THREADBOX_TEST_TIERS=jail,gvisor`` picks the tiers (default: both). A tier the daemon
lists as unavailable fails under CI (scripts/test.sh installs runsc) and is skipped with
its reason elsewhere; nothing passes quietly.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import TIERS, Daemon, Names, threadbox_bin, tier_or_skip

from threadbox import Threadbox

pytestmark = pytest.mark.daemon


def _tier(daemon: Daemon, name: str) -> dict[str, object]:
    # Through the CLI's `tiers --json`, which these tests cover too.
    out = subprocess.run(
        [str(threadbox_bin()), "tiers", "--json"],
        env={**os.environ, "THREADBOX_URL": f"unix://{daemon.socket_path}"},
        capture_output=True,
        text=True,
        check=True,
    )
    return tier_or_skip({t["name"]: t for t in json.loads(out.stdout)["tiers"]}, name)


@pytest.mark.parametrize("tier", TIERS)
def test_lifecycle_exec_and_files_on_each_tier(tb: Threadbox, daemon: Daemon, names: Names, tier: str) -> None:
    info = _tier(daemon, tier)
    sb = tb.create(names.new(f"tier-{tier}"), tier=tier)
    assert sb.info.tier == tier
    r = sb.exec(["sh", "-c", "echo hi; id -u"])
    assert r.exit_code == 0 and r.stdout == "hi\n1000\n", r
    # The kernel the sandbox sees is the one the tier reports (gVisor's sentry has its own).
    assert sb.exec(["uname", "-r"]).stdout.strip() == info["kernel"]
    sb.files.write("notes.txt", b"kept")
    assert sb.files.read_text("/home/user/notes.txt") == "kept"
    sb.pause()
    assert sb.exec(["echo", "awake"]).stdout == "awake\n"
    sb.stop()
    sb.start()
    assert sb.files.read_text("notes.txt") == "kept"
    tb.delete(sb.id)


@pytest.mark.parametrize("tier", TIERS)
def test_a_policy_on_a_tier_without_egress_is_refused(tb: Threadbox, daemon: Daemon, names: Names, tier: str) -> None:
    info = _tier(daemon, tier)
    caps = info["capabilities"]
    assert isinstance(caps, list)
    if "egress" in caps:
        pytest.skip(f"tier {tier} has egress; the refusal is for tiers without it")
    with pytest.raises(Exception, match="not supported on the"):
        tb.create(names.new("tier-net"), tier=tier, network=["example.com"])
    assert not [s for s in tb.list() if s.name and s.name.startswith("tier-net")]


@pytest.mark.parametrize("tier", TIERS)
def test_selftest_and_contexts_on_each_tier(tb: Threadbox, daemon: Daemon, names: Names, tier: str) -> None:
    _tier(daemon, tier)
    sb = tb.create(names.new(f"tier-ctx-{tier}"), tier=tier)
    report = sb.selftest()
    assert report.ok, report
    not_applying = sorted(c.name for c in report.checks if not c.applies)
    assert not_applying == (["landlock", "uid_map"] if tier == "gvisor" else []), report
    # Interpreter contexts keep their variables between calls, in each language.
    assert sb.run_code("x = 41").error is None
    assert sb.run_code("x + 1").text == "42"
    assert sb.run_code("let y = 2; y * 21", context="javascript").text == "42"
    sb.run_code("z=42", context="bash")
    assert sb.run_code("echo $z", context="bash").stdout == "42\n"
    tb.delete(sb.id)


@pytest.mark.parametrize("tier", TIERS)
def test_toolkit_on_each_tier(tb: Threadbox, daemon: Daemon, names: Names, tier: str) -> None:
    from langchain_threadbox import ThreadboxToolkit

    _tier(daemon, tier)
    name = names.new(f"tier-tk-{tier}")
    tk = ThreadboxToolkit(client=tb, sandbox=name, create=True, sandbox_options={"tier": tier}, stateful=True)
    assert "Wrote" in tk.write_file.invoke({"path": "a.txt", "content": "from the toolkit"})
    assert "from the toolkit" in tk.read_file.invoke({"path": "a.txt"})
    assert "hi" in tk.run_shell.invoke({"command": "echo hi"})
    tk.run_python.invoke({"code": "v = 6 * 7"})
    assert "42" in tk.run_python.invoke({"code": "print(v)"})
    assert tb.get(name).info.tier == tier
    tb.delete(name)


@pytest.mark.parametrize("tier", TIERS)
async def test_mcp_tools_on_each_tier(daemon: Daemon, names: Names, tier: str) -> None:
    from test_mcp import mcp_session, ok

    _tier(daemon, tier)
    async with mcp_session(daemon, "http") as session:
        name = names.new(f"tier-mcp-{tier}")
        created = await ok(session, "sandbox_create", name=name, tier=tier)
        assert created["sandbox"]["tier"] == tier
        out = await ok(session, "exec", sandbox=name, command="echo $((6*7)) from $(pwd)", cwd="/tmp")
        assert out["stdout"] == "42 from /tmp\n", out
        await ok(session, "write_file", sandbox=name, path="t.txt", content="kept")
        assert (await ok(session, "read_file", sandbox=name, path="t.txt"))["content"] == "kept"
        first = await ok(session, "run_code", sandbox=name, code="x = 20\nx + 1")
        assert first["result"]["data"]["text/plain"] == "21", first
        again = await ok(session, "run_code", sandbox=name, code="x * 2")
        assert again["result"]["data"]["text/plain"] == "40", again
        await ok(session, "sandbox_pause", sandbox=name)
        out = await ok(session, "exec", sandbox=name, command="echo awake")
        assert out["stdout"] == "awake\n"
        await ok(session, "sandbox_delete", sandbox=name)
