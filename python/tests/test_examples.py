"""The examples run as tests, each with one command against the session's daemon."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import EXAMPLES_DIR, Daemon

from threadbox import Threadbox

pytestmark = pytest.mark.daemon


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("codeact_graph.py", ["78498 primes below 1,000,000", "thread 2 does not see", "timed out", "deleted"]),
        ("approval_graph.py", ["[process 1] paused for approval", "[process 2] approved", "hello from"]),
        ("deep_agent.py", ["execute: n=11 mean=4.00", "Analysis finished."]),
    ],
)
def test_example(daemon: Daemon, script: str, expected: list[str]) -> None:
    with Threadbox(daemon.url) as tb:
        before = {s.id for s in tb.list()}
    env = {**os.environ, "THREADBOX_URL": daemon.url}
    p = subprocess.run(
        [sys.executable, str(EXAMPLES_DIR / script)], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert p.returncode == 0, f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    for text in expected:
        assert text in p.stdout, p.stdout
    with Threadbox(daemon.url) as tb:
        leaked = [s.name for s in tb.list() if s.id not in before]
    assert leaked == [], f"{script} left sandboxes behind: {leaked}"
