"""Issue 15's "done means", against a real daemon: a LangGraph graph with a scripted model
and ``ThreadboxToolkit(stateful=True)`` loads a CSV into a pandas DataFrame in turn 1,
answers with ``df.describe()`` in turn 2 and gets a matplotlib chart as an image content
block in turn 3. The sandbox is paused between turns (asserted), and the daemon is
killed (SIGKILL) and started again once in the middle: the context is the agent's child,
so ``df`` survives. A ``while True`` cell interrupted by its timeout keeps the variables.

pandas and matplotlib come from the host image (the sandboxes' ``/usr``): the Debian
packages ``python3-pandas`` and ``python3-matplotlib``, which ``scripts/test.sh``
installs when ``/usr/bin/python3`` lacks them. Without them the test is skipped.
"""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
from conftest import Names
from graph_helpers import build_graph, turn_summary
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from langchain_threadbox import ThreadboxToolkit, thread_sandbox_name
from langchain_threadbox.testing import ScriptRule, call
from threadbox import Threadbox

pytestmark = [pytest.mark.daemon, pytest.mark.slow]

CSV = "month,revenue,cost\n" + "".join(f"{m},{100 + 10 * m},{50 + m}\n" for m in range(1, 13))
LOAD = "import pandas as pd\ndf = pd.read_csv('sales.csv')\ndf.shape"
DESCRIBE = "df.describe()"
CHART = (
    "import matplotlib.pyplot as plt\n"
    "fig, ax = plt.subplots(figsize=(4, 3))\n"
    "ax.plot(df['month'], df['revenue'], marker='o')\n"
    "ax.set_title('revenue by month')\n"
    "plt.show()"
)
SPIN = "spins = 0\nwhile True:\n    spins += 1"
CHECK = "(len(df), spins > 0)"

RULES = [
    ScriptRule(
        "load the sales",
        [[call("write_file", path="sales.csv", content=CSV)], [call("run_python", code=LOAD)]],
    ),
    ScriptRule("describe the sales", [[call("run_python", code=DESCRIBE)]]),
    ScriptRule("chart the revenue", [[call("run_python", code=CHART)]]),
    ScriptRule("spin forever", [[call("run_python", code=SPIN, timeout=2)]]),
    ScriptRule("is df still there", [[call("run_python", code=CHECK)]]),
]


def _host_has_pandas() -> bool:
    r = subprocess.run(["/usr/bin/python3", "-c", "import pandas, matplotlib"], capture_output=True)
    return r.returncode == 0


def cfg(tid: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": tid}}


def turn(graph: Any, tid: str, text: str) -> dict[str, Any]:
    before = len(graph.get_state(cfg(tid)).values.get("messages", []))
    return turn_summary(graph.invoke({"messages": [HumanMessage(text)]}, cfg(tid)), before)


def last_tool(r: dict[str, Any]) -> dict[str, Any]:
    tools = r["tools"]
    assert tools, r
    out: dict[str, Any] = tools[-1]
    return out


@pytest.mark.skipif(not _host_has_pandas(), reason="python3-pandas / python3-matplotlib not in the host image")
def test_csv_describe_chart_across_pauses_and_a_daemon_restart(
    tb: Threadbox, names: Names, restart_daemon: Callable[[], None]
) -> None:
    toolkit = ThreadboxToolkit(client=tb, timeout=120, stateful=True)
    graph = build_graph(toolkit, InMemorySaver(), rules=RULES)
    tid = names.thread("interp-done")
    name = thread_sandbox_name(tid)

    def pause_between_turns() -> None:
        tb.get(name).pause()
        assert tb.get(name).state == "paused"

    # Turn 1: the CSV into a DataFrame.
    r = last_tool(turn(graph, tid, "load the sales"))
    assert r["artifact"]["status"] == "ok", r
    assert "Out: (12, 3)" in r["content"], r
    ctx_id = r["artifact"]["context_id"]
    pause_between_turns()

    # The daemon dies (SIGKILL) and comes back: the context lives on in the agent.
    restart_daemon()
    assert tb.get(name).state == "paused", "the restart keeps the sandbox as it was"

    # Turn 2: df.describe() of the same DataFrame (the call resumes the sandbox).
    r = last_tool(turn(graph, tid, "describe the sales"))
    assert r["artifact"]["status"] == "ok", r
    assert r["artifact"]["context_id"] == ctx_id
    assert not r["artifact"]["context_created"] and not r["artifact"]["context_restarted"], r
    assert r["artifact"]["execution_count"] == 2, r
    for want in ("mean", "revenue", "165.0"):  # mean revenue of 110..220
        assert want in r["content"], r
    pause_between_turns()

    # Turn 3: a matplotlib chart as an image content block (no backend chosen by the code).
    r = last_tool(turn(graph, tid, "chart the revenue"))
    content = r["content"]
    assert isinstance(content, list), r
    assert content[0]["type"] == "text"
    images = [b for b in content if b.get("type") == "image"]
    assert len(images) == 1, content
    assert images[0]["mime_type"] == "image/png"
    png = base64.b64decode(images[0]["base64"])
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000
    assert images[0]["base64"][:40] not in repr(r["artifact"]), "no image bytes in the artifact"
    pause_between_turns()

    # An endless loop is interrupted by its timeout; the variables stay.
    r = last_tool(turn(graph, tid, "spin forever"))
    assert r["artifact"]["status"] == "timed_out", r
    assert not r["artifact"]["context_restarted"], r
    r = last_tool(turn(graph, tid, "is df still there"))
    assert r["artifact"]["status"] == "ok", r
    assert "Out: (12, True)" in r["content"], r
    assert r["artifact"]["context_id"] == ctx_id
