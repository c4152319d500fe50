"""The asyncio client: :class:`AsyncThreadbox`, :class:`AsyncSandbox` and friends.

It mirrors the synchronous API method for method; every call is a coroutine.
"""

from __future__ import annotations

import asyncio
import builtins
import json
import os
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal

import httpx

from . import _common as c
from . import _interp, _tracing
from ._errors import (
    DaemonUnreachable,
    FileNotFound,
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

__all__ = [
    "AsyncExecStream",
    "AsyncFiles",
    "AsyncProcess",
    "AsyncProcesses",
    "AsyncSandbox",
    "AsyncThreadbox",
]

_CHUNK = 1 << 16


class AsyncThreadbox:
    """Asyncio client of a threadbox daemon (same arguments as :class:`Threadbox`).

    Example:
        >>> async with AsyncThreadbox() as tb:
        ...     async with await tb.create(name="demo") as sb:
        ...         print((await sb.exec("echo hi")).stdout)
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float = c.DEFAULT_TIMEOUT,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._config = c.resolve_config(url, api_key)
        self._timeout = httpx.Timeout(timeout, connect=min(timeout, 10.0))
        if transport is None and self._config.uds:
            transport = httpx.AsyncHTTPTransport(uds=self._config.uds)
        self._http = httpx.AsyncClient(
            base_url=self._config.base_url,
            headers=self._config.headers(headers),
            timeout=self._timeout,
            transport=transport,
            event_hooks={"request": [_tracing.async_request_hook]},
        )

    @property
    def url(self) -> str:
        """The daemon URL this client talks to."""
        return self._config.display_url

    async def _send(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: Any = None,
        content: Any = None,
        timeout: httpx.Timeout | None = None,
        stream: bool = False,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        req = self._http.build_request(
            method,
            path,
            json=json_body,
            params=params,
            content=content,
            timeout=timeout or self._timeout,
            headers=headers,
        )
        try:
            resp = await self._http.send(req, stream=stream)
        except httpx.TimeoutException as e:
            raise DaemonUnreachable(f"timed out talking to threadbox at {self.url}: {e!r}") from e
        except httpx.TransportError as e:
            raise DaemonUnreachable(f"cannot reach threadbox at {self.url}: {e}") from e
        if not c.is_success(resp.status_code):
            try:
                body = await resp.aread()
            finally:
                await resp.aclose()
            err = error_from_response(resp.status_code, body, path)
            if err.code == "not_found":
                err.message = c.route_hint(self._config, err.message)
                err.args = (err.message,)
            raise err
        return resp

    async def _json(self, method: str, path: str, **kw: Any) -> Any:
        resp = await self._send(method, path, **kw)
        if not resp.content:
            return None
        try:
            return resp.json()
        except ValueError as e:
            raise ProtocolError(f"invalid JSON from {method} {path}: {resp.text[:200]!r}") from e

    async def aclose(self) -> None:
        """Closes the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncThreadbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def health(self) -> Health:
        """``GET /healthz``."""
        return Health.from_dict(await self._json("GET", "/healthz"))

    async def create(
        self,
        name: str | None = None,
        *,
        labels: Mapping[str, str] | None = None,
        image: str | None = None,
        memory: int | str | None = None,
        cpus: float | None = None,
        pids: int | None = None,
        idle_pause_secs: int | None = None,
        idle_stop_secs: int | None = None,
        ttl_secs: int | None = None,
        ttl_action: Literal["stop", "delete"] | None = None,
        on_exit: c.OnExit = "delete",
    ) -> AsyncSandbox:
        """Creates a sandbox, or returns the existing one with this ``name``.

        ``on_exit`` (what ``async with`` does at the end) applies only when this call
        created the sandbox; an existing one is left alone.
        """
        body = c.create_body(
            name=name,
            labels=labels,
            image=image,
            memory=memory,
            cpus=cpus,
            pids=pids,
            idle_pause_secs=idle_pause_secs,
            idle_stop_secs=idle_stop_secs,
            ttl_secs=ttl_secs,
            ttl_action=ttl_action,
        )
        resp = await self._send("POST", "/v1/sandboxes", json_body=body)
        data = resp.json()
        created = c.created_from(resp.status_code, data)
        return AsyncSandbox(
            self, SandboxInfo.from_dict(data), created=created, on_exit=c.effective_on_exit(on_exit, created)
        )

    async def get_or_create(
        self,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        image: str | None = None,
        memory: int | str | None = None,
        cpus: float | None = None,
        pids: int | None = None,
        idle_pause_secs: int | None = None,
        idle_stop_secs: int | None = None,
        ttl_secs: int | None = None,
        ttl_action: Literal["stop", "delete"] | None = None,
        on_exit: c.OnExit = "delete",
    ) -> AsyncSandbox:
        """Returns the sandbox named ``name``, creating it when it does not exist.

        ``async with await tb.get_or_create(name) as sb:`` deletes it at the end only
        when this call created it, never a sandbox that already existed.
        """
        if not name:
            raise ValueError("get_or_create needs a name")
        return await self.create(
            name,
            labels=labels,
            image=image,
            memory=memory,
            cpus=cpus,
            pids=pids,
            idle_pause_secs=idle_pause_secs,
            idle_stop_secs=idle_stop_secs,
            ttl_secs=ttl_secs,
            ttl_action=ttl_action,
            on_exit=on_exit,
        )

    async def get(self, sandbox: str, *, on_exit: c.OnExit = "none") -> AsyncSandbox:
        """Fetches a sandbox by id or name; raises :class:`SandboxNotFound`."""
        info = SandboxInfo.from_dict(await self._json("GET", c.sandbox_path(sandbox)))
        return AsyncSandbox(self, info, on_exit=on_exit)

    async def list(
        self,
        labels: Mapping[str, str] | None = None,
        *,
        state: Literal["creating", "running", "paused", "stopped"] | None = None,
    ) -> builtins.list[AsyncSandbox]:
        """Lists sandboxes having all of ``labels`` (and in ``state``, if given)."""
        data = await self._json("GET", "/v1/sandboxes", params=c.list_params(labels, state))
        return [AsyncSandbox(self, SandboxInfo.from_dict(d), on_exit="none") for d in data.get("sandboxes", [])]

    async def delete(self, sandbox: str, *, force: bool = True, missing_ok: bool = False) -> None:
        """Deletes a sandbox by id or name."""
        params = {"force": "true"} if force else None
        try:
            await self._send("DELETE", c.sandbox_path(sandbox), params=params)
        except ThreadboxError as e:
            if not (missing_ok and e.code == "not_found"):
                raise


class AsyncSandbox:
    """Asyncio handle on one sandbox (see :class:`threadbox.Sandbox`).

    ``async with sandbox:`` deletes, stops or leaves it at the end per ``on_exit``.
    """

    def __init__(
        self,
        client: AsyncThreadbox,
        info: SandboxInfo,
        *,
        created: bool = False,
        on_exit: c.OnExit = "none",
    ) -> None:
        self.client = client
        self.info = info
        self.created = created
        self.on_exit: c.OnExit = on_exit
        self.files = AsyncFiles(self)
        self.processes = AsyncProcesses(self)
        self.contexts = _interp.AsyncContexts(self)

    def __repr__(self) -> str:
        return f"AsyncSandbox(id={self.id!r}, name={self.name!r}, state={self.state!r})"

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def name(self) -> str | None:
        return self.info.name

    @property
    def state(self) -> str:
        return self.info.state

    @property
    def labels(self) -> dict[str, str]:
        return self.info.labels

    def _path(self, *rest: str) -> str:
        return c.sandbox_path(self.id, *rest)

    async def refresh(self) -> SandboxInfo:
        """Reloads the metadata from the daemon."""
        self.info = SandboxInfo.from_dict(await self.client._json("GET", self._path()))
        return self.info

    async def _lifecycle(self, action: str) -> SandboxInfo:
        self.info = SandboxInfo.from_dict(await self.client._json("POST", self._path(action)))
        return self.info

    async def pause(self) -> SandboxInfo:
        """Freezes every process of the sandbox."""
        return await self._lifecycle("pause")

    async def resume(self) -> SandboxInfo:
        """Thaws a paused sandbox."""
        return await self._lifecycle("resume")

    async def stop(self) -> SandboxInfo:
        """Stops the sandbox's processes; its files are kept."""
        return await self._lifecycle("stop")

    async def start(self) -> SandboxInfo:
        """Starts a stopped sandbox."""
        return await self._lifecycle("start")

    async def delete(self, *, force: bool = True, missing_ok: bool = False) -> None:
        """Deletes the sandbox and its files."""
        await self.client.delete(self.id, force=force, missing_ok=missing_ok)

    async def ensure_running(self) -> SandboxInfo:
        """Resumes or starts the sandbox if it is paused or stopped."""
        info = await self.refresh()
        if info.state == "paused":
            return await self.resume()
        if info.state == "stopped":
            return await self.start()
        return info

    async def selftest(self) -> SelftestReport:
        """Runs the isolation self-test inside the sandbox."""
        return SelftestReport.from_dict(await self.client._json("GET", self._path("selftest")))

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.on_exit == "delete":
            await self.delete(missing_ok=True)
        elif self.on_exit == "stop":
            try:
                await self.stop()
            except ThreadboxError as e:
                if e.code != "not_found":
                    raise

    async def run_code(
        self, code: str, *, context: str = "python", timeout: float | None = None, env: Mapping[str, str] | None = None
    ) -> _interp.Execution:
        """Runs ``code`` in a persistent context (``python``, made on first use)."""
        return await _interp.run_code_async(self, code, context=context, timeout=timeout, env=env)

    async def exec(
        self,
        cmd: c.Command,
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: Literal["user", "root"] | None = None,
        stdin: str | bytes | None = None,
        max_output_bytes: int | None = None,
    ) -> ExecResult:
        """Runs a command to completion (see :meth:`threadbox.Sandbox.exec`)."""
        body = c.exec_body(
            cmd, timeout=timeout, env=env, cwd=cwd, user=user, stdin=stdin, max_output_bytes=max_output_bytes
        )
        data = await self.client._json(
            "POST",
            self._path("exec"),
            json_body=body,
            timeout=c.exec_http_timeout(self.client._timeout, timeout),
        )
        return ExecResult.from_dict(data)

    def exec_stream(
        self,
        cmd: c.Command,
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: Literal["user", "root"] | None = None,
        stdin: str | bytes | None = None,
        max_output_bytes: int | None = None,
    ) -> AsyncExecStream:
        """Streams a command's events (``async with`` / ``async for``)."""
        body = c.exec_body(
            cmd, timeout=timeout, env=env, cwd=cwd, user=user, stdin=stdin, max_output_bytes=max_output_bytes
        )
        return AsyncExecStream(
            self.client, self._path("exec", "stream"), body, c.exec_http_timeout(self.client._timeout, timeout)
        )


class AsyncExecStream(AsyncIterator[ExecEvent]):
    """Async iterator over the events of a streamed exec."""

    def __init__(self, client: AsyncThreadbox, path: str, body: dict[str, Any], timeout: httpx.Timeout) -> None:
        self._client = client
        self._path = path
        self._body = body
        self._timeout = timeout
        self._resp: httpx.Response | None = None
        self._lines: AsyncIterator[str] | None = None
        self._done = False
        self.end: EndEvent | None = None

    async def _open(self) -> AsyncIterator[str]:
        if self._lines is None:
            self._resp = await self._client._send(
                "POST", self._path, json_body=self._body, timeout=self._timeout, stream=True
            )
            self._lines = self._resp.aiter_lines()
        return self._lines

    async def __aenter__(self) -> AsyncExecStream:
        await self._open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __aiter__(self) -> AsyncExecStream:
        return self

    async def __anext__(self) -> ExecEvent:
        if self._done:
            raise StopAsyncIteration
        lines = await self._open()
        try:
            while True:
                try:
                    line = await lines.__anext__()
                except StopAsyncIteration:
                    await self.aclose()
                    if self.end is None:
                        raise ProtocolError("exec stream ended without an end event") from None
                    raise
                except httpx.TransportError as e:
                    raise DaemonUnreachable(f"exec stream interrupted: {e}") from e
                if not line.strip():
                    continue
                try:
                    ev = parse_event(json.loads(line))
                except ValueError as e:
                    raise ProtocolError(f"invalid exec stream line: {line[:200]!r}") from e
                if ev is None:
                    continue
                if isinstance(ev, ErrorEvent):
                    raise error_from_code(ev.code, ev.message, path=self._path)
                if isinstance(ev, EndEvent):
                    self.end = ev
                    await self.aclose()
                return ev
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        """Releases the connection."""
        self._done = True
        if self._resp is not None:
            await self._resp.aclose()

    async def collect(self, on_output: Callable[[OutputEvent], object] | None = None) -> ExecResult:
        """Consumes the stream and returns the accumulated result; ``on_output`` sees
        each output event as it comes (to show progress)."""
        out: builtins.list[bytes] = []
        err: builtins.list[bytes] = []
        async for ev in self:
            if isinstance(ev, OutputEvent):
                (out if ev.stream == "stdout" else err).append(ev.data)
                if on_output is not None:
                    on_output(ev)
        return exec_result(self.end, out, err)


class AsyncProcess:
    """A background process of a sandbox (async)."""

    def __init__(self, sandbox: AsyncSandbox, info: ProcessInfo) -> None:
        self.sandbox = sandbox
        self.info = info

    def __repr__(self) -> str:
        return f"AsyncProcess(id={self.id}, pid={self.info.pid}, running={self.info.running})"

    @property
    def id(self) -> int:
        return self.info.id

    @property
    def pid(self) -> int:
        return self.info.pid

    @property
    def running(self) -> bool:
        return self.info.running

    @property
    def exit_code(self) -> int | None:
        return self.info.exit_code

    async def refresh(self) -> ProcessInfo:
        """Reloads the process's state."""
        for p in await self.sandbox.processes.list():
            if p.id == self.id:
                self.info = p.info
                return self.info
        raise ProcessNotFound(f"process {self.id} not found", code="not_found")

    async def logs(self) -> ProcessLogs:
        return await self.sandbox.processes.logs(self.id)

    async def kill(self, signal: int | None = None) -> None:
        await self.sandbox.processes.kill(self.id, signal=signal)

    async def wait(self, timeout: float | None = None, *, poll: float = 0.1) -> ProcessInfo:
        """Polls until the process exits; raises ``TimeoutError`` after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            info = await self.refresh()
            if not info.running:
                return info
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"process {self.id} still running after {timeout}s")
            await asyncio.sleep(poll)


class AsyncProcesses:
    """Background processes of a sandbox (``sandbox.processes``)."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    async def start(
        self,
        cmd: c.Command,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: Literal["user", "root"] | None = None,
    ) -> AsyncProcess:
        data = await self._sb.client._json(
            "POST", self._sb._path("processes"), json_body=c.process_body(cmd, env=env, cwd=cwd, user=user)
        )
        return AsyncProcess(self._sb, ProcessInfo.from_dict(data))

    async def list(self) -> builtins.list[AsyncProcess]:
        data = await self._sb.client._json("GET", self._sb._path("processes"))
        return [AsyncProcess(self._sb, ProcessInfo.from_dict(d)) for d in data.get("processes", [])]

    async def logs(self, process_id: int) -> ProcessLogs:
        return ProcessLogs.from_dict(
            await self._sb.client._json("GET", self._sb._path("processes", str(process_id), "logs"))
        )

    async def kill(self, process_id: int, *, signal: int | None = None) -> None:
        body: dict[str, Any] = {} if signal is None else {"signal": int(signal)}
        await self._sb.client._send("POST", self._sb._path("processes", str(process_id), "kill"), json_body=body)


