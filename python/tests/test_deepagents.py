"""Deep Agents: the standard sandbox tests of langchain-tests, and a scripted agent."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Daemon, Names
from deepagents import create_deep_agent
from deepagents.backends.protocol import SandboxBackendProtocol
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_tests.integration_tests import SandboxIntegrationTests
from langgraph.checkpoint.memory import InMemorySaver

from langchain_threadbox import ThreadboxSandbox, thread_sandbox_name
from langchain_threadbox.testing import ScriptedChatModel, ScriptRule, call
from threadbox import Threadbox

pytestmark = pytest.mark.daemon

# The standard suite runs unmodified: langchain-tests 1.1.9 and deepagents 0.6.12 (pinned in
# requirements-test.txt) agree on the BackendProtocol contract (see python/README.md).


class TestThreadboxSandboxStandard(SandboxIntegrationTests):
    @pytest.fixture(scope="class")
    def sandbox(self, daemon: Daemon) -> Iterator[SandboxBackendProtocol]:
        client = Threadbox(daemon.url)
        sb = client.create(f"pt-standard-{uuid.uuid4().hex[:10]}")
        try:
            yield ThreadboxSandbox(sandbox=sb)
        finally:
            sb.delete(missing_ok=True)
            client.close()


async def test_python_alias_and_mixed_large_stdout(tb: Threadbox, names: Names) -> None:
    """`python` is the image's python3; large outputs from sync and async execs at once."""
    import asyncio

    backend = ThreadboxSandbox(sandbox=tb.create(names.new("da-big")))
    versions = backend.execute("python --version && python3 --version")
    assert versions.exit_code == 0, versions.output
    a, b = versions.output.split()[1::2]
    assert a == b and a.startswith("3."), versions.output
    command = "python -c \"import sys; sys.stdout.write('x' * (500 * 1024))\""
    results = await asyncio.gather(
        *(backend.aexecute(command) for _ in range(5)), asyncio.to_thread(backend.execute, command)
    )
    for r in results:
        assert r.exit_code == 0 and not r.truncated and len(r.output) >= 500 * 1024 and r.output.startswith("x")


def test_execute_semantics(tb: Threadbox, names: Names) -> None:
    backend = ThreadboxSandbox(sandbox=tb.create(names.new("da-exec")))
    r = backend.execute("echo out; echo err >&2; exit 5")
    assert r.exit_code == 5 and r.output == "out\nerr\n" and not r.truncated
    r = backend.execute("echo before; sleep 30", timeout=1)
    assert r.exit_code == 124 and "before" in r.output and "timed out after 1 seconds" in r.output
    assert backend.id == tb.get(backend.id).id


async def test_async_twins(tb: Threadbox, names: Names) -> None:
    backend = ThreadboxSandbox(sandbox=tb.create(names.new("da-async")))
    up = await backend.aupload_files([("/tmp/a/b.bin", b"\x00\xff"), ("rel.txt", b"x")])
    assert [u.error for u in up] == [None, "invalid_path"]
    down = await backend.adownload_files(["/tmp/a/b.bin", "/tmp/missing", "/tmp/a"])
    assert down[0].content == b"\x00\xff"
    assert [d.error for d in down[1:]] == ["file_not_found", "is_directory"]
    assert (await backend.aexecute("cat /tmp/a/b.bin | wc -c")).output.strip() == "2"


def test_deep_agent_per_thread(tb: Threadbox, names: Names) -> None:
    rules = [
        ScriptRule(
            "report",
            [
                [call("write_file", file_path="/home/user/report.py", content="print(sum(range(101)))\n")],
                [call("execute", command="python3 /home/user/report.py")],
            ],
            final="The answer is {last}",
        ),
        ScriptRule("look", [[call("ls", path="/home/user")]]),
    ]
    agent = create_deep_agent(
        model=ScriptedChatModel(rules=rules),
        backend=ThreadboxSandbox(per_thread=True, client=tb),
        checkpointer=InMemorySaver(),
    )
    t1, t2 = names.thread("da1"), names.thread("da2")
    out = agent.invoke({"messages": [HumanMessage("write a report")]}, {"configurable": {"thread_id": t1}})
    tools: list[Any] = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert [m.name for m in tools] == ["write_file", "execute"], [m.content for m in tools]
    assert "5050" in str(tools[-1].content)
    assert "5050" in str(out["messages"][-1].content)
    assert tb.get(thread_sandbox_name(t1)).files.read("report.py") == b"print(sum(range(101)))\n"
    out = agent.invoke({"messages": [HumanMessage("look around")]}, {"configurable": {"thread_id": t2}})
    ls = [m for m in out["messages"] if isinstance(m, ToolMessage)][-1]
    assert "report.py" not in str(ls.content)
