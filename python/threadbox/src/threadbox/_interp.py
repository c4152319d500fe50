"""Persistent interpreter contexts (``sb.contexts``): variables survive between calls.

The models and the request shaping are shared; :class:`Contexts`/:class:`CodeContext`
(sync) and :class:`AsyncContexts`/:class:`AsyncCodeContext` are thin over them.
"""

from __future__ import annotations

import base64
import builtins
import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

import httpx

from . import _common as c
from . import _ops as ops
from ._errors import ProtocolError, error_from_code

if TYPE_CHECKING:
    from ._async import AsyncSandbox
    from ._sync import Sandbox

CodeStatus = Literal["ok", "exception", "interrupted", "timed_out", "context_died"]

#: Default running time of a cell before the daemon interrupts it (seconds).
DEFAULT_CELL_TIMEOUT = 300.0


@dataclasses.dataclass(frozen=True)
class Output:
    """One rich output: a MIME bundle (``data``) and its metadata."""

    data: dict[str, Any]
    metadata: dict[str, Any]
    is_main_result: bool = False

    @property
    def text(self) -> str | None:
        v = self.data.get("text/plain")
        return v if isinstance(v, str) else None

    @property
    def html(self) -> str | None:
        v = self.data.get("text/html")
        return v if isinstance(v, str) else None

    @property
    def svg(self) -> str | None:
        v = self.data.get("image/svg+xml")
        return v if isinstance(v, str) else None

    @property
    def json(self) -> Any:
        return self.data.get("application/json")

    @property
    def png(self) -> bytes | None:
        """The PNG image's bytes (decoded from the wire's base64)."""
        return self._binary("image/png")

    @property
    def jpeg(self) -> bytes | None:
        return self._binary("image/jpeg")

    def _binary(self, mime: str) -> bytes | None:
        v = self.data.get(mime)
        return base64.b64decode(v) if isinstance(v, str) else None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, is_main_result: bool = False) -> Output:
        return cls(dict(d.get("data") or {}), dict(d.get("metadata") or {}), is_main_result)


@dataclasses.dataclass(frozen=True)
class CodeError:
    """The exception a cell raised (a result of the call, not a Python exception here)."""

    name: str
    value: str
    traceback: str


@dataclasses.dataclass(frozen=True)
class Execution:
    """The outcome of :meth:`CodeContext.run`. Names follow E2B's where they overlap."""

    execution_id: str
    context_id: str
    execution_count: int
    status: CodeStatus
    stdout: str
    stderr: str
    results: list[Output]
    """``display()`` outputs and figures, then the last expression's value (``is_main_result``)."""
    error: CodeError | None
    duration_ms: int
    truncated: bool
    context_created: bool
    context_restarted: bool
    """The worker was replaced during the call: every variable of the context is gone."""
    reason: str | None
    raw: dict[str, Any]
    context_recreated: bool = False
    """This call made the context again after it was lost (a stop, an agent restart):
    the variables of the earlier one are gone; ``lost_reason`` says why."""
    lost_reason: str | None = None

    @property
    def text(self) -> str | None:
        """``text/plain`` of the last expression's value, if the cell ended with one."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None

    @property
    def images(self) -> builtins.list[bytes]:
        """Every PNG output's bytes, in order."""
        return [p for p in (r.png for r in self.results) if p is not None]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Execution:
        results = [Output.from_dict(o) for o in d.get("outputs") or []]
        if d.get("result"):
            results.append(Output.from_dict(d["result"], is_main_result=True))
        exc = d.get("exception")
        return cls(
            execution_id=d.get("execution_id", ""),
            context_id=d.get("context_id", ""),
            execution_count=int(d.get("execution_count", 0)),
            status=d.get("status", "ok"),
            stdout=d.get("stdout", ""),
            stderr=d.get("stderr", ""),
            results=results,
            error=CodeError(exc.get("name", ""), exc.get("value", ""), exc.get("traceback", "")) if exc else None,
            duration_ms=int(d.get("duration_ms", 0)),
            truncated=bool(d.get("truncated", False)),
            context_created=bool(d.get("context_created", False)),
            context_restarted=bool(d.get("context_restarted", False)),
            reason=d.get("reason"),
            raw=dict(d),
            context_recreated=bool(d.get("context_recreated", False)),
            lost_reason=d.get("lost_reason"),
        )