def _parent(path: str) -> str | None:
    p = path.rstrip("/")
    if "/" not in p:
        return None
    return p.rsplit("/", 1)[0] or None


async def _aiter_io(f: IO[bytes], chunk_size: int = _CHUNK) -> AsyncIterator[bytes]:
    while True:
        b = await asyncio.to_thread(f.read, chunk_size)
        if not b:
            return
        yield b


class AsyncFiles:
    """Files of a sandbox (``sandbox.files``), async."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    def _files(self, *rest: str) -> str:
        return self._sb._path("files", *rest)

    async def read(
        self,
        path: str,
        *,
        offset: int = 0,
        length: int | None = None,
        user: Literal["user", "root"] | None = None,
    ) -> bytes:
        """Reads a file, or ``length`` bytes of it from byte ``offset`` (only those are sent)."""
        params = c.read_params(path, user, offset, length)
        resp = await self._sb.client._send("GET", self._files(), params=params)
        return resp.content

    async def read_text(
        self, path: str, *, encoding: str = "utf-8", user: Literal["user", "root"] | None = None
    ) -> str:
        return (await self.read(path, user=user)).decode(encoding)

    async def read_stream(
        self,
        path: str,
        *,
        chunk_size: int = _CHUNK,
        offset: int = 0,
        length: int | None = None,
        user: Literal["user", "root"] | None = None,
    ) -> AsyncIterator[bytes]:
        """Streams a file (or ``length`` bytes from ``offset``) in chunks."""
        params = c.read_params(path, user, offset, length)
        resp = await self._sb.client._send("GET", self._files(), params=params, stream=True)
        try:
            async for chunk in resp.aiter_bytes(chunk_size):
                yield chunk
        finally:
            await resp.aclose()

    async def write(
        self,
        path: str,
        data: bytes | str | Iterable[bytes] | AsyncIterable[bytes] | IO[bytes],
        *,
        user: Literal["user", "root"] | None = None,
        parents: bool = True,
    ) -> None:
        """Writes a file (bytes, text, sync/async chunk iterables or a binary file)."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        if isinstance(data, (bytes, bytearray, memoryview)):
            body = bytes(data)
            try:
                await self._sb.client._send("PUT", self._files(), params=c.file_params(path, user), content=body)
            except FileNotFound:
                parent = _parent(path)
                if not parents or parent is None:
                    raise
                await self.mkdir(parent, parents=True)
                await self._sb.client._send("PUT", self._files(), params=c.file_params(path, user), content=body)
            return
        if parents and (parent := _parent(path)) is not None:
            await self.mkdir(parent, parents=True)
        content: Any
        if hasattr(data, "read"):
            content = _aiter_io(data)  # type: ignore[arg-type]
        elif isinstance(data, AsyncIterable):
            content = data
        else:
            sync_iter = iter(data)

            async def _wrap() -> AsyncIterator[bytes]:
                for chunk in sync_iter:
                    yield chunk

            content = _wrap()
        await self._sb.client._send(
            "PUT",
            self._files(),
            params=c.file_params(path, user),
            content=content,
            headers={"Content-Type": "application/octet-stream"},
        )

    async def upload(
        self, local_path: str | os.PathLike[str], remote_path: str, *, user: Literal["user", "root"] | None = None
    ) -> None:
        """Streams a local file into the sandbox."""
        f = await asyncio.to_thread(open, local_path, "rb")
        try:
            await self.write(remote_path, f, user=user)
        finally:
            f.close()

    async def download(
        self, remote_path: str, local_path: str | os.PathLike[str], *, user: Literal["user", "root"] | None = None
    ) -> int:
        """Streams a sandbox file to a local file; returns the number of bytes."""
        n = 0
        tmp = Path(str(local_path) + ".part")
        try:
            f = await asyncio.to_thread(open, tmp, "wb")
            try:
                async for chunk in self.read_stream(remote_path, user=user):
                    await asyncio.to_thread(f.write, chunk)
                    n += len(chunk)
            finally:
                f.close()
            await asyncio.to_thread(os.replace, tmp, local_path)
        finally:
            await asyncio.to_thread(tmp.unlink, missing_ok=True)
        return n

    async def list(self, path: str = ".") -> builtins.list[FileEntry]:
        data = await self._sb.client._json("GET", self._files("list"), params=c.file_params(path))
        return [FileEntry.from_dict(d) for d in data.get("entries", [])]

    async def stat(self, path: str) -> FileEntry:
        return FileEntry.from_dict(await self._sb.client._json("GET", self._files("stat"), params=c.file_params(path)))

    async def exists(self, path: str) -> bool:
        try:
            await self.stat(path)
        except FileNotFound:
            return False
        return True

    async def mkdir(self, path: str, *, parents: bool = True) -> None:
        params = c.file_params(path, None, parents="true" if parents else "false")
        await self._sb.client._send("POST", self._files("mkdir"), params=params)

    async def remove(self, path: str, *, recursive: bool = False, missing_ok: bool = False) -> None:
        params = c.file_params(path, None, recursive="true" if recursive else "false")
        try:
            await self._sb.client._send("DELETE", self._files(), params=params)
        except FileNotFound:
            if not missing_ok:
                raise
