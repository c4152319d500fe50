"""Checkpoints, rewind and fork of a sandbox's disk (issue 14, ADR 0100): the model and
the sans-IO operations (ADR 0071) shared by the sync and async clients."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from . import _common as c
from ._models import SandboxInfo
from ._ops import Op, json_op


@dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint of a sandbox's disk."""

    id: str
    sandbox: str
    #: Unique among the sandbox's checkpoints; what :meth:`Sandbox.rewind` names.
    label: str | None
    #: The checkpoint the disk descended from when this one was taken.
    parent: str | None
    #: Bytes it holds on the host when taken (counted in the tenant's disk usage).
    size_bytes: int
    #: ``reflink`` (nothing copied) or ``copy``.
    method: str
    created_at: str
    raw: dict[str, Any] = field(repr=False, compare=False)
    #: It also holds the memory and running processes (``with_memory=True``, gvisor):
    #: a rewind to it brings them back.
    with_memory: bool = False
    #: Bytes of its memory image (included in ``size_bytes``), if it has one.
    memory_bytes: int | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CheckpointInfo:
        return cls(
            id=str(d["id"]),
            sandbox=str(d.get("sandbox", "")),
            label=d.get("label"),
            parent=d.get("parent"),
            size_bytes=int(d.get("size_bytes", 0)),
            method=str(d.get("method", "")),
            created_at=str(d.get("created_at", "")),
            raw=d,
            with_memory=bool(d.get("with_memory", False)),
            memory_bytes=None if d.get("memory_bytes") is None else int(d["memory_bytes"]),
        )


def create(sandbox: str, label: str | None, with_memory: bool = False) -> Op[CheckpointInfo]:
    body: dict[str, Any] = {} if label is None else {"label": label}
    if with_memory:
        body["with_memory"] = True
    return json_op("POST", c.sandbox_path(sandbox, "checkpoints"), CheckpointInfo.from_dict, json_body=body)


def _list(data: Any) -> list[CheckpointInfo]:
    return [CheckpointInfo.from_dict(d) for d in data.get("checkpoints", [])]


def list_(sandbox: str) -> Op[list[CheckpointInfo]]:
    return json_op("GET", c.sandbox_path(sandbox, "checkpoints"), _list)


def delete(sandbox: str, checkpoint: str) -> Op[None]:
    return Op("DELETE", c.sandbox_path(sandbox, "checkpoints", quote(checkpoint, safe="")))


def rewind(sandbox: str, to: str, drop_later: bool) -> Op[SandboxInfo]:
    body = {"to": to, "drop_later": drop_later}
    return json_op("POST", c.sandbox_path(sandbox, "rewind"), SandboxInfo.from_dict, json_body=body)


def _forks(data: Any) -> list[SandboxInfo]:
    return [SandboxInfo.from_dict(d) for d in data.get("sandboxes", [])]


def fork(
    sandbox: str,
    count: int,
    name_prefix: str | None,
    names: Sequence[str] | None = None,
    checkpoint: str | None = None,
    labels: Mapping[str, str] | None = None,
    with_memory: bool | None = None,
) -> Op[list[SandboxInfo]]:
    body: dict[str, Any] = {"count": count if names is None else len(names)}
    if name_prefix is not None:
        body["name_prefix"] = name_prefix
    if names is not None:
        body["names"] = list(names)
    if checkpoint is not None:
        body["checkpoint"] = checkpoint
    if labels is not None:
        body["labels"] = dict(labels)
    if with_memory is not None:
        body["with_memory"] = with_memory
    return json_op("POST", c.sandbox_path(sandbox, "fork"), _forks, json_body=body)
