"""A sandbox's egress policy and log (``sb.network``, issue 13).

The models, the policy shaping and the operations are shared (sans-IO, ADR 0071);
:class:`Network` (sync) and :class:`AsyncNetwork` only send them.

A policy is given either as the REST body (a mapping: ``{"rules": [...], "presets":
[...], "default": "deny"}``) or as a list of allow rules in the CLI's ``--allow``
syntax: ``"api.example.com"``, ``"*.example.com:443"``, ``"10.0.0.0/8:5432"``,
``"[2001:db8::/32]:443"`` or a preset name (``"python-packages"``, ``"npm"``,
``"github"``). Everything not allowed is denied. The daemon checks the rules and
refuses a bad one with a sentence naming it.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import httpx

from . import _common as c
from . import _ops as ops
from ._errors import InvalidArgument

if TYPE_CHECKING:
    from ._async import AsyncSandbox
    from ._sync import Sandbox

#: A policy: the REST body, or a list of ``--allow`` rules.
NetworkSpec = Mapping[str, Any] | Sequence[str]

#: How long one follow request waits on the daemon for a new row (seconds).
FOLLOW_WAIT = 30.0


def _allow_rule(text: str) -> tuple[str | None, dict[str, Any] | None]:
    """One ``--allow`` value: ``(preset, None)`` or ``(None, rule)`` (the CLI's grammar)."""
    a = text.strip()
    if not a:
        raise InvalidArgument("network: empty rule")
    if not any(ch in a for ch in ".:/"):
        return a, None
    ports: str | None
    if a.startswith("["):
        target, sep, after = a[1:].partition("]")
        if not sep:
            raise InvalidArgument(f"network rule {a!r}: no closing ]")
        if after.startswith(":"):
            ports = after[1:]
        elif not after:
            ports = None
        else:
            raise InvalidArgument(f"network rule {a!r}: expected :PORTS after ]")
    elif a.count(":") > 1:
        target, ports = a, None
    else:
        target, sep, p = a.partition(":")
        ports = p if sep else None
    rule: dict[str, Any] = {"action": "allow"}
    if ports is not None:
        port_list = [p.strip() for p in ports.split(",")]
        if any(not p for p in port_list):
            raise InvalidArgument(f"network rule {a!r}: empty port in {ports!r}")
        rule["ports"] = port_list
    is_cidr = "/" in target
    if not is_cidr:
        try:
            ipaddress.ip_address(target)
            is_cidr = True
        except ValueError:
            pass
    rule["cidr" if is_cidr else "host"] = target
    return None, rule


def policy_body(network: NetworkSpec) -> dict[str, Any]:
    """The REST body of a policy given as a mapping or as ``--allow`` rules."""
    if isinstance(network, Mapping):
        return dict(network)
    if isinstance(network, (str, bytes)):
        raise InvalidArgument("network: give a list of rules (e.g. ['pypi.org']) or a policy mapping, not one string")
    rules: list[dict[str, Any]] = []
    presets: list[str] = []
    for item in network:
        if not isinstance(item, str):
            raise InvalidArgument(f"network: each rule is a string, not {type(item).__name__}")
        preset, rule = _allow_rule(item)
        if preset is not None:
            presets.append(preset)
        elif rule is not None:
            rules.append(rule)
    return {"rules": rules, "presets": presets, "default": "deny"}


def allowed_names(network: NetworkSpec) -> list[str]:
    """What a policy allows, as short phrases (hosts, CIDRs, presets) for a model's tool
    descriptions."""
    body = policy_body(network)
    out: list[str] = []
    for r in body.get("rules", []):
        if r.get("action") != "allow":
            continue
        what = r.get("host") or r.get("cidr") or "?"
        ports = r.get("ports")
        out.append(f"{what}:{','.join(ports)}" if ports else str(what))
    out += [f"{p} (preset)" for p in body.get("presets", [])]
    return out


@dataclasses.dataclass(frozen=True)
class NetworkInfo:
    """A sandbox's policy (``None`` while it has none: it reaches nothing) and its
    generation, which :meth:`Network.update`'s ``if_match`` names."""

    generation: int
    policy: dict[str, Any] | None
    raw: dict[str, Any] = dataclasses.field(repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> NetworkInfo:
        return cls(int(d.get("generation", 0)), d.get("policy"), d)


@dataclasses.dataclass(frozen=True)
class NetLogRecord:
    """One row of the egress log: a connection (written when it closed) or a DNS answer."""

    seq: int
    at_ms: int
    sandbox: str
    kind: str
    name: str | None
    ip: str | None
    port: int
    bytes_up: int
    bytes_down: int
    decision: str
    reason: str
    rule: int | None
    name_ip_mismatch: bool
    qtype: str | None
    answers: int | None
    raw: dict[str, Any] = dataclasses.field(repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> NetLogRecord:
        return cls(
            seq=int(d["seq"]),
            at_ms=int(d.get("at_ms", 0)),
            sandbox=d.get("sandbox", ""),
            kind=d.get("kind", ""),
            name=d.get("name"),
            ip=d.get("ip"),
            port=int(d.get("port", 0)),
            bytes_up=int(d.get("bytes_up", 0)),
            bytes_down=int(d.get("bytes_down", 0)),
            decision=d.get("decision", ""),
            reason=d.get("reason", ""),
            rule=d.get("rule"),
            name_ip_mismatch=bool(d.get("name_ip_mismatch", False)),
            qtype=d.get("qtype"),
            answers=d.get("answers"),
            raw=d,
        )


@dataclasses.dataclass(frozen=True)
class NetLogPage:
    """A page of the log, oldest first; ask again with ``after=page.next_after``."""

    entries: list[NetLogRecord]
    next_after: int
    dropped: int

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> NetLogPage:
        return cls(
            [NetLogRecord.from_dict(e) for e in d.get("entries", [])],
            int(d.get("next_after", 0)),
            int(d.get("dropped", 0)),
        )


# -- operations ---------------------------------------------------------------------------


def get_op(sandbox: str) -> ops.Op[NetworkInfo]:
    return ops.json_op("GET", c.sandbox_path(sandbox, "network"), NetworkInfo.from_dict)


def update_op(sandbox: str, network: NetworkSpec, if_match: int | None) -> ops.Op[NetworkInfo]:
    headers = {"If-Match": str(int(if_match))} if if_match is not None else None
    return ops.json_op(
        "PUT",
        c.sandbox_path(sandbox, "network"),
        NetworkInfo.from_dict,
        json_body=policy_body(network),
        headers=headers,
    )


def log_op(
    sandbox: str, after: int | None, limit: int | None, wait: float | None, base: httpx.Timeout
) -> ops.Op[NetLogPage]:
    params: dict[str, str] = {}
    if after is not None:
        params["after"] = str(int(after))
    if limit is not None:
        params["limit"] = str(int(limit))
    timeout = None
    if wait is not None:
        if wait < 0:
            raise InvalidArgument("wait must not be negative")
        params["wait_ms"] = str(int(wait * 1000))
        # The daemon holds the request up to `wait`: the read must outlast it.
        read = (base.read or 0.0) + wait
        timeout = httpx.Timeout(base.connect, read=read, write=base.write, pool=base.pool)
    return ops.json_op(
        "GET", c.sandbox_path(sandbox, "network", "log"), NetLogPage.from_dict, params=params, timeout=timeout
    )


class Network:
    """A sandbox's egress policy and log (``sb.network``)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def get(self) -> NetworkInfo:
        """The policy in force and its generation."""
        return self._sb.client._call(get_op(self._sb.id))

    def update(self, rules: NetworkSpec, *, if_match: int | None = None) -> NetworkInfo:
        """Replaces the policy at once; open connections it refuses are closed. With
        ``if_match`` the change is made only if the policy is still that generation
        (else :class:`PreconditionFailed`, nothing changes)."""
        return self._sb.client._call(update_op(self._sb.id, rules, if_match))

    def log(self, *, after: int | None = None, limit: int | None = None, wait: float | None = None) -> NetLogPage:
        """A page of the egress log after ``after``; with ``wait`` (seconds) and no row
        yet, the daemon waits up to that long for one."""
        client = self._sb.client
        return client._call(log_op(self._sb.id, after, limit, wait, client._timeout))

    def follow(self, *, after: int | None = None, wait: float = FOLLOW_WAIT) -> Iterator[NetLogRecord]:
        """Every row after ``after`` as it arrives (an endless iterator: break out)."""
        while True:
            page = self.log(after=after, wait=wait)
            yield from page.entries
            after = page.next_after


class AsyncNetwork:
    """The async twin of :class:`Network`."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    async def get(self) -> NetworkInfo:
        return await self._sb.client._call(get_op(self._sb.id))

    async def update(self, rules: NetworkSpec, *, if_match: int | None = None) -> NetworkInfo:
        return await self._sb.client._call(update_op(self._sb.id, rules, if_match))

    async def log(self, *, after: int | None = None, limit: int | None = None, wait: float | None = None) -> NetLogPage:
        client = self._sb.client
        return await client._call(log_op(self._sb.id, after, limit, wait, client._timeout))

    async def follow(self, *, after: int | None = None, wait: float = FOLLOW_WAIT) -> AsyncIterator[NetLogRecord]:
        while True:
            page = await self.log(after=after, wait=wait)
            for e in page.entries:
                yield e
            after = page.next_after
