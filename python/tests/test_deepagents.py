"""Deep Agents: the standard sandbox tests of langchain-tests, and a scripted agent."""

from __future__ import annotations

import importlib.metadata
import os
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

# This module runs twice (scripts/test.sh): with deepagents 0.6.12, the pin of
# requirements-test.txt, and with the newest 0.7.x (requirements-deepagents-0.7.txt).
# langchain-tests 1.1.9 (the newest) checks the 0.6 BackendProtocol contract, so at 0.6 the
# standard suite runs unmodified. deepagents 0.7.0 changed two things on purpose: `write`
# overwrites an existing file, and `glob` returns absolute paths of regular files only.
# At 0.7 the standard tests of those two are expected to fail (strict: if one passes, the
# contract moved again and this list must be looked at), and our own tests below check
# 0.7's contract instead.
DEEPAGENTS_VERSION = importlib.metadata.version("deepagents")
DA07 = tuple(int(x) for x in DEEPAGENTS_VERSION.split(".")[:2]) >= (0, 7)
CHANGED_IN_07 = (
    "test_write_existing_file_fails",
    "test_glob",
    "test_glob_basic_pattern",
    "test_glob_with_directories",
    "test_glob_hidden_files_explicitly",
    "test_glob_with_character_class",
    "test_glob_with_question_mark",
)


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


if DA07:
    for _name in CHANGED_IN_07:
        _reason = f"deepagents {DEEPAGENTS_VERSION} changed this contract on purpose (see test_contract_07_*)"
        setattr(
            TestThreadboxSandboxStandard,
            _name,
            pytest.mark.xfail(strict=True, reason=_reason)(getattr(SandboxIntegrationTests, _name)),
        )


@pytest.mark.skipif(not DA07, reason="deepagents 0.7's contract")
def test_contract_07_write_overwrites(tb: Threadbox, names: Names) -> None:
    backend = ThreadboxSandbox(sandbox=tb.create(names.new("da07-write")))
    assert backend.write("/tmp/w/a.txt", "one\n").error is None
    again = backend.write("/tmp/w/a.txt", "two\n")
    assert again.error is None, again
    assert backend.download_files(["/tmp/w/a.txt"])[0].content == b"two\n"


@pytest.mark.skipif(not DA07, reason="deepagents 0.7's contract")
def test_contract_07_glob_absolute_regular_files(tb: Threadbox, names: Names) -> None:
    sb = tb.create(names.new("da07-glob"))
    backend = ThreadboxSandbox(sandbox=sb)
    sb.exec("mkdir -p /tmp/g/sub && echo 1 > /tmp/g/a.py && echo 2 > /tmp/g/b.txt && echo 3 > /tmp/g/sub/c.py")
    everything = backend.glob("*", path="/tmp/g")
    assert everything.error is None, everything
    paths = sorted(m["path"] for m in everything.matches or [])
    assert "/tmp/g/a.py" in paths and "/tmp/g/b.txt" in paths
    assert "/tmp/g/sub" not in paths and all(p.startswith("/tmp/g/") for p in paths)  # absolute, files only
    deep = backend.glob("**/*.py", path="/tmp/g")
    assert sorted(m["path"] for m in deep.matches or []) == ["/tmp/g/a.py", "/tmp/g/sub/c.py"]


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


def test_made_up_root_paths_mean_the_home(tb: Threadbox, names: Names) -> None:
    """P10: Deep Agents gives the backend '/proj/app.py' for 'proj/app.py'; it lands in the home."""
    sb = tb.create(names.new("da-paths"))
    backend = ThreadboxSandbox(sandbox=sb)
    w = backend.write("/notes.md", "remember\n")
    assert w.error is None, w
    assert sb.files.read("/home/user/notes.md") == b"remember\n"
    assert "remember" in str(backend.read("/notes.md"))
    up = backend.upload_files([("/proj/app.py", b"print(1)\n")])
    assert up[0].error is None and sb.files.read("proj/app.py") == b"print(1)\n"
    (down,) = backend.download_files(["/proj/app.py"])
    assert down.content == b"print(1)\n"
    assert backend.execute("cat /etc/passwd").exit_code == 0  # system paths keep their meaning
    (etc,) = backend.download_files(["/etc/passwd"])
    assert etc.error is None and etc.content
    raw = ThreadboxSandbox(sandbox=sb, map_paths=False)
    assert raw.write("/elsewhere.md", "x").error is not None


def test_deep_agent_relative_paths_and_prompt(tb: Threadbox, names: Names) -> None:
    from langchain_threadbox import THREADBOX_SYSTEM_PROMPT

    assert "/home/user" in THREADBOX_SYSTEM_PROMPT and "in parallel" in THREADBOX_SYSTEM_PROMPT
    rules = [
        ScriptRule(
            "notes",
            [
                [call("write_file", file_path="proj/notes.md", content="hello\n")],
                [call("read_file", file_path="/proj/notes.md")],
            ],
        )
    ]
    agent = create_deep_agent(
        model=ScriptedChatModel(rules=rules),
        backend=ThreadboxSandbox(per_thread=True, client=tb),
        checkpointer=InMemorySaver(),
        system_prompt=THREADBOX_SYSTEM_PROMPT,
    )
    tid = names.thread("darel")
    out = agent.invoke({"messages": [HumanMessage("notes please")]}, {"configurable": {"thread_id": tid}})
    write, read = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert write.status != "error" and "hello" in str(read.content), [write.content, read.content]
    assert tb.get(thread_sandbox_name(tid)).files.read("/home/user/proj/notes.md") == b"hello\n"


