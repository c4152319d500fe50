"""The sans-IO core of the sync and async clients.

Every operation of the SDK is an :class:`Op`: the request to send (method, path,
query, body, timeout) and the function that turns the daemon's answer into the
result. Neither builds an HTTP connection: ``_sync.py`` and ``_async.py`` only send
an ``Op`` and hand the response to its ``parse`` (ADR 0071). The error mapping of
a failed answer and the decoding of an exec stream live here too, so the two
clients cannot drift apart.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

import httpx

from . import _common as c
from ._errors import (
    DaemonUnreachable,
    ProcessNotFound,
    ProtocolError,
    ThreadboxError,
    error_from_code,
    error_from_response,
)
from ._models import (
    EndEvent,
    ErrorEvent,
    ExecEvent,
    ExecResult,
    FileEntry,
    Health,
    OutputEvent,
    ProcessInfo,
    ProcessLogs,
    SandboxInfo,
    SelftestReport,
    exec_result,
    parse_event,
)

T = TypeVar("T")


def _nothing(resp: httpx.Response) -> None:
    return None


@dataclass(frozen=True)
class Op(Generic[T]):
    """One request and the parser of its (successful, fully read) answer."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T] = field(default=_nothing)  # type: ignore[assignment]
    params: Any = None
    json_body: Any = None
    content: Any = None
    headers: Mapping[str, str] | None = None
    timeout: httpx.Timeout | None = None

    def request_args(self, default_timeout: httpx.Timeout) -> dict[str, Any]:
        """Keyword arguments of ``httpx.Client.build_request`` (and its async twin)."""
        return {
            "method": self.method,
            "url": self.path,
            "json": self.json_body,
            "params": self.params,
            "content": self.content,
            "timeout": self.timeout or default_timeout,
            "headers": self.headers,
        }

    def with_content(self, content: Any) -> Op[T]:
        return replace(self, content=content)


# -- answers ----------------------------------------------------------------------


def parse_json(method: str, path: str, resp: httpx.Response) -> Any:
    """The JSON body of an answer (``None`` when empty)."""
    if not resp.content:
        return None
    try:
        return resp.json()
    except ValueError as e:
        raise ProtocolError(f"invalid JSON from {method} {path}: {resp.text[:200]!r}") from e


def json_op(method: str, path: str, make: Callable[[Any], T], **kw: Any) -> Op[T]:
    """An operation whose answer is JSON turned into a result by ``make``."""
    return Op(method, path, lambda resp: make(parse_json(method, path, resp)), **kw)


def unreachable(url: str, e: httpx.TransportError) -> DaemonUnreachable:
    """The error raised when the daemon cannot be reached or does not answer in time."""
    if isinstance(e, httpx.TimeoutException):
        return DaemonUnreachable(f"timed out talking to threadbox at {url}: {e!r}")
    return DaemonUnreachable(f"cannot reach threadbox at {url}: {e}")


def error_for(config: c.ClientConfig, status: int, body: bytes, path: str) -> ThreadboxError:
    """The typed error of a failed answer, with a hint when the URL holds a path."""
    err = error_from_response(status, body, path)
    if err.code == "not_found":
        err.message = c.route_hint(config, err.message)
        err.args = (err.message,)
    return err


def ignore_missing(e: ThreadboxError, missing_ok: bool) -> bool:
    """Whether a delete's error is swallowed (``missing_ok`` and the thing is gone)."""
    return missing_ok and e.code == "not_found"


# -- daemon and sandboxes -------------------------------------------------------------


def health() -> Op[Health]:
    return json_op("GET", "/healthz", Health.from_dict)


def _created(resp: httpx.Response) -> tuple[SandboxInfo, bool]:
    data = resp.json()
    return SandboxInfo.from_dict(data), c.created_from(resp.status_code, data)


def create(body: dict[str, Any]) -> Op[tuple[SandboxInfo, bool]]:
    """``POST /v1/sandboxes``: the sandbox and whether this call created it."""
    return Op("POST", "/v1/sandboxes", _created, json_body=body)


def require_name(name: str) -> str:
    if not name:
        raise ValueError("get_or_create needs a name")
    return name


def get(sandbox: str) -> Op[SandboxInfo]:
    return json_op("GET", c.sandbox_path(sandbox), SandboxInfo.from_dict)


def _infos(data: Any) -> list[SandboxInfo]:
    return [SandboxInfo.from_dict(d) for d in data.get("sandboxes", [])]


def list_sandboxes(labels: Mapping[str, str] | None, state: str | None) -> Op[list[SandboxInfo]]:
    return json_op("GET", "/v1/sandboxes", _infos, params=c.list_params(labels, state))


def delete(sandbox: str, force: bool) -> Op[None]:
    return Op("DELETE", c.sandbox_path(sandbox), params={"force": "true"} if force else None)


def lifecycle(sandbox: str, action: str) -> Op[SandboxInfo]:
    """``pause``, ``hibernate``, ``resume``, ``stop`` or ``start``."""
    return json_op("POST", c.sandbox_path(sandbox, action), SandboxInfo.from_dict)


def selftest(sandbox: str) -> Op[SelftestReport]:
    return json_op("GET", c.sandbox_path(sandbox, "selftest"), SelftestReport.from_dict)


# -- exec -------------------------------------------------------------------------------


def exec_op(sandbox: str, body: dict[str, Any], timeout: float | None, base: httpx.Timeout) -> Op[ExecResult]:
    return json_op(
        "POST",
        c.sandbox_path(sandbox, "exec"),
        ExecResult.from_dict,
        json_body=body,
        timeout=c.exec_http_timeout(base, timeout),
    )