@dataclasses.dataclass(frozen=True)
class ContextInfo:
    id: str
    name: str
    language: str
    state: str
    execution_count: int
    generation: int
    pid: int | None
    created: bool
    reason: str | None
    """Why its state is gone, when ``state`` is ``lost``: ``oom``, ``killed``,
    ``exited:<n>``, ``stopped``, ``daemon-restart``, ``agent-restart``."""
    raw: dict[str, Any]
    recreated: bool = False
    """This call made the context again after it was lost (``lost_reason`` says why)."""
    lost_reason: str | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ContextInfo:
        return cls(
            id=d["id"],
            name=d.get("name", d["id"]),
            language=d.get("language", "python"),
            state=d.get("state", "idle"),
            execution_count=int(d.get("execution_count", 0)),
            generation=int(d.get("generation", 1)),
            pid=d.get("pid"),
            created=bool(d.get("created", False)),
            reason=d.get("reason"),
            raw=dict(d),
            recreated=bool(d.get("recreated", False)),
            lost_reason=d.get("lost_reason"),
        )


@dataclasses.dataclass(frozen=True)
class CodeEvent:
    """One event of a streamed execution, as the cell makes it (``on_output``).

    ``type`` is ``stdout``/``stderr`` (``text``), ``display``/``result`` (``output``) or
    ``exception`` (``error``).
    """

    type: str
    text: str | None
    output: Output | None
    error: CodeError | None
    raw: dict[str, Any]


OnOutput = Callable[[CodeEvent], object]


class CodeStreamFolder:
    """Sans-IO: turns the NDJSON lines of ``execute/stream`` (or of a re-attach) into
    ``on_output`` calls and, at ``end``, the :class:`Execution` the buffered call would
    have answered."""

    def __init__(self, path: str, on_output: OnOutput | None) -> None:
        self.path = path
        self.on_output = on_output
        self.execution_id: str | None = None
        self._out: list[str] = []
        self._err: list[str] = []
        self._outputs: list[dict[str, Any]] = []
        self._result: dict[str, Any] | None = None
        self._exception: dict[str, Any] | None = None
        self.execution: Execution | None = None

    def feed(self, line: str) -> None:
        if not line.strip():
            return
        try:
            ev = json.loads(line)
        except ValueError as e:
            raise ProtocolError(f"invalid code stream line: {line[:200]!r}") from e
        if not isinstance(ev, dict):
            raise ProtocolError(f"invalid code stream line: {line[:200]!r}")
        kind = ev.get("type")
        if kind == "error":
            raise error_from_code(str(ev.get("code", "internal")), str(ev.get("message", "")), path=self.path)
        if kind == "start":
            self.execution_id = ev.get("execution_id")
            return
        if kind == "end":
            d = dict(ev)
            d.pop("type", None)
            d.update(
                stdout="".join(self._out),
                stderr="".join(self._err),
                outputs=self._outputs,
                result=self._result,
                exception=self._exception,
            )
            self.execution = Execution.from_dict(d)
            return
        event: CodeEvent | None = None
        if kind in ("stdout", "stderr"):
            text = str(ev.get("text", ""))
            (self._out if kind == "stdout" else self._err).append(text)
            event = CodeEvent(kind, text, None, None, ev)
        elif kind in ("display", "result"):
            bundle = {"data": ev.get("data") or {}, "metadata": ev.get("metadata") or {}}
            if kind == "display":
                self._outputs.append(bundle)
            else:
                self._result = bundle
            event = CodeEvent(kind, None, Output.from_dict(bundle, is_main_result=kind == "result"), None, ev)
        elif kind == "exception":
            self._exception = {k: ev.get(k, "") for k in ("name", "value", "traceback")}
            err = CodeError(str(ev.get("name", "")), str(ev.get("value", "")), str(ev.get("traceback", "")))
            event = CodeEvent(kind, None, None, err, ev)
        # `keepalive` and unknown types are skipped.
        if event is not None and self.on_output is not None:
            self.on_output(event)

    def finish(self) -> Execution:
        if self.execution is None:
            raise ProtocolError("code stream ended without an end event")
        return self.execution


def stream_op(ctx_path: str, body: dict[str, Any], timeout: float | None, base: httpx.Timeout) -> ops.Op[None]:
    return ops.Op("POST", ctx_path + "/execute/stream", json_body=body, timeout=execute_timeout(base, timeout))


def attach_op(ctx_path: str, execution_id: str, base: httpx.Timeout) -> ops.Op[None]:
    # A re-attached cell may run long: no read timeout (keepalives come every 5 s).
    t = httpx.Timeout(base.connect, read=None, write=base.write, pool=base.pool)
    return ops.Op("GET", ctx_path + "/executions/" + quote(execution_id, safe=""), timeout=t)


