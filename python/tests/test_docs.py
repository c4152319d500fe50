"""The READMEs' commands and snippets, run as they are written (so they cannot drift).

Every fenced block of ``README.md`` and ``python/README.md`` is listed in ``BLOCKS``: run
(against the session's daemon) or, for the few that cannot be, skipped with the reason. A
block that is added, removed or moved without updating ``BLOCKS`` fails
``test_every_block_is_accounted_for``. The one substitution: the documented default address
``http://127.0.0.1:7420`` becomes the test daemon's.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO_ROOT, Daemon, threadbox_bin

pytestmark = pytest.mark.daemon

DEFAULT_URL = "http://127.0.0.1:7420"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
RUN_PY = (
    "import ast, asyncio, sys\n"
    "src = open(sys.argv[1]).read()\n"
    "code = compile(src, sys.argv[1], 'exec', flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)\n"
    "result = eval(code, {'__name__': '__main__'})\n"
    "if asyncio.iscoroutine(result):\n"
    "    asyncio.run(result)\n"
)


class Skip(str):
    """A block that is not run, and why."""


BLOCKS: dict[tuple[str, int], str] = {
    ("README.md", 0): Skip("`make serve` is the daemon these tests start; `make test` runs this very file"),
    ("README.md", 1): "cli",
    ("README.md", 2): "pip",
    ("README.md", 3): "python",
    ("README.md", 4): "mcp_json",
    ("README.md", 5): "python",
    ("README.md", 6): Skip(
        "needs the key `keys create` prints in place of tbk_... (crates/threadbox/tests cover keys)"
    ),
    ("python/README.md", 0): "pip",
    ("python/README.md", 1): "python",
    ("python/README.md", 2): "python",
    ("python/README.md", 3): "python",
    ("python/README.md", 4): Skip("how to run this suite itself"),
}


def blocks(doc: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in FENCE.finditer((REPO_ROOT / doc).read_text())]


def test_every_block_is_accounted_for() -> None:
    found = {(doc, i) for doc in ("README.md", "python/README.md") for i in range(len(blocks(doc)))}
    assert found == set(BLOCKS), f"update BLOCKS in {__file__}: {sorted(found ^ set(BLOCKS))}"


def _env(daemon: Daemon) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("THREADBOX_")}
    env["THREADBOX_URL"] = daemon.url
    env["PATH"] = f"{threadbox_bin().parent}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    return env


def _check(p: subprocess.CompletedProcess[str], what: str) -> None:
    assert p.returncode == 0, (
        f"{what} failed ({p.returncode}):\nstdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}"
    )


def run_python(daemon: Daemon, code: str, cwd: Path) -> None:
    (cwd / "local.csv").write_text("a,b\n1,2\n")  # the file the SDK snippet uploads
    snippet = cwd / "snippet.py"
    snippet.write_text(code.replace(DEFAULT_URL, daemon.url))
    p = subprocess.run(
        [sys.executable, "-c", RUN_PY, str(snippet)],
        cwd=cwd,
        env=_env(daemon),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    _check(p, f"snippet\n{code}")


def run_cli(daemon: Daemon, code: str, cwd: Path) -> None:
    # `export PATH=$PWD/target/release:$PATH` finds the binary these tests run.
    release = cwd / "target" / "release"
    release.mkdir(parents=True)
    (release / "threadbox").symlink_to(threadbox_bin())
    p = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", code],
        cwd=cwd,
        env=_env(daemon),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    _check(p, f"commands\n{code}")
    assert "42" in p.stdout and "hi" in p.stdout


def check_pip(code: str) -> None:
    """The install line names the extras CI installs, and they are what the snippets need."""
    (line,) = [ln for ln in code.splitlines() if ln.startswith("pip install")]
    args = shlex.split(line)[2:]
    documented = [a for a, flag in zip(args[1:], args[:-1], strict=True) if flag == "-e"]
    reqs = (REPO_ROOT / "python" / "requirements-test.txt").read_text().splitlines()
    installed_by_ci = [ln.split(None, 1)[1].removeprefix("./") for ln in reqs if ln.startswith("-e ")]
    assert documented == installed_by_ci, "the README's install line and requirements-test.txt differ"
    for arg in documented:
        if "[" not in arg:
            continue
        extras = arg.split("[", 1)[1].rstrip("]").split(",")
        dist = importlib.metadata.metadata(Path(arg.split("[")[0]).name)
        provided = dist.get_all("Provides-Extra") or []
        assert set(extras) <= set(provided), (extras, provided)
        for req in dist.get_all("Requires-Dist") or []:
            if any(f"extra == '{e}'" in req or f'extra == "{e}"' in req for e in extras):
                name = re.split(r"[<>=!~ ;\[]", req, maxsplit=1)[0]
                importlib.metadata.version(name)  # raises when the extra's package is missing


async def run_mcp_json(daemon: Daemon, code: str) -> None:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    server: dict[str, Any] = json.loads(code.replace(DEFAULT_URL, daemon.url))["mcpServers"]["threadbox"]
    env = {"PATH": _env(daemon)["PATH"], **server.get("env", {})}  # stdio clients pass little more
    params = StdioServerParameters(command=server["command"], args=server["args"], env=env)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = await session.list_tools()
        assert "run_python" in {t.name for t in tools.tools}
        r = await session.call_tool("sandbox_list", {})
        assert not r.isError, r


@pytest.mark.parametrize(("doc", "index"), sorted(BLOCKS))
async def test_block(daemon: Daemon, tmp_path: Path, doc: str, index: int) -> None:
    how = BLOCKS[(doc, index)]
    if isinstance(how, Skip):
        pytest.skip(str(how))
    lang, code = blocks(doc)[index]
    if how == "python":
        assert lang == "python"
        run_python(daemon, code, tmp_path)
    elif how == "cli":
        assert lang == "sh"
        run_cli(daemon, code, tmp_path)
    elif how == "pip":
        check_pip(code)
    elif how == "mcp_json":
        assert lang == "json"
        await run_mcp_json(daemon, code)
    else:  # pragma: no cover
        raise AssertionError(how)