def exec_stream_op(sandbox: str, body: dict[str, Any], timeout: float | None, base: httpx.Timeout) -> Op[None]:
    """The request of ``/exec/stream``; its answer is read line by line (:class:`StreamDecoder`)."""
    return Op(
        "POST",
        c.sandbox_path(sandbox, "exec", "stream"),
        json_body=body,
        timeout=c.exec_http_timeout(base, timeout),
    )


class StreamDecoder:
    """Turns the NDJSON lines of an exec stream into events.

    A daemon-side error event is raised as the matching :class:`ThreadboxError`;
    ``end`` holds the :class:`EndEvent` once it came.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.end: EndEvent | None = None

    def feed(self, line: str) -> ExecEvent | None:
        """The event of one line, ``None`` for a blank line or an unknown event."""
        if not line.strip():
            return None
        try:
            ev = parse_event(json.loads(line))
        except ValueError as e:
            raise ProtocolError(f"invalid exec stream line: {line[:200]!r}") from e
        if isinstance(ev, ErrorEvent):
            raise error_from_code(ev.code, ev.message, path=self.path)
        if isinstance(ev, EndEvent):
            self.end = ev
        return ev

    def finish(self) -> None:
        """Called when the lines run out: a stream without an end event is broken."""
        if self.end is None:
            raise ProtocolError("exec stream ended without an end event")

    @staticmethod
    def interrupted(e: httpx.TransportError) -> DaemonUnreachable:
        return DaemonUnreachable(f"exec stream interrupted: {e}")


class Collector:
    """Accumulates a stream's output into an :class:`ExecResult` (``collect()``)."""

    def __init__(self, on_output: Callable[[OutputEvent], object] | None) -> None:
        self._on_output = on_output
        self._out: list[bytes] = []
        self._err: list[bytes] = []

    def add(self, ev: ExecEvent) -> None:
        if isinstance(ev, OutputEvent):
            (self._out if ev.stream == "stdout" else self._err).append(ev.data)
            if self._on_output is not None:
                self._on_output(ev)

    def result(self, end: EndEvent | None) -> ExecResult:
        return exec_result(end, self._out, self._err)


# -- processes --------------------------------------------------------------------------


def _procs(data: Any) -> list[ProcessInfo]:
    return [ProcessInfo.from_dict(d) for d in data.get("processes", [])]


def process_start(sandbox: str, body: dict[str, Any]) -> Op[ProcessInfo]:
    return json_op("POST", c.sandbox_path(sandbox, "processes"), ProcessInfo.from_dict, json_body=body)


def process_list(sandbox: str) -> Op[list[ProcessInfo]]:
    return json_op("GET", c.sandbox_path(sandbox, "processes"), _procs)


def process_logs(sandbox: str, process_id: int) -> Op[ProcessLogs]:
    return json_op("GET", c.sandbox_path(sandbox, "processes", str(process_id), "logs"), ProcessLogs.from_dict)


def process_kill(sandbox: str, process_id: int, signal: int | None) -> Op[None]:
    body: dict[str, Any] = {} if signal is None else {"signal": int(signal)}
    return Op("POST", c.sandbox_path(sandbox, "processes", str(process_id), "kill"), json_body=body)


def find_process(infos: list[ProcessInfo], process_id: int) -> ProcessInfo:
    """The one process of a listing with ``process_id``; raises :class:`ProcessNotFound`."""
    for p in infos:
        if p.id == process_id:
            return p
    raise ProcessNotFound(f"process {process_id} not found", code="not_found")


# -- files ------------------------------------------------------------------------------


def _files(sandbox: str, *rest: str) -> str:
    return c.sandbox_path(sandbox, "files", *rest)


def _content(resp: httpx.Response) -> bytes:
    return resp.content


def file_read(sandbox: str, path: str, user: str | None, offset: int, length: int | None) -> Op[bytes]:
    """A file read; sent with ``stream=True`` by ``read_stream`` (then ``parse`` is not used)."""
    return Op("GET", _files(sandbox), _content, params=c.read_params(path, user, offset, length))


def file_write(sandbox: str, path: str, user: str | None, content: Any, *, streamed: bool) -> Op[None]:
    headers = {"Content-Type": "application/octet-stream"} if streamed else None
    return Op("PUT", _files(sandbox), params=c.file_params(path, user), content=content, headers=headers)


def whole_body(data: Any) -> bytes | None:
    """The bytes of a write's ``data`` sent in one piece (text as UTF-8), or ``None``
    when it is streamed (a chunk iterable or a file object)."""
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    return None


def parent_dir(path: str) -> str | None:
    """The directory to create before writing ``path`` (``None`` for a bare name)."""
    p = path.rstrip("/")
    if "/" not in p:
        return None
    return p.rsplit("/", 1)[0] or None


def _entries(data: Any) -> list[FileEntry]:
    return [FileEntry.from_dict(d) for d in data.get("entries", [])]


def file_list(sandbox: str, path: str) -> Op[list[FileEntry]]:
    return json_op("GET", _files(sandbox, "list"), _entries, params=c.file_params(path))


def file_stat(sandbox: str, path: str) -> Op[FileEntry]:
    return json_op("GET", _files(sandbox, "stat"), FileEntry.from_dict, params=c.file_params(path))


def file_mkdir(sandbox: str, path: str, parents: bool) -> Op[None]:
    params = c.file_params(path, None, parents="true" if parents else "false")
    return Op("POST", _files(sandbox, "mkdir"), params=params)


def file_remove(sandbox: str, path: str, recursive: bool) -> Op[None]:
    params = c.file_params(path, None, recursive="true" if recursive else "false")
    return Op("DELETE", _files(sandbox), params=params)
