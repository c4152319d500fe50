"""Templates (issue 14, ADR 0110): ``tb.templates.create()``, ``list()``, ``get()``,
``delete()`` for the sync and the async client, and ``tb.create(template=...)``.

A template is a named, immutable clone of a sandbox's disk (one of its checkpoints, or a
fresh one) with its image, limits, labels and network policy as defaults; or the same
built from an image by running shell steps in a temporary sandbox. Sandboxes created from
it get a clone of its disk and do not depend on it: deleting it leaves them intact.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx

from . import _common as c
from . import _network
from ._ops import Op, json_op

if TYPE_CHECKING:
    from ._async import AsyncThreadbox
    from ._sync import Threadbox

__all__ = ["AsyncTemplates", "BuildStep", "TemplateInfo", "Templates"]

#: A build runs as long as its steps do (each has its own timeout on the daemon).
_LONG = httpx.Timeout(None, connect=10.0)


@dataclass(frozen=True)
class TemplateInfo:
    """One template of the tenant."""

    id: str
    name: str
    #: ``sandbox <id>[:<checkpoint>]`` or ``image <name> + <n> steps``.
    source: str
    image: str
    tier: str
    memory_bytes: int
    cpus: float
    pids: int
    disk_bytes: int
    labels: dict[str, str]
    #: The egress policy its sandboxes get unless a create gives its own.
    network: dict[str, Any] | None
    #: Bytes its disk holds on the host (counted in the tenant's disk usage).
    size_bytes: int
    #: ``reflink`` (nothing copied) or ``copy``.
    method: str
    #: Existing sandboxes created from it.
    sandboxes: int
    created_at: str
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TemplateInfo:
        return cls(
            id=str(d["id"]),
            name=str(d.get("name", "")),
            source=str(d.get("source", "")),
            image=str(d.get("image", "")),
            tier=str(d.get("tier", "")),
            memory_bytes=int(d.get("memory_bytes", 0)),
            cpus=float(d.get("cpus", 0.0)),
            pids=int(d.get("pids", 0)),
            disk_bytes=int(d.get("disk_bytes", 0)),
            labels=dict(d.get("labels") or {}),
            network=d.get("network"),
            size_bytes=int(d.get("size_bytes", 0)),
            method=str(d.get("method", "")),
            sandboxes=int(d.get("sandboxes", 0)),
            created_at=str(d.get("created_at", "")),
            raw=d,
        )


@dataclass(frozen=True)
class BuildStep:
    """One build step's result."""

    run: str
    #: ``None`` when its timeout killed it.
    exit_code: int | None
    stdout: str
    stderr: str

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BuildStep:
        code = d.get("exit_code")
        return cls(
            run=str(d.get("run", "")),
            exit_code=None if code is None else int(code),
            stdout=str(d.get("stdout", "")),
            stderr=str(d.get("stderr", "")),
        )


def _path(name: str | None = None) -> str:
    return "/v1/templates" if name is None else "/v1/templates/" + quote(name, safe="")


def create_body(
    name: str,
    *,
    from_sandbox: str | None,
    checkpoint: str | None,
    image: str | None,
    run: Sequence[str] | None,
    network: _network.NetworkSpec | None,
    memory: int | str | None,
    labels: Mapping[str, str] | None,
    step_timeout_secs: float | None,
) -> dict[str, Any]:
    if isinstance(run, str):
        raise TypeError("run takes a list of shell command lines, not one string")
    body: dict[str, Any] = {"name": name}
    for k, v in (("from", from_sandbox), ("checkpoint", checkpoint), ("image", image)):
        if v is not None:
            body[k] = v
    if run:
        body["run"] = [str(s) for s in run]
    if network is not None:
        body["network"] = _network.policy_body(network)
    if memory is not None:
        body["limits"] = {"memory_bytes": c.parse_size(memory)}
    if labels:
        body["labels"] = dict(labels)
    if step_timeout_secs is not None:
        body["step_timeout_secs"] = float(step_timeout_secs)
    return body


