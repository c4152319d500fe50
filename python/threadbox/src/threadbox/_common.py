"""Helpers shared by the sync and async clients: configuration and request bodies."""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

import httpx

from ._errors import InvalidArgument

DEFAULT_URL = "http://127.0.0.1:7420"
DEFAULT_TIMEOUT = 60.0
# Extra time given to the HTTP read on top of an exec's own timeout.
EXEC_HTTP_MARGIN = 30.0

OnExit = Literal["delete", "stop", "none"]
Command = str | Sequence[str]


@dataclass(frozen=True)
class ClientConfig:
    """Where the daemon is and how to authenticate."""

    base_url: str
    uds: str | None
    api_key: str | None
    display_url: str

    def headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        h = {"User-Agent": "threadbox-python"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        if extra:
            h.update(extra)
        return h


def resolve_config(url: str | None, api_key: str | None) -> ClientConfig:
    """Resolves the daemon URL and API key from arguments or the environment.

    ``url`` may be ``http(s)://host:port`` or ``unix:///path/to/threadbox.sock``;
    it defaults to ``$THREADBOX_URL`` and then to ``http://127.0.0.1:7420``.
    ``api_key`` defaults to ``$THREADBOX_API_KEY``.
    """
    raw = url or os.environ.get("THREADBOX_URL") or DEFAULT_URL
    key = api_key if api_key is not None else (os.environ.get("THREADBOX_API_KEY") or None)
    if raw.startswith("unix://"):
        path = raw[len("unix://") :]
        if not path:
            raise InvalidArgument(f"invalid THREADBOX_URL {raw!r}: empty socket path")
        return ClientConfig(base_url="http://localhost", uds=path, api_key=key, display_url=raw)
    if "://" not in raw:
        raw = "http://" + raw
    return ClientConfig(base_url=raw.rstrip("/"), uds=None, api_key=key, display_url=raw)


def client_timeout(timeout: float) -> httpx.Timeout:
    """The default HTTP timeout of a client; connecting never waits more than 10 s."""
    return httpx.Timeout(timeout, connect=min(timeout, 10.0))


def client_options(
    config: ClientConfig,
    timeout: httpx.Timeout,
    headers: Mapping[str, str] | None,
    hook: Any,
    response_hook: Any,
) -> dict[str, Any]:
    """Arguments of ``httpx.Client``/``httpx.AsyncClient`` besides the transport."""
    return {
        "base_url": config.base_url,
        "headers": config.headers(headers),
        "timeout": timeout,
        "event_hooks": {"request": [hook], "response": [response_hook]},
    }


def route_hint(config: ClientConfig, message: str) -> str:
    """``message``, with a hint when the daemon knows no such route because the URL
    has a path (``THREADBOX_URL=http://host:7420/v1`` is the usual mistake)."""
    if "no such route" not in message or config.uds:
        return message
    path = httpx.URL(config.base_url).path.rstrip("/")
    if not path:
        return message
    return (
        f"{message}: THREADBOX_URL is the daemon's root URL, without {path} "
        f"(for example {config.base_url[: -len(path)]}, not {config.base_url})"
    )


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(v: int | str) -> int:
    """Parses ``512M``, ``1G``, ``1.5GiB`` or a plain byte count (powers of 1024)."""
    if isinstance(v, int):
        return v
    m = _SIZE_RE.match(v)
    if not m:
        raise InvalidArgument(f"invalid size {v!r}")
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(float(m.group(1)) * mult)


def sandbox_path(sandbox: str, *rest: str) -> str:
    """``/v1/sandboxes/{sandbox}/...`` with the id or name escaped."""
    p = "/v1/sandboxes/" + quote(sandbox, safe="")
    for r in rest:
        p += "/" + r
    return p


def create_body(
    *,
    name: str | None,
    labels: Mapping[str, str] | None,
    image: str | None,
    memory: int | str | None,
    cpus: float | None,
    pids: int | None,
    idle_pause_secs: int | None,
    idle_stop_secs: int | None,
    idle_hibernate_secs: int | None = None,
    ttl_secs: int | None,
    ttl_action: Literal["stop", "delete"] | None,
    secrets: Sequence[str] | None = None,
    tier: str | None = None,
    otlp_relay: bool | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"labels": dict(labels or {})}
    if tier is not None:
        body["tier"] = tier
    if otlp_relay:
        # An OTLP/HTTP endpoint inside the sandbox, forwarded by the daemon to its own
        # collector (ADR 0091); refused by a daemon that exports no traces.
        body["otlp_relay"] = True
    if secrets:
        # Names of the tenant's secrets: each becomes an env variable holding a placeholder
        # the daemon swaps for the value only on requests to the secret's host.
        if isinstance(secrets, str):
            raise TypeError("secrets takes a list of names, not one string")
        body["secrets"] = [str(s) for s in secrets]
    if name is not None:
        body["name"] = name
    if image is not None:
        body["image"] = image
    limits: dict[str, Any] = {}
    if memory is not None:
        limits["memory_bytes"] = parse_size(memory)
    if cpus is not None:
        limits["cpus"] = float(cpus)
    if pids is not None:
        limits["pids"] = int(pids)
    if limits:
        body["limits"] = limits
    if idle_pause_secs is not None:
        body["idle_pause_secs"] = int(idle_pause_secs)
    if idle_stop_secs is not None:
        body["idle_stop_secs"] = int(idle_stop_secs)
    if idle_hibernate_secs is not None:
        body["idle_hibernate_secs"] = int(idle_hibernate_secs)
    if ttl_secs is not None:
        body["ttl_secs"] = int(ttl_secs)
    if ttl_action is not None:
        body["ttl_action"] = ttl_action
    return body


def created_from(status: int, data: Any) -> bool:
    """Whether a ``POST /v1/sandboxes`` answer says this call created the sandbox.

    The body's ``created`` is authoritative; older daemons only tell by the status
    (201 created, 200 found).
    """
    flag = data.get("created") if isinstance(data, dict) else None
    if isinstance(flag, bool):
        return flag
    return status == 201


def effective_on_exit(on_exit: OnExit, created: bool) -> OnExit:
    """What a ``with`` block ends with: only a sandbox this call created is deleted or
    stopped; an existing one (get-or-create found it) is always left alone."""
    return on_exit if created else "none"


def command_fields(cmd: Command) -> dict[str, Any]:
    """A string is a shell command line (``/bin/sh -c``); a sequence is an argv."""
    if isinstance(cmd, str):
        if not cmd:
            raise InvalidArgument("empty command")
        return {"shell": cmd}
    argv = [str(a) for a in cmd]
    if not argv:
        raise InvalidArgument("empty command")
    return {"command": argv}


def exec_body(
    cmd: Command,
    *,
    timeout: float | None,
    env: Mapping[str, str] | None,
    cwd: str | None,
    user: str | None,
    stdin: str | bytes | None,
    max_output_bytes: int | None,
) -> dict[str, Any]:
    body = command_fields(cmd)
    if env:
        body["env"] = {str(k): str(v) for k, v in env.items()}
    if cwd is not None:
        body["cwd"] = cwd
    if user is not None:
        body["user"] = user
    if stdin is not None:
        if isinstance(stdin, str):
            body["stdin"] = stdin
        else:
            try:
                body["stdin"] = stdin.decode("utf-8")
            except UnicodeDecodeError:
                body["stdin"] = base64.b64encode(stdin).decode("ascii")
                body["stdin_encoding"] = "base64"
    if timeout is not None:
        if timeout <= 0:
            raise InvalidArgument("timeout must be positive")
        body["timeout_secs"] = float(timeout)
    if max_output_bytes is not None:
        body["max_output_bytes"] = int(max_output_bytes)
    return body


def process_body(
    cmd: Command,
    *,
    env: Mapping[str, str] | None,
    cwd: str | None,
    user: str | None,
) -> dict[str, Any]:
    body = command_fields(cmd)
    if env:
        body["env"] = {str(k): str(v) for k, v in env.items()}
    if cwd is not None:
        body["cwd"] = cwd
    if user is not None:
        body["user"] = user
    return body


def exec_http_timeout(base: httpx.Timeout, timeout: float | None) -> httpx.Timeout:
    """HTTP timeout for an exec: its own timeout plus a margin, unbounded without one."""
    read = None if timeout is None else timeout + EXEC_HTTP_MARGIN
    return httpx.Timeout(connect=base.connect, read=read, write=base.write, pool=base.pool)


def list_params(labels: Mapping[str, str] | None, state: str | None) -> list[tuple[str, str]]:
    params = [("label", f"{k}={v}") for k, v in (labels or {}).items()]
    if state is not None:
        params.append(("state", state))
    return params


def file_params(path: str | bytes, user: str | None = None, **extra: str) -> dict[str, str]:
    """Query of a file route. A path that is not UTF-8 (bytes, or a ``str`` holding
    ``surrogateescape`` code points, as ``os.fsdecode`` and the SDK's listings make
    them) goes as ``path_b64``."""
    raw = path if isinstance(path, bytes) else path.encode("utf-8", "surrogateescape")
    try:
        p = {"path": raw.decode("utf-8")}
    except UnicodeDecodeError:
        p = {"path_b64": base64.b64encode(raw).decode("ascii")}
    if user is not None:
        p["user"] = user
    p.update(extra)
    return p


def read_params(path: str | bytes, user: str | None, offset: int, length: int | None) -> dict[str, str]:
    """Query of a file read; ``offset``/``length`` only when they narrow it (the daemon checks them)."""
    extra: dict[str, str] = {}
    if offset:
        extra["offset"] = str(offset)
    if length is not None:
        extra["length"] = str(length)
    return file_params(path, user, **extra)


def is_success(status: int) -> bool:
    return 200 <= status < 300
