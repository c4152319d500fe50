"""The asyncio client: :class:`AsyncThreadbox`, :class:`AsyncSandbox` and friends.

It mirrors the synchronous API method for method; every call is a coroutine.
"""

from __future__ import annotations

import asyncio
import builtins
import os
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal, TypeVar, cast

import httpx

from . import _checkpoints, _interp, _network, _previews, _tracing
from . import _common as c
from . import _ops as ops
from ._checkpoints import CheckpointInfo
from ._errors import FileNotFound, ThreadboxError
from ._images import AsyncImages
from ._models import (
    EndEvent,
    ExecEvent,
    ExecResult,
    FileEntry,
    Health,
    OutputEvent,
    ProcessInfo,
    ProcessLogs,
    SandboxInfo,
    SelftestReport,
)
from ._templates import AsyncTemplates
from ._views import ProcessView, SandboxView

__all__ = [
    "AsyncExecStream",
    "AsyncFiles",
    "AsyncProcess",
    "AsyncProcesses",
    "AsyncSandbox",
    "AsyncThreadbox",
]

_CHUNK = 1 << 16
T = TypeVar("T")


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
        self._timeout = c.client_timeout(timeout)
        if transport is None and self._config.uds:
            transport = httpx.AsyncHTTPTransport(uds=self._config.uds)
        self._http = httpx.AsyncClient(
            transport=transport,
            **c.client_options(
                self._config, self._timeout, headers, _tracing.async_request_hook, _tracing.async_response_hook
            ),
        )

    @property
    def url(self) -> str:
        """The daemon URL this client talks to."""
        return self._config.display_url

    async def _send(self, method: str, path: str, *, stream: bool = False, **kw: Any) -> httpx.Response:
        """Sends one request; raises the typed error of a failed answer."""
        return await self._open(ops.Op(method, path, **kw), stream=stream)

    async def _open(self, op: ops.Op[Any], *, stream: bool = False) -> httpx.Response:
        try:
            resp = await self._http.send(self._http.build_request(**op.request_args(self._timeout)), stream=stream)
        except httpx.TransportError as e:
            raise ops.unreachable(self.url, e) from e
        if not c.is_success(resp.status_code):
            try:
                body = await resp.aread()
            finally:
                await resp.aclose()
            raise ops.error_for(self._config, resp.status_code, body, op.path)
        return resp

    async def _call(self, op: ops.Op[T]) -> T:
        return op.parse(await self._open(op))

    async def _json(self, method: str, path: str, **kw: Any) -> Any:
        return ops.parse_json(method, path, await self._send(method, path, **kw))

    async def aclose(self) -> None:
        """Closes the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncThreadbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def images(self) -> AsyncImages:
        """The image catalog: ``pull()``, ``list()``, ``remove()``, ``import_archive()``."""
        return AsyncImages(self)

    @property
    def templates(self) -> AsyncTemplates:
        """Templates: ``create()``, ``list()``, ``get()``, ``delete()``; ``create(template=...)``."""
        return AsyncTemplates(self)

    async def health(self) -> Health:
        """``GET /healthz``."""
        return await self._call(ops.health())

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
        idle_hibernate_secs: int | None = None,
        ttl_secs: int | None = None,
        ttl_action: Literal["stop", "delete"] | None = None,
        secrets: Sequence[str] | None = None,
        network: _network.NetworkSpec | None = None,
        tier: str | None = None,
        otlp_relay: bool | None = None,
        template: str | None = None,
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
            idle_hibernate_secs=idle_hibernate_secs,
            ttl_secs=ttl_secs,
            ttl_action=ttl_action,
            secrets=secrets,
            tier=tier,
            otlp_relay=otlp_relay,
            template=template,
        )
        if network is not None:
            body["network"] = _network.policy_body(network)
        info, created = await self._call(ops.create(body))
        return AsyncSandbox(self, info, created=created, on_exit=c.effective_on_exit(on_exit, created))

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
        idle_hibernate_secs: int | None = None,
        ttl_secs: int | None = None,
        ttl_action: Literal["stop", "delete"] | None = None,
        secrets: Sequence[str] | None = None,
        network: _network.NetworkSpec | None = None,
        tier: str | None = None,
        otlp_relay: bool | None = None,
        template: str | None = None,
        on_exit: c.OnExit = "delete",
    ) -> AsyncSandbox:
        """Returns the sandbox named ``name``, creating it when it does not exist.

        ``async with await tb.get_or_create(name) as sb:`` deletes it at the end only
        when this call created it, never a sandbox that already existed.
        """
        return await self.create(
            ops.require_name(name),
            labels=labels,
            image=image,
            memory=memory,
            cpus=cpus,
            pids=pids,
            idle_pause_secs=idle_pause_secs,
            idle_stop_secs=idle_stop_secs,
            idle_hibernate_secs=idle_hibernate_secs,
            ttl_secs=ttl_secs,
            ttl_action=ttl_action,
            secrets=secrets,
            network=network,
            tier=tier,
            otlp_relay=otlp_relay,
            template=template,
            on_exit=on_exit,
        )

    async def get(self, sandbox: str, *, on_exit: c.OnExit = "none") -> AsyncSandbox:
        """Fetches a sandbox by id or name; raises :class:`SandboxNotFound`."""
        return AsyncSandbox(self, await self._call(ops.get(sandbox)), on_exit=on_exit)

    async def list(
        self,
        labels: Mapping[str, str] | None = None,
        *,
        state: Literal["creating", "running", "paused", "stopped"] | None = None,
    ) -> builtins.list[AsyncSandbox]:
        """Lists sandboxes having all of ``labels`` (and in ``state``, if given)."""
        return [AsyncSandbox(self, info) for info in await self._call(ops.list_sandboxes(labels, state))]

    async def delete(self, sandbox: str, *, force: bool = True, missing_ok: bool = False) -> None:
        """Deletes a sandbox by id or name."""
        try:
            await self._call(ops.delete(sandbox, force))
        except ThreadboxError as e:
            if not ops.ignore_missing(e, missing_ok):
                raise


class AsyncSandbox(SandboxView):
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
        self._init_view(info, created, on_exit)
        self.files = AsyncFiles(self)
        self.processes = AsyncProcesses(self)
        self.contexts = _interp.AsyncContexts(self)
        self.previews = _previews.AsyncPreviews(self)
        """Ports of the sandbox published as URLs through the daemon."""
        self.network = _network.AsyncNetwork(self)
        """The egress policy and log (issue 13)."""

    async def refresh(self) -> SandboxInfo:
        """Reloads the metadata from the daemon."""
        self.info = await self.client._call(ops.get(self.id))
        return self.info

    async def _lifecycle(self, action: str) -> SandboxInfo:
        self.info = await self.client._call(ops.lifecycle(self.id, action))
        return self.info

    async def pause(self) -> SandboxInfo:
        """Freezes every process of the sandbox."""
        return await self._lifecycle("pause")

    async def hibernate(self) -> SandboxInfo:
        """Async :meth:`Sandbox.hibernate`."""
        return await self._lifecycle("hibernate")

    async def resume(self) -> SandboxInfo:
        """Thaws a paused or hibernated sandbox."""
        return await self._lifecycle("resume")

    async def stop(self) -> SandboxInfo:
        """Stops the sandbox's processes; its files are kept."""
        return await self._lifecycle("stop")

    async def start(self) -> SandboxInfo:
        """Starts a stopped sandbox."""
        return await self._lifecycle("start")

    # -- checkpoints (issue 14) ------------------------------------------------

    async def checkpoint(self, label: str | None = None, *, with_memory: bool = False) -> CheckpointInfo:
        """Checkpoints the sandbox's disk (its processes frozen for the instant). With
        ``with_memory`` (a tier with ``checkpoint_memory``: gvisor) its memory and running
        processes are kept too, and :meth:`rewind` to it brings them back; the jail refuses
        it."""
        return await self.client._call(_checkpoints.create(self.id, label, with_memory))

    async def checkpoints(self) -> builtins.list[CheckpointInfo]:
        """The sandbox's checkpoints, oldest first."""
        return await self.client._call(_checkpoints.list_(self.id))

    async def delete_checkpoint(self, checkpoint: str) -> None:
        """Deletes a checkpoint (label or id)."""
        await self.client._call(_checkpoints.delete(self.id, checkpoint))

    async def rewind(self, to: str, *, drop_later: bool = False) -> SandboxInfo:
        """Returns the disk to checkpoint ``to`` (label or id); processes are restarted,
        the id and name stay."""
        self.info = await self.client._call(_checkpoints.rewind(self.id, to, drop_later))
        return self.info

    async def fork(
        self,
        count: int = 1,
        *,
        name_prefix: str | None = None,
        names: builtins.list[str] | None = None,
        checkpoint: str | None = None,
        labels: Mapping[str, str] | None = None,
        with_memory: bool | None = None,
    ) -> builtins.list[AsyncSandbox]:
        """``count`` new running sandboxes with this one's files, limits, image, network
        policy and labels; this one keeps running.

        ``names`` gives each fork its exact name (one fork per name); ``checkpoint`` (a
        label or id) forks the disk as it was then instead of as it is now; ``labels`` are
        set on the forks over this one's. ``with_memory`` copies memory and running
        processes too (gvisor sandboxes; the default there while running); the jail forks
        files only and refuses ``True``."""
        infos = await self.client._call(
            _checkpoints.fork(self.id, count, name_prefix, names, checkpoint, labels, with_memory)
        )
        return [AsyncSandbox(self.client, i, created=True) for i in infos]

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
        return await self.client._call(ops.selftest(self.id))

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
        self,
        code: str,
        *,
        context: str = "python",
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        on_output: _interp.OnOutput | None = None,
    ) -> _interp.Execution:
        """Runs ``code`` in a persistent context (``python``, made on first use);
        ``on_output`` streams its events as they come (see ``CodeContext.run``)."""
        return await _interp.run_code_async(self, code, context=context, timeout=timeout, env=env, on_output=on_output)

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
        return await self.client._call(ops.exec_op(self.id, body, timeout, self.client._timeout))

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
        return AsyncExecStream(self.client, ops.exec_stream_op(self.id, body, timeout, self.client._timeout))