def create_body(name: str | None, language: str, cwd: str | None, env: Mapping[str, str] | None) -> dict[str, Any]:
    body: dict[str, Any] = {"language": language}
    if name is not None:
        body["name"] = name
    if cwd is not None:
        body["cwd"] = cwd
    if env:
        body["env"] = dict(env)
    return body


def execute_body(code: str, timeout: float | None, env: Mapping[str, str] | None) -> dict[str, Any]:
    if not isinstance(code, str):
        raise TypeError("code must be a str")
    body: dict[str, Any] = {"code": code}
    if timeout is not None:
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        # The API counts whole seconds; round up so a short timeout is not zero.
        body["timeout_secs"] = max(1, int(-(-timeout // 1)))
    if env:
        body["env"] = dict(env)
    return body


def execute_timeout(client_timeout: Any, timeout: float | None) -> Any:
    # The cell's own timeout (or the daemon's default) plus a margin.
    return c.exec_http_timeout(client_timeout, DEFAULT_CELL_TIMEOUT if timeout is None else timeout)


# ---- sync -------------------------------------------------------------------------


class CodeContext:
    """One persistent context; :meth:`run` executes code in it."""

    def __init__(self, sandbox: Sandbox, info: ContextInfo) -> None:
        self._sb = sandbox
        self.info = info

    @property
    def id(self) -> str:
        return self.info.id

    def __repr__(self) -> str:
        return f"CodeContext(id={self.id!r}, name={self.info.name!r})"

    def _ctx_path(self) -> str:
        return self._sb._path("contexts", quote(self.id, safe=""))

    def run(
        self,
        code: str,
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        on_output: OnOutput | None = None,
    ) -> Execution:
        """Runs ``code``; the last expression's value is ``.text``/``.results``.

        An exception raised by the code is in ``.error`` (``status == "exception"``),
        not raised here. On a timeout the cell is interrupted (``status ==
        "timed_out"``); if it would not stop, the context is restarted and
        ``context_restarted`` says the variables are gone.

        With ``on_output``, the cell is streamed: the callback gets each
        :class:`CodeEvent` (stdout/stderr text, displays, the result, the exception)
        as the cell makes it; the returned :class:`Execution` is the same. Leaving
        early (an exception in the callback, Ctrl-C) interrupts the cell.
        """
        if on_output is not None:
            op = stream_op(self._ctx_path(), execute_body(code, timeout, env), timeout, self._sb.client._timeout)
            return self._follow(op, on_output)
        data = self._sb.client._json(
            "POST",
            self._sb._path("contexts", quote(self.id, safe=""), "execute"),
            json_body=execute_body(code, timeout, env),
            timeout=execute_timeout(self._sb.client._timeout, timeout),
        )
        return Execution.from_dict(data)

    def attach(self, execution_id: str, *, on_output: OnOutput | None = None) -> Execution:
        """Follows an execution again (after a lost connection or a daemon restart):
        its kept events from the start, then the new ones to its end. Leaving does not
        interrupt the cell."""
        return self._follow(attach_op(self._ctx_path(), execution_id, self._sb.client._timeout), on_output)

    def _follow(self, op: ops.Op[None], on_output: OnOutput | None) -> Execution:
        folder = CodeStreamFolder(op.path, on_output)
        resp = self._sb.client._open(op, stream=True)
        try:
            for line in resp.iter_lines():
                folder.feed(line)
                if folder.execution is not None:
                    break
        except httpx.TransportError as e:
            raise ops.StreamDecoder.interrupted(e) from e
        finally:
            resp.close()
        return folder.finish()

    def interrupt(self) -> bool:
        """Interrupts the running cell; False when the context was idle."""
        data = self._sb.client._json("POST", self._sb._path("contexts", quote(self.id, safe=""), "interrupt"))
        return bool(data.get("interrupted"))

    def restart(self) -> ContextInfo:
        """A fresh worker: every variable is lost."""
        self.info = ContextInfo.from_dict(
            self._sb.client._json("POST", self._sb._path("contexts", quote(self.id, safe=""), "restart"))
        )
        return self.info

    def delete(self) -> None:
        self._sb.client._send("DELETE", self._sb._path("contexts", quote(self.id, safe="")))


class Contexts:
    """The interpreter contexts of a sandbox (``sb.contexts``)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def create(
        self,
        name: str | None = None,
        *,
        language: str = "python",
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CodeContext:
        """Creates a context, or returns the existing one of that ``name``."""
        data = self._sb.client._json(
            "POST", self._sb._path("contexts"), json_body=create_body(name, language, cwd, env)
        )
        return CodeContext(self._sb, ContextInfo.from_dict(data))

    get_or_create = create

    def list(self) -> builtins.list[CodeContext]:
        data = self._sb.client._json("GET", self._sb._path("contexts"))
        return [CodeContext(self._sb, ContextInfo.from_dict(d)) for d in data.get("contexts", [])]


def run_code(
    sandbox: Sandbox,
    code: str,
    *,
    context: str = "python",
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    on_output: OnOutput | None = None,
) -> Execution:
    """``sb.run_code``: runs ``code`` in ``context`` (``python`` is made on first use)."""
    stub = ContextInfo(context, context, "python", "idle", 0, 1, None, False, None, {})
    return CodeContext(sandbox, stub).run(code, timeout=timeout, env=env, on_output=on_output)


# ---- async ------------------------------------------------------------------------


class AsyncCodeContext:
    """The async twin of :class:`CodeContext`."""

    def __init__(self, sandbox: AsyncSandbox, info: ContextInfo) -> None:
        self._sb = sandbox
        self.info = info

    @property
    def id(self) -> str:
        return self.info.id

    def _ctx_path(self) -> str:
        return self._sb._path("contexts", quote(self.id, safe=""))

    async def run(
        self,
        code: str,
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        on_output: OnOutput | None = None,
    ) -> Execution:
        """The async twin of :meth:`CodeContext.run` (``on_output`` is a plain callable)."""
        if on_output is not None:
            op = stream_op(self._ctx_path(), execute_body(code, timeout, env), timeout, self._sb.client._timeout)
            return await self._follow(op, on_output)
        data = await self._sb.client._json(
            "POST",
            self._sb._path("contexts", quote(self.id, safe=""), "execute"),
            json_body=execute_body(code, timeout, env),
            timeout=execute_timeout(self._sb.client._timeout, timeout),
        )
        return Execution.from_dict(data)

    async def attach(self, execution_id: str, *, on_output: OnOutput | None = None) -> Execution:
        """The async twin of :meth:`CodeContext.attach`."""
        return await self._follow(attach_op(self._ctx_path(), execution_id, self._sb.client._timeout), on_output)

    async def _follow(self, op: ops.Op[None], on_output: OnOutput | None) -> Execution:
        folder = CodeStreamFolder(op.path, on_output)
        resp = await self._sb.client._open(op, stream=True)
        try:
            async for line in resp.aiter_lines():
                folder.feed(line)
                if folder.execution is not None:
                    break
        except httpx.TransportError as e:
            raise ops.StreamDecoder.interrupted(e) from e
        finally:
            await resp.aclose()
        return folder.finish()

    async def interrupt(self) -> bool:
        data = await self._sb.client._json("POST", self._sb._path("contexts", quote(self.id, safe=""), "interrupt"))
        return bool(data.get("interrupted"))

    async def restart(self) -> ContextInfo:
        data = await self._sb.client._json("POST", self._sb._path("contexts", quote(self.id, safe=""), "restart"))
        self.info = ContextInfo.from_dict(data)
        return self.info

    async def delete(self) -> None:
        await self._sb.client._send("DELETE", self._sb._path("contexts", quote(self.id, safe="")))


class AsyncContexts:
    """The async twin of :class:`Contexts`."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    async def create(
        self,
        name: str | None = None,
        *,
        language: str = "python",
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> AsyncCodeContext:
        data = await self._sb.client._json(
            "POST", self._sb._path("contexts"), json_body=create_body(name, language, cwd, env)
        )
        return AsyncCodeContext(self._sb, ContextInfo.from_dict(data))

    get_or_create = create

    async def list(self) -> builtins.list[AsyncCodeContext]:
        data = await self._sb.client._json("GET", self._sb._path("contexts"))
        return [AsyncCodeContext(self._sb, ContextInfo.from_dict(d)) for d in data.get("contexts", [])]


async def run_code_async(
    sandbox: AsyncSandbox,
    code: str,
    *,
    context: str = "python",
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    on_output: OnOutput | None = None,
) -> Execution:
    stub = ContextInfo(context, context, "python", "idle", 0, 1, None, False, None, {})
    return await AsyncCodeContext(sandbox, stub).run(code, timeout=timeout, env=env, on_output=on_output)
