"""Plain data types returned by the SDK (parsed from the daemon's JSON)."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any, Literal

from ._errors import ProtocolError

__all__ = [
    "EndEvent",
    "ErrorEvent",
    "ExecEvent",
    "ExecResult",
    "FileEntry",
    "Health",
    "Limits",
    "OutputEvent",
    "PreviewInfo",
    "ProcessInfo",
    "ProcessLogs",
    "SandboxInfo",
    "SelftestCheck",
    "SelftestReport",
    "StartEvent",
]

SandboxState = Literal["creating", "running", "paused", "hibernated", "stopped"]
TtlAction = Literal["stop", "delete"]
UserName = Literal["default", "user", "root"]
FileKind = Literal["file", "dir", "symlink", "other"]
Encoding = Literal["utf8", "base64"]


def decode_data(data: str, encoding: str) -> bytes:
    """Decodes a JSON string carrying bytes (``utf8`` text or ``base64``)."""
    if encoding == "base64":
        try:
            return base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError) as e:
            raise ProtocolError(f"invalid base64 from daemon: {e}") from e
    return data.encode("utf-8")


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


@dataclass(frozen=True)
class Health:
    """Answer of ``GET /healthz``."""

    status: str
    version: str

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Health:
        return cls(status=str(d.get("status", "")), version=str(d.get("version", "")))


@dataclass(frozen=True)
class Limits:
    """Resource limits of a sandbox."""

    memory_bytes: int
    cpus: float
    pids: int

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Limits:
        d = d or {}
        return cls(
            memory_bytes=int(d.get("memory_bytes") or 0),
            cpus=float(d.get("cpus") or 0.0),
            pids=int(d.get("pids") or 0),
        )


@dataclass(frozen=True)
class SandboxInfo:
    """A snapshot of a sandbox's metadata as reported by the daemon."""

    id: str
    name: str | None
    state: SandboxState
    labels: dict[str, str]
    image: str
    created_at: str
    last_active_at: str
    limits: Limits
    idle_pause_secs: int | None
    idle_stop_secs: int | None
    idle_hibernate_secs: int | None
    ttl_secs: int | None
    ttl_action: TtlAction
    agent_pid: int | None
    tier: str
    #: The egress policy as the daemon holds it (``rules``, ``presets``, ``default``);
    #: None while the sandbox has none and reaches nothing outside itself.
    network: dict[str, Any] | None
    #: The policy's generation (what ``If-Match`` names); 0 while it never had one.
    network_generation: int
    #: Whether it has the in-sandbox OTLP endpoint (spans forwarded to the daemon's collector).
    otlp_relay: bool
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SandboxInfo:
        try:
            return cls(
                id=str(d["id"]),
                name=d.get("name"),
                state=d.get("state", "running"),
                labels=dict(d.get("labels") or {}),
                image=str(d.get("image", "")),
                created_at=str(d.get("created_at", "")),
                last_active_at=str(d.get("last_active_at", "")),
                limits=Limits.from_dict(d.get("limits")),
                idle_pause_secs=_opt_int(d.get("idle_pause_secs")),
                idle_stop_secs=_opt_int(d.get("idle_stop_secs")),
                idle_hibernate_secs=_opt_int(d.get("idle_hibernate_secs")),
                ttl_secs=_opt_int(d.get("ttl_secs")),
                ttl_action=d.get("ttl_action", "stop"),
                agent_pid=_opt_int(d.get("agent_pid")),
                tier=str(d.get("tier", "jail")),
                network=dict(d["network"]) if d.get("network") is not None else None,
                network_generation=int(d.get("network_generation") or 0),
                otlp_relay=bool(d.get("otlp_relay", False)),
                raw=d,
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ProtocolError(f"unexpected sandbox object from daemon: {d!r}") from e


@dataclass(frozen=True)
class ExecResult:
    """Result of running a command to completion.

    ``stdout`` and ``stderr`` are text (invalid UTF-8 replaced by U+FFFD); the exact
    bytes are in ``stdout_bytes`` / ``stderr_bytes``.
    """

    exit_code: int | None
    """Exit status, ``None`` when the process was killed (timeout or signal)."""
    signal: int | None
    stdout_bytes: bytes
    stderr_bytes: bytes
    timed_out: bool
    truncated: bool
    """Either stream was cut at ``max_output_bytes``."""
    stdout_truncated: bool
    stderr_truncated: bool
    duration_ms: int
    oom_killed: bool = False
    """The kernel's OOM killer ended the call (the sandbox hit its memory limit)."""
    memory_limit_bytes: int | None = None
    """The sandbox's memory limit, given when ``oom_killed``."""

    @property
    def stdout(self) -> str:
        """Standard output as text."""
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        """Standard error as text."""
        return self.stderr_bytes.decode("utf-8", "replace")

    @property
    def ok(self) -> bool:
        """True when the command exited with status 0."""
        return self.exit_code == 0 and not self.timed_out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ExecResult:
        enc = str(d.get("encoding", "utf8"))
        return cls(
            exit_code=_opt_int(d.get("exit_code")),
            signal=_opt_int(d.get("signal")),
            stdout_bytes=decode_data(str(d.get("stdout", "")), enc),
            stderr_bytes=decode_data(str(d.get("stderr", "")), enc),
            timed_out=bool(d.get("timed_out", False)),
            truncated=bool(d.get("truncated", False)),
            stdout_truncated=bool(d.get("stdout_truncated", False)),
            stderr_truncated=bool(d.get("stderr_truncated", False)),
            duration_ms=int(d.get("duration_ms") or 0),
            oom_killed=bool(d.get("oom_killed", False)),
            memory_limit_bytes=_opt_int(d.get("memory_limit_bytes")),
        )


@dataclass(frozen=True)
class StartEvent:
    """The process started."""

    pid: int
    type: Literal["start"] = "start"


@dataclass(frozen=True)
class OutputEvent:
    """A chunk of stdout or stderr."""

    stream: Literal["stdout", "stderr"]
    data: bytes

    @property
    def type(self) -> Literal["stdout", "stderr"]:
        return self.stream

    @property
    def text(self) -> str:
        """The chunk as text (a multi-byte character may be split across chunks)."""
        return self.data.decode("utf-8", "replace")


@dataclass(frozen=True)
class EndEvent:
    """The process ended; always the last event of a successful stream."""

    exit_code: int | None
    signal: int | None
    timed_out: bool
    truncated: bool
    duration_ms: int
    oom_killed: bool = False
    memory_limit_bytes: int | None = None
    type: Literal["end"] = "end"


@dataclass(frozen=True)
class ErrorEvent:
    """The daemon reported an error mid-stream (the iterators raise it instead)."""

    code: str
    message: str
    type: Literal["error"] = "error"


ExecEvent = StartEvent | OutputEvent | EndEvent


def parse_event(d: dict[str, Any]) -> StartEvent | OutputEvent | EndEvent | ErrorEvent | None:
    """Parses one NDJSON line of ``/exec/stream``; unknown types give ``None``."""
    t = d.get("type")
    if t == "start":
        return StartEvent(pid=int(d.get("pid") or 0))
    if t in ("stdout", "stderr"):
        return OutputEvent(
            stream=t,
            data=decode_data(str(d.get("data", "")), str(d.get("encoding", "utf8"))),
        )
    if t == "end":
        return EndEvent(
            exit_code=_opt_int(d.get("exit_code")),
            signal=_opt_int(d.get("signal")),
            timed_out=bool(d.get("timed_out", False)),
            truncated=bool(d.get("truncated", False)),
            duration_ms=int(d.get("duration_ms") or 0),
            oom_killed=bool(d.get("oom_killed", False)),
            memory_limit_bytes=_opt_int(d.get("memory_limit_bytes")),
        )
    if t == "error":
        return ErrorEvent(code=str(d.get("code", "internal")), message=str(d.get("message", "")))
    return None


@dataclass(frozen=True)
class ProcessInfo:
    """A background process started with ``processes.start``."""

    id: int
    pid: int
    command: list[str]
    running: bool
    exit_code: int | None
    signal: int | None
    started_at: str

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ProcessInfo:
        return cls(
            id=int(d["id"]),
            pid=int(d.get("pid") or 0),
            command=[str(c) for c in d.get("command") or []],
            running=bool(d.get("running", False)),
            exit_code=_opt_int(d.get("exit_code")),
            signal=_opt_int(d.get("signal")),
            started_at=str(d.get("started_at", "")),
        )


@dataclass(frozen=True)
class ProcessLogs:
    """Captured output of a background process (bounded: oldest bytes dropped)."""

    stdout_bytes: bytes
    stderr_bytes: bytes
    stdout_dropped: int
    stderr_dropped: int

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", "replace")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ProcessLogs:
        enc = str(d.get("encoding", "utf8"))
        return cls(
            stdout_bytes=decode_data(str(d.get("stdout", "")), enc),
            stderr_bytes=decode_data(str(d.get("stderr", "")), enc),
            stdout_dropped=int(d.get("stdout_dropped") or 0),
            stderr_dropped=int(d.get("stderr_dropped") or 0),
        )


@dataclass(frozen=True)
class FileEntry:
    """One entry of a directory listing (or the answer of ``stat``)."""

    name: str
    path: str
    kind: FileKind
    size: int
    mode: int
    uid: int
    gid: int
    modified_at: str
    symlink_target: str | None
    name_b64: str | None = None
    """The name's bytes (base64) when they are not UTF-8; ``name`` then decodes them with
    ``surrogateescape`` (as ``os.fsdecode`` does), so passing it back names this file."""
    path_b64: str | None = None
    """The path's bytes (base64) when they are not UTF-8 (``path`` decodes them likewise)."""

    @property
    def raw_name(self) -> bytes:
        """The name's bytes as the kernel has them."""
        return self.name.encode("utf-8", "surrogateescape")

    @property
    def is_dir(self) -> bool:
        return self.kind == "dir"

    @property
    def is_file(self) -> bool:
        return self.kind == "file"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FileEntry:
        name_b64, path_b64 = d.get("name_b64"), d.get("path_b64")
        return cls(
            name=_fs_text(name_b64) if name_b64 else str(d.get("name", "")),
            path=_fs_text(path_b64) if path_b64 else str(d.get("path", "")),
            kind=d.get("kind", "other"),
            size=int(d.get("size") or 0),
            mode=int(d.get("mode") or 0),
            uid=int(d.get("uid") or 0),
            gid=int(d.get("gid") or 0),
            modified_at=str(d.get("modified_at", "")),
            symlink_target=d.get("symlink_target"),
            name_b64=name_b64,
            path_b64=path_b64,
        )


def _fs_text(b64: str) -> str:
    """Bytes of a name as ``str`` the way ``os.fsdecode`` makes them (``surrogateescape``)."""
    return base64.b64decode(b64).decode("utf-8", "surrogateescape")


@dataclass(frozen=True)
class SelftestCheck:
    """One isolation posture check."""

    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class SelftestReport:
    """Result of the sandbox's isolation self-test."""

    ok: bool
    checks: list[SelftestCheck]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SelftestReport:
        return cls(
            ok=bool(d.get("ok", False)),
            checks=[
                SelftestCheck(name=str(c.get("name", "")), ok=bool(c.get("ok")), detail=str(c.get("detail", "")))
                for c in d.get("checks") or []
            ],
        )


def exec_result(end: EndEvent | None, out: list[bytes], err: list[bytes]) -> ExecResult:
    """The result of a streamed exec: its output chunks and its end event."""
    if end is None:
        raise ProtocolError("exec stream ended without an end event")
    return ExecResult(
        exit_code=end.exit_code,
        signal=end.signal,
        stdout_bytes=b"".join(out),
        stderr_bytes=b"".join(err),
        timed_out=end.timed_out,
        truncated=end.truncated,
        stdout_truncated=end.truncated,
        stderr_truncated=end.truncated,
        duration_ms=end.duration_ms,
        oom_killed=end.oom_killed,
        memory_limit_bytes=end.memory_limit_bytes,
    )


def _opt_strs(v: Any) -> list[str] | None:
    if v is None:
        return None
    if not isinstance(v, list):
        raise TypeError(f"expected a list of strings, got {v!r}")
    return [str(x) for x in v]


@dataclass(frozen=True)
class ImageInfo:
    """An image of the daemon's catalog: ``host``, a ``rootfs`` directory or an ``oci``
    image (pulled or imported; ``reference``, ``digest``, ``layers`` and ``size_bytes``
    are set for those)."""

    name: str
    kind: str
    path: str | None
    created_at: str
    reference: str | None
    digest: str | None
    layers: int | None
    size_bytes: int | None
    #: Sandboxes that use the image (it cannot be removed while any does).
    sandboxes: int
    #: ``oci`` images: the config's ``User``, ``Entrypoint`` and ``Cmd``, as stated
    #: (shown only: the daemon starts nothing by itself).
    user: str | None = None
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ImageInfo:
        try:
            return cls(
                name=str(d["name"]),
                kind=str(d.get("kind", "")),
                path=d.get("path"),
                created_at=str(d.get("created_at", "")),
                reference=d.get("reference"),
                digest=d.get("digest"),
                layers=_opt_int(d.get("layers")),
                size_bytes=_opt_int(d.get("size_bytes")),
                sandboxes=int(d.get("sandboxes") or 0),
                user=d.get("user"),
                entrypoint=_opt_strs(d.get("entrypoint")),
                cmd=_opt_strs(d.get("cmd")),
                raw=d,
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ProtocolError(f"unexpected image object from daemon: {d!r}") from e


@dataclass(frozen=True)
class PreviewInfo:
    """A port of a sandbox published through the daemon (``sb.previews.create``).

    ``url`` is the host form (``http://{port}-{id}.{domain}:{port}/``), ``path_url`` the
    path form for hosts without wildcard DNS (apps using absolute paths break under it).
    For a private preview, the answer of the create carries ``token`` and both URLs carry
    it once (``?tb_preview=``); opening the URL swaps it for a cookie. Listings have no token.
    """

    sandbox: str
    port: int
    public: bool
    url: str
    path_url: str
    token: str | None
    created_at: str
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PreviewInfo:
        token = d.get("token")
        return cls(
            sandbox=str(d["sandbox"]),
            port=int(d["port"]),
            public=bool(d.get("public", False)),
            url=str(d.get("url", "")),
            path_url=str(d.get("path_url", "")),
            token=str(token) if token is not None else None,
            created_at=str(d.get("created_at", "")),
            raw=dict(d),
        )