def test_per_thread_id_outside_a_run_is_a_clear_error(tb: Threadbox) -> None:
    with pytest.raises(RuntimeError, match="no id outside a LangGraph run"):
        _ = ThreadboxSandbox(per_thread=True, client=tb).id


def test_execute_names_an_oom_kill(tb: Threadbox, names: Names) -> None:
    backend = ThreadboxSandbox(sandbox=tb.create(names.new("da-oom"), memory="256M"))
    r = backend.execute("python3 -c 'x = bytearray(1 << 30)'")
    assert r.exit_code == 137 and r.output.endswith("Killed: out of memory (limit 256 MiB)"), r


def test_execute_escapes_binary_output(tb: Threadbox, names: Names) -> None:
    """ADR 0024: no NUL or U+FFFD reaches the model through execute."""
    backend = ThreadboxSandbox(sandbox=tb.create(names.new("da-bin")))
    r = backend.execute("printf 'text, then ab\\377\\376cd\\000ef'; printf 'oops, a NUL\\000' >&2")
    assert "\x00" not in r.output and "\ufffd" not in r.output, repr(r.output)
    assert r.output == "text, then ab\\xff\\xfecd\\x00ef\noops, a NUL\\x00", repr(r.output)
    r = backend.execute("head -c 4096 /dev/urandom")
    assert r.output.startswith("[binary output: 4096 bytes, not shown") and "\x00" not in r.output
    # The inherited helpers parse their command's output, which stays as it came.
    backend.upload_files([("/home/user/ctl.txt", b"a\x7fb\n")])
    res = backend.read("/home/user/ctl.txt")
    assert res.error is None and res.file_data is not None and "a\x7fb" in res.file_data["content"], res


def test_a_recreated_thread_sandbox_is_announced_by_execute(tb: Threadbox, names: Names) -> None:
    """ADR 0022 for Deep Agents: the first execute after a recreation says the files are gone."""
    rules = [
        ScriptRule("make", [[call("execute", command="echo kept > keep.txt; echo made")]]),
        ScriptRule("show", [[call("execute", command="cat keep.txt || echo missing")]]),
    ]
    agent = create_deep_agent(
        model=ScriptedChatModel(rules=rules),
        backend=ThreadboxSandbox(per_thread=True, client=tb),
        checkpointer=InMemorySaver(),
    )
    tid = names.thread("darecreate")
    cfg: Any = {"configurable": {"thread_id": tid}}

    def turn(text: str) -> str:
        out = agent.invoke({"messages": [HumanMessage(text)]}, cfg)
        return str([m for m in out["messages"] if isinstance(m, ToolMessage)][-1].content)

    first = turn("make")
    assert "made" in first and "[new sandbox" not in first, first
    assert "kept" in turn("show please") and "[new sandbox" not in turn("show again")
    tb.delete(thread_sandbox_name(tid), force=True)
    after = turn("show after the delete")
    assert after.startswith("[new sandbox: this conversation's sandbox no longer existed"), after
    assert "missing" in after
    later = turn("show once more")
    assert "[new sandbox" not in later and "missing" in later, later


def test_names_that_are_not_utf8_round_trip(tb: Threadbox, names: Names) -> None:
    """ADR 0026: ls shows `\\xNN`, never a lone surrogate; the escaped path names the same file."""
    sb = tb.create(names.new("da-raw"))
    sb.exec(
        ["python3", "-c", "import os; os.mkdir(b'd\\xff'); open(b'd\\xff/caf\\xe9.txt', 'wb').write(b'bonjour\\n')"]
    )
    backend = ThreadboxSandbox(sandbox=sb)
    ls = backend.ls("/home/user")
    paths = [e["path"] for e in ls.entries or []]
    assert "/home/user/d\\xff" in paths, paths
    assert all(p.encode("utf-8") for p in paths)  # no lone surrogates
    inner = backend.ls("/home/user/d\\xff")
    assert [e["path"] for e in inner.entries or []] == ["/home/user/d\\xff/caf\\xe9.txt"], inner
    res = backend.read("/home/user/d\\xff/caf\\xe9.txt")
    assert res.error is None and res.file_data is not None and "bonjour" in res.file_data["content"], res
    edit = backend.edit("/home/user/d\\xff/caf\\xe9.txt", "bonjour", "salut")
    assert edit.error is None, edit
    (down,) = backend.download_files(["/home/user/d\\xff/caf\\xe9.txt"])
    assert down.content == b"salut\n"
    w = backend.write("/home/user/d\\xff/new\\xfe.txt", "neuf\n")
    assert w.error is None, w
    assert sb.files.read(os.fsdecode(b"d\xff/new\xfe.txt")) == b"neuf\n"
    # No alias is left behind, and a plain name is not affected.
    assert sb.exec("ls -a /tmp | grep -c threadbox-alias || true").stdout.strip() == "0"
    assert backend.ls("/home/user/nope").error is not None
