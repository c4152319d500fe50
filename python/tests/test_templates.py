"""Templates from the SDK (issue 14, ADR 0110), sync and async, and a toolkit whose
per-thread sandboxes start from one, on a real daemon."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from conftest import Names
from langchain_core.runnables import RunnableConfig

from langchain_threadbox import ThreadboxToolkit
from threadbox import AsyncThreadbox, BuildStep, NotFound, PreconditionFailed, TemplateInfo, Threadbox

pytestmark = pytest.mark.daemon


def _tname(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_templates_sync(tb: Threadbox, names: Names) -> None:
    src = tb.create(names.new("src"), labels={"kind": "tpl"}, network=["example.com"])
    src.files.write("/home/user/f", b"clean")
    src.checkpoint("clean")
    src.files.write("/home/user/f", b"later")
    name = _tname("py")
    t = tb.templates.create(name, from_sandbox=src.name, checkpoint="clean")
    assert isinstance(t, TemplateInfo)
    assert t.name == name and t.source == f"sandbox {src.id}:clean"
    assert t.labels == {"kind": "tpl"} and t.sandboxes == 0 and t.size_bytes > 0
    assert t.network is not None and "example.com" in str(t.network)
    assert name in [x.name for x in tb.templates.list()]

    kid = tb.create(names.new("kid"), template=name)
    assert kid.files.read("/home/user/f") == b"clean"
    assert kid.labels == {"kind": "tpl"}
    assert "example.com" in str(kid.info.raw.get("network"))
    kid.files.write("/home/user/f", b"mine")
    other = tb.create(names.new("other"), template=name)
    assert other.files.read("/home/user/f") == b"clean"
    assert tb.templates.get(name).sandboxes == 2

    tb.templates.delete(name)
    with pytest.raises(NotFound):
        tb.templates.get(name)
    assert kid.files.read("/home/user/f") == b"mine", "sandboxes outlive their template"
    with pytest.raises(NotFound):
        tb.create(names.new("gone"), template=name)


def test_template_build_steps_sync(tb: Threadbox) -> None:
    before = {s.id for s in tb.list()}
    bad = _tname("bad")
    with pytest.raises(PreconditionFailed, match="step 1"):
        tb.templates.create(bad, run=["echo nope >&2; exit 7"])
    assert bad not in [x.name for x in tb.templates.list()]
    assert {s.id for s in tb.list()} == before, "a failed build leaves no sandbox"

    name = _tname("built")
    t, steps = tb.templates.build(name, run=["echo hi > /home/user/x", "echo two"])
    assert [s.exit_code for s in steps] == [0, 0] and isinstance(steps[1], BuildStep)
    assert steps[1].stdout == "two\n"
    assert t.source == "image host + 2 steps"
    with tb.create(template=name) as sb:
        assert sb.files.read("/home/user/x") == b"hi\n"
    tb.templates.delete(name)


def test_templates_async(daemon_url: str) -> None:
    async def main() -> None:
        async with AsyncThreadbox(daemon_url) as tb:
            name = _tname("async")
            t = await tb.templates.create(name, run=["echo a > /home/user/a"])
            assert t.name == name
            assert name in [x.name for x in await tb.templates.list()]
            sb = await tb.create(template=name)
            assert await sb.files.read("/home/user/a") == b"a\n"
            await sb.delete()
            await tb.templates.delete(name)
            with pytest.raises(NotFound):
                await tb.templates.get(name)

    asyncio.run(main())


def test_toolkit_per_thread_sandboxes_from_a_template(tb: Threadbox) -> None:
    name = _tname("tk")
    tb.templates.create(name, run=["echo ready > /home/user/state"])
    tk = ThreadboxToolkit(client=tb, template=name, thread_prefix=f"tk-{uuid.uuid4().hex[:6]}-")
    cfg: RunnableConfig = {"configurable": {"thread_id": "t1"}}
    try:
        sb = tk.sandbox_for(cfg)
        assert sb.files.read("/home/user/state") == b"ready\n"
    finally:
        tk.release_thread("t1")
        tb.templates.delete(name)
