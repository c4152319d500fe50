"""The Python code stays ruff-clean and mypy-strict (python/ruff.toml, python/mypy.ini)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PYTHON = Path(__file__).resolve().parents[2]
REPO = PYTHON.parent


def _tool(name: str) -> str:
    exe = Path(sys.executable).with_name(name)
    found = str(exe) if exe.exists() else shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (it is in requirements-test.txt)")
    return found


def _run(*cmd: str, cwd: Path) -> None:
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, f"{' '.join(cmd)}:\n{p.stdout[-4000:]}\n{p.stderr[-2000:]}"


def test_ruff() -> None:
    ruff = _tool("ruff")
    _run(ruff, "check", "--config", "python/ruff.toml", "python", "examples", cwd=REPO)
    _run(ruff, "format", "--check", "--config", "python/ruff.toml", "python", "examples", cwd=REPO)


def test_mypy() -> None:
    _run(_tool("mypy"), "--config-file", "mypy.ini", "threadbox/src", "langchain-threadbox/src", "tests", cwd=PYTHON)
