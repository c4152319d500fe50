"""The SDK's checkpoint operations without a daemon: what ``checkpoint(with_memory=...)``
sends and what a checkpoint with memory reads back (issue 16 scope 4, ADR 0195)."""

from __future__ import annotations

from threadbox import _checkpoints


def test_a_checkpoint_asks_for_memory_only_when_told() -> None:
    assert _checkpoints.create("sb", "l").json_body == {"label": "l"}
    assert _checkpoints.create("sb", None).json_body == {}
    assert _checkpoints.create("sb", "l", with_memory=True).json_body == {"label": "l", "with_memory": True}


def test_a_checkpoint_with_memory_reads_its_image_size() -> None:
    base = {"id": "ck-1", "sandbox": "sb", "size_bytes": 10, "method": "copy", "created_at": "t"}
    disk = _checkpoints.CheckpointInfo.from_dict(base)
    assert disk.with_memory is False
    assert disk.memory_bytes is None
    mem = _checkpoints.CheckpointInfo.from_dict({**base, "with_memory": True, "memory_bytes": 4})
    assert mem.with_memory is True
    assert mem.memory_bytes == 4
