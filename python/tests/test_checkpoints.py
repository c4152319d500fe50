"""Checkpoints, rewind and fork from the SDK (issue 14), sync and async, on a real daemon."""

from __future__ import annotations

import asyncio

import pytest
from conftest import Names

from threadbox import AsyncThreadbox, CheckpointInfo, NotFound, Threadbox

pytestmark = pytest.mark.daemon


def test_checkpoint_rewind_fork_sync(tb: Threadbox, names: Names) -> None:
    sb = tb.create(names.new("ck"), labels={"kind": "ck"})
    sb.files.write("/home/user/f", b"one")
    ck = sb.checkpoint("clean")
    assert isinstance(ck, CheckpointInfo) and ck.label == "clean" and ck.parent is None
    sb.files.write("/home/user/f", b"two")
    assert [c.label for c in sb.checkpoints()] == ["clean"]
    info = sb.rewind("clean")
    assert info.id == sb.id and info.state == "running"
    assert sb.files.read("/home/user/f") == b"one"
    with pytest.raises(NotFound):
        sb.rewind("nope")
    forks = sb.fork(count=2)
    assert len(forks) == 2 and all(f.state == "running" for f in forks)
    assert all(f.labels == {"kind": "ck"} for f in forks)
    forks[0].files.write("/home/user/f", b"fork0")
    assert forks[1].files.read("/home/user/f") == b"one"
    assert sb.files.read("/home/user/f") == b"one"
    sb.delete_checkpoint("clean")
    assert sb.checkpoints() == []
    for f in forks:
        f.delete()
    sb.delete()


def test_checkpoint_rewind_fork_async(daemon_url: str, names: Names) -> None:
    async def main() -> None:
        async with AsyncThreadbox(daemon_url) as tb:
            sb = await tb.create(names.new("ack"))
            await sb.files.write("/home/user/f", b"one")
            await sb.checkpoint("a")
            await sb.files.write("/home/user/f", b"two")
            await sb.rewind("a")
            assert await sb.files.read("/home/user/f") == b"one"
            (fork,) = await sb.fork()
            assert await fork.files.read("/home/user/f") == b"one"
            await fork.delete()
            await sb.delete()

    asyncio.run(main())
