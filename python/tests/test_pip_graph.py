"""Packages just work (issue 13, ADR 0067), as an agent sees them: a LangGraph graph with a
scripted model pip-installs a package from an allowed local index in turn 1 and imports it
in turn 2 (a new call, the same per-thread sandbox). The index is the upstream netns's
(``net_upstream.py``); the policy allows only its host."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Daemon, _skip_reason
from graph_helpers import build_graph, turn_summary
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from net_upstream import Upstream, cli, egress_daemon

from langchain_threadbox import ThreadboxToolkit, thread_sandbox_name
from langchain_threadbox.testing import ScriptRule, call
from threadbox import Threadbox

pytestmark = pytest.mark.daemon

# No --break-system-packages, no --user: an agent's plain command.
PIP = "pip install --index-url http://pypi.test:8080/simple/ --trusted-host pypi.test tbdemo"
RULES = [
    ScriptRule("install tbdemo", [[call("run_shell", command=PIP)]]),
    ScriptRule("use tbdemo", [[call("run_python", code="import tbdemo\nprint(tbdemo.VALUE)")]]),
]


@pytest.fixture(scope="module")
def net() -> Iterator[tuple[Upstream, Daemon]]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    if shutil.which("ip") is None:
        pytest.skip("needs iproute2 (`ip`)")
    base = Path(tempfile.mkdtemp(prefix="threadbox-pytest-net-"))
    up = Upstream(base)
    try:
        d = egress_daemon(up, base / "daemon")
        try:
            yield up, d
        finally:
            d.stop()
    finally:
        up.close()
        shutil.rmtree(base, ignore_errors=True)


def cfg(tid: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": tid}}


def turn(graph: Any, tid: str, text: str) -> dict[str, Any]:
    before = len(graph.get_state(cfg(tid)).values.get("messages", []))
    return turn_summary(graph.invoke({"messages": [HumanMessage(text)]}, cfg(tid)), before)


def test_graph_pip_installs_in_turn_1_and_imports_in_turn_2(net: tuple[Upstream, Daemon]) -> None:
    up, d = net
    tid = "pipgraph1"
    with Threadbox(d.url) as tb:
        # The thread's sandbox, made ahead with the policy the toolkit will find by name.
        sb = tb.create(thread_sandbox_name(tid), labels={"managed-by": "langchain-threadbox", "langchain-thread": tid})
        try:
            r = cli(d, "net", "set", sb.id, "--allow", "pypi.test:8080")
            assert r.returncode == 0, r.stderr
            graph = build_graph(ThreadboxToolkit(client=tb, timeout=120), InMemorySaver(), rules=RULES)

            # Control: nothing to import before the install.
            probe = sb.exec(["python3", "-c", "import tbdemo"])
            assert probe.exit_code != 0

            first = turn(graph, tid, "install tbdemo")
            tool = first["tools"][0]
            assert tool["status"] == "success", tool
            assert "Successfully installed tbdemo-1.0" in tool["content"], tool["content"]
            assert "externally-managed" not in tool["content"]
            assert "/simple/tbdemo/" in up.log("http.log")

            second = turn(graph, tid, "now use tbdemo")
            tool = second["tools"][0]
            assert tool["status"] == "success", tool
            assert "tbdemo works" in tool["content"], tool["content"]
            assert tb.get(thread_sandbox_name(tid)).id == sb.id
        finally:
            sb.delete()