def _created(data: Any) -> tuple[TemplateInfo, list[BuildStep]]:
    return TemplateInfo.from_dict(data["template"]), [BuildStep.from_dict(s) for s in data.get("steps", [])]


def create_op(body: dict[str, Any]) -> Op[tuple[TemplateInfo, list[BuildStep]]]:
    return json_op("POST", _path(), _created, json_body=body, timeout=_LONG)


def _list(data: Any) -> list[TemplateInfo]:
    return [TemplateInfo.from_dict(d) for d in data.get("templates", [])]


def list_op() -> Op[list[TemplateInfo]]:
    return json_op("GET", _path(), _list)


def get_op(name: str) -> Op[TemplateInfo]:
    return json_op("GET", _path(name), TemplateInfo.from_dict)


def delete_op(name: str) -> Op[None]:
    return Op("DELETE", _path(name))


class Templates:
    """The tenant's templates (``tb.templates``)."""

    def __init__(self, client: Threadbox) -> None:
        self._c = client

    def create(
        self,
        name: str,
        *,
        from_sandbox: str | None = None,
        checkpoint: str | None = None,
        image: str | None = None,
        run: Sequence[str] | None = None,
        network: _network.NetworkSpec | None = None,
        memory: int | str | None = None,
        labels: Mapping[str, str] | None = None,
        step_timeout_secs: float | None = None,
    ) -> TemplateInfo:
        """Makes template ``name``: from ``from_sandbox`` (its ``checkpoint``, or a fresh
        one), or from ``image`` by running the shell steps ``run`` in a temporary sandbox
        with ``network`` (kept as the template's policy). A failing step raises
        :class:`~threadbox.PreconditionFailed` naming it, and leaves nothing behind."""
        body = create_body(
            name,
            from_sandbox=from_sandbox,
            checkpoint=checkpoint,
            image=image,
            run=run,
            network=network,
            memory=memory,
            labels=labels,
            step_timeout_secs=step_timeout_secs,
        )
        return self._c._call(create_op(body))[0]

    def build(self, name: str, *, run: Sequence[str], **kwargs: Any) -> tuple[TemplateInfo, builtins.list[BuildStep]]:
        """Like :meth:`create` with build steps, also returning each step's output."""
        body = create_body(
            name,
            from_sandbox=None,
            checkpoint=None,
            image=kwargs.get("image"),
            run=run,
            network=kwargs.get("network"),
            memory=kwargs.get("memory"),
            labels=kwargs.get("labels"),
            step_timeout_secs=kwargs.get("step_timeout_secs"),
        )
        return self._c._call(create_op(body))

    def list(self) -> builtins.list[TemplateInfo]:
        """The tenant's templates, oldest first."""
        return self._c._call(list_op())

    def get(self, name: str) -> TemplateInfo:
        return self._c._call(get_op(name))

    def delete(self, name: str) -> None:
        """Deletes the template; sandboxes made from it keep their own disks."""
        self._c._call(delete_op(name))


class AsyncTemplates:
    """The tenant's templates (``tb.templates``) of an :class:`~threadbox.AsyncThreadbox`."""

    def __init__(self, client: AsyncThreadbox) -> None:
        self._c = client

    async def create(
        self,
        name: str,
        *,
        from_sandbox: str | None = None,
        checkpoint: str | None = None,
        image: str | None = None,
        run: Sequence[str] | None = None,
        network: _network.NetworkSpec | None = None,
        memory: int | str | None = None,
        labels: Mapping[str, str] | None = None,
        step_timeout_secs: float | None = None,
    ) -> TemplateInfo:
        """See :meth:`Templates.create`."""
        body = create_body(
            name,
            from_sandbox=from_sandbox,
            checkpoint=checkpoint,
            image=image,
            run=run,
            network=network,
            memory=memory,
            labels=labels,
            step_timeout_secs=step_timeout_secs,
        )
        return (await self._c._call(create_op(body)))[0]

    async def list(self) -> builtins.list[TemplateInfo]:
        return await self._c._call(list_op())

    async def get(self, name: str) -> TemplateInfo:
        return await self._c._call(get_op(name))

    async def delete(self, name: str) -> None:
        await self._c._call(delete_op(name))
