"""Issue 16's "done means", against a real daemon, on each tier that hibernates: a
LangGraph thread (scripted model, the toolkit's tools, ``ToolNode``) starts a dev server
(a background ``http.server`` on a port) and sets a variable in an interpreter context;
the thread's sandbox is hibernated, **the daemon restarted**, and the next turn finds the
server answering with the same process and the variable set.

The jail hibernates to swap (ADR 0129): the ``swap`` fixture makes a swap file for the
module and removes it afterwards (``swapon``/``swapoff``), as
``crates/threadbox/tests/hibernate.rs`` does. A tier without the ``hibernate``
capability is skipped on it, naming the capability; an unavailable tier fails under CI.
The daemon is restarted twice: once with ``kill -9`` (the conftest's ``restart``) and once
with a clean SIGTERM, the way an operator upgrades it.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import TIERS, Daemon, Names, require_tier
from graph_helpers import build_graph, turn_summary
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from langchain_threadbox import ThreadboxToolkit, thread_sandbox_name
from langchain_threadbox.testing import ScriptRule, call
from threadbox import Threadbox

pytestmark = [pytest.mark.daemon, pytest.mark.slow]

PORT = 8765

# The server detaches from the call (setsid, output to a file), so the call returns and
# the server lives on in the sandbox; its pid is kept to check it is the same process.
SERVE = (
    "mkdir -p site && echo served-before-hibernate > site/index.html && "
    f"setsid python3 -m http.server {PORT} --bind 127.0.0.1 --directory site "
    "> server.log 2>&1 < /dev/null & echo $! > server.pid; "
    f"for i in $(seq 1 200); do python3 -c \"import urllib.request as u; u.urlopen('http://127.0.0.1:{PORT}/')\" "
    "2>/dev/null && break; sleep 0.05; done; echo started $(cat server.pid)"
)
SET = "import os\nsecret = 'kept-' + os.urandom(4).hex()\nsecret"
ASK = (
    "import urllib.request\n"
    f"page = urllib.request.urlopen('http://127.0.0.1:{PORT}/', timeout=10).read().decode().strip()\n"
    "(page, secret)"
)
SERVER_PID = "cat server.pid; kill -0 $(cat server.pid) && echo alive"

RULES = [
    ScriptRule("start the dev server", [[call("run_shell", command=SERVE)]]),
    ScriptRule("remember a secret", [[call("run_python", code=SET)]]),
    ScriptRule("ask the server", [[call("run_python", code=ASK)]]),
    ScriptRule("is the server the same", [[call("run_shell", command=SERVER_PID)]]),
]


def _require_hibernate(daemon: Daemon, tier: str) -> None:
    t = require_tier(daemon, tier)
    if "hibernate" not in t["capabilities"]:  # type: ignore[operator]
        pytest.skip(f'skipped on tier {tier}: needs the "hibernate" capability')


@pytest.fixture(scope="module")
def swap() -> Iterator[Path]:
    """A 1 GiB swap file, on for the module (the jail's hibernate needs swap)."""
    if os.geteuid() != 0:
        pytest.skip("swapon needs root")
    d = Path(tempfile.mkdtemp(prefix="tb-pyswap-", dir="/var/tmp"))
    f = d / "swap"
    try:
        subprocess.run(["fallocate", "-l", "1G", str(f)], check=True, capture_output=True)
        f.chmod(0o600)
        subprocess.run(["mkswap", "-q", str(f)], check=True, capture_output=True)
        subprocess.run(["swapon", str(f)], check=True, capture_output=True)
        yield f
    finally:
        subprocess.run(["swapoff", str(f)], capture_output=True, check=False)
        f.unlink(missing_ok=True)
        d.rmdir()


def cfg(tid: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": tid}}


def turn(graph: Any, tid: str, text: str) -> dict[str, Any]:
    before = len(graph.get_state(cfg(tid)).values.get("messages", []))
    out: dict[str, Any] = turn_summary(graph.invoke({"messages": [HumanMessage(text)]}, cfg(tid)), before)
    return out


def last_tool(r: dict[str, Any]) -> dict[str, Any]:
    assert r["tools"], r
    out: dict[str, Any] = r["tools"][-1]
    assert out["status"] != "error", out
    return out


def clean_restart(daemon: Daemon) -> None:
    """SIGTERM (a clean shutdown: sandboxes are left as they are), then start again."""
    daemon.stop()
    daemon.start()


@pytest.mark.parametrize("tier", TIERS)
def test_dev_server_and_variable_survive_hibernate_and_daemon_restarts(
    daemon: Daemon, names: Names, tier: str, request: pytest.FixtureRequest
) -> None:
    _require_hibernate(daemon, tier)
    if tier == "jail":
        request.getfixturevalue("swap")
    tid = names.thread(f"hib-{tier}")
    name = thread_sandbox_name(tid)
    with Threadbox(daemon.url) as tb:
        toolkit = ThreadboxToolkit(client=tb, timeout=60, stateful=True, sandbox_options={"tier": tier})
        graph = build_graph(toolkit, InMemorySaver(), rules=RULES)

        # Turn 1: the dev server in the background, a variable in the Python context.
        r = last_tool(turn(graph, tid, "start the dev server"))
        assert "started" in r["content"], r
        pid = r["content"].split("started", 1)[1].split()[0]
        r = last_tool(turn(graph, tid, "remember a secret"))
        assert r["artifact"]["status"] == "ok", r
        ctx_id = r["artifact"]["context_id"]
        secret = r["content"].split("'")[1]
        assert secret.startswith("kept-"), r
        sb = tb.get(name)
        assert sb.info.tier == tier

        for restart in ("kill -9", "SIGTERM"):
            # Hibernated between turns, the daemon restarted while it is.
            assert tb.get(name).hibernate().state == "hibernated"
            if restart == "kill -9":
                daemon.restart()
            else:
                clean_restart(daemon)
            assert tb.get(name).state == "hibernated", f"the {restart} restart keeps it hibernated"

            # The next turn wakes it: the same server answers, the variable is set.
            r = last_tool(turn(graph, tid, "ask the server"))
            assert r["artifact"]["status"] == "ok", r
            assert r["artifact"]["context_id"] == ctx_id, r
            assert not r["artifact"]["context_created"] and not r["artifact"]["context_restarted"], r
            assert f"Out: ('served-before-hibernate', '{secret}')" in r["content"], r
            r = last_tool(turn(graph, tid, "is the server the same"))
            assert r["content"].split()[:2] == [pid, "alive"], r
            assert tb.get(name).state == "running"