class AsyncExecStream(AsyncIterator[ExecEvent]):
    """Async iterator over the events of a streamed exec."""

    def __init__(self, client: AsyncThreadbox, op: ops.Op[None]) -> None:
        self._client = client
        self._op = op
        self._decoder = ops.StreamDecoder(op.path)
        self._resp: httpx.Response | None = None
        self._lines: AsyncIterator[str] | None = None
        self._done = False

    @property
    def end(self) -> EndEvent | None:
        """The :class:`EndEvent`, once the stream reached it."""
        return self._decoder.end

    async def _start(self) -> AsyncIterator[str]:
        if self._lines is None:
            self._resp = await self._client._open(self._op, stream=True)
            self._lines = self._resp.aiter_lines()
        return self._lines

    async def __aenter__(self) -> AsyncExecStream:
        await self._start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __aiter__(self) -> AsyncExecStream:
        return self

    async def __anext__(self) -> ExecEvent:
        if self._done:
            raise StopAsyncIteration
        lines = await self._start()
        try:
            async for line in lines:
                ev = self._decoder.feed(line)
                if ev is not None:
                    if self.end is not None:
                        await self.aclose()
                    return ev
            self._decoder.finish()
            raise StopAsyncIteration
        except httpx.TransportError as e:
            await self.aclose()
            raise ops.StreamDecoder.interrupted(e) from e
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
        acc = ops.Collector(on_output)
        async for ev in self:
            acc.add(ev)
        return acc.result(self.end)


class AsyncProcess(ProcessView):
    """A background process of a sandbox (async)."""

    def __init__(self, sandbox: AsyncSandbox, info: ProcessInfo) -> None:
        self.sandbox = sandbox
        self.info = info

    async def refresh(self) -> ProcessInfo:
        """Reloads the process's state."""
        self.info = ops.find_process(await self.sandbox.client._call(ops.process_list(self.sandbox.id)), self.id)
        return self.info

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
        body = c.process_body(cmd, env=env, cwd=cwd, user=user)
        return AsyncProcess(self._sb, await self._sb.client._call(ops.process_start(self._sb.id, body)))

    async def list(self) -> builtins.list[AsyncProcess]:
        return [AsyncProcess(self._sb, p) for p in await self._sb.client._call(ops.process_list(self._sb.id))]

    async def logs(self, process_id: int) -> ProcessLogs:
        return await self._sb.client._call(ops.process_logs(self._sb.id, process_id))

    async def kill(self, process_id: int, *, signal: int | None = None) -> None:
        await self._sb.client._call(ops.process_kill(self._sb.id, process_id, signal))


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

    async def read(
        self,
        path: str,
        *,
        offset: int = 0,
        length: int | None = None,
        user: Literal["user", "root"] | None = None,
    ) -> bytes:
        """Reads a file, or ``length`` bytes of it from byte ``offset`` (only those are sent)."""
        return await self._sb.client._call(ops.file_read(self._sb.id, path, user, offset, length))

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
        resp = await self._sb.client._open(ops.file_read(self._sb.id, path, user, offset, length), stream=True)
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
        client = self._sb.client
        body = ops.whole_body(data)
        if body is not None:
            op = ops.file_write(self._sb.id, path, user, body, streamed=False)
            try:
                await client._call(op)
            except FileNotFound:
                parent = ops.parent_dir(path)
                if not parents or parent is None:
                    raise
                await self.mkdir(parent, parents=True)
                await client._call(op)
            return
        if parents and (parent := ops.parent_dir(path)) is not None:
            await self.mkdir(parent, parents=True)
        content: Any
        if hasattr(data, "read"):
            content = _aiter_io(data)  # type: ignore[arg-type]
        elif isinstance(data, AsyncIterable):
            content = data
        else:
            sync_iter = iter(cast("Iterable[bytes]", data))

            async def _wrap() -> AsyncIterator[bytes]:
                for chunk in sync_iter:
                    yield chunk

            content = _wrap()
        await client._call(ops.file_write(self._sb.id, path, user, content, streamed=True))

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
        return await self._sb.client._call(ops.file_list(self._sb.id, path))

    async def stat(self, path: str) -> FileEntry:
        return await self._sb.client._call(ops.file_stat(self._sb.id, path))

    async def exists(self, path: str) -> bool:
        try:
            await self.stat(path)
        except FileNotFound:
            return False
        return True

    async def mkdir(self, path: str, *, parents: bool = True) -> None:
        await self._sb.client._call(ops.file_mkdir(self._sb.id, path, parents))

    async def remove(self, path: str, *, recursive: bool = False, missing_ok: bool = False) -> None:
        try:
            await self._sb.client._call(ops.file_remove(self._sb.id, path, recursive))
        except FileNotFound:
            if not missing_ok:
                raise
