"""The synchronous client: :class:`Threadbox`, :class:`Sandbox` and friends."""

from __future__ import annotations

import builtins
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal, TypeVar

import httpx

from . import _checkpoints, _interp, _network, _previews, _tracing
from . import _common as c
from . import _ops as ops
from ._checkpoints import CheckpointInfo
from ._errors import FileNotFound, ThreadboxError
from ._images import Images
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
from ._templates import Templates
from ._views import ProcessView, SandboxView

__all__ = ["ExecStream", "Files", "Process", "Processes", "Sandbox", "Threadbox", "default_client"]

_CHUNK = 1 << 16
T = TypeVar("T")


class Threadbox:
    """Synchronous client of a threadbox daemon.

    Args:
        url: ``http://host:port`` or ``unix:///path/threadbox.sock``. Defaults to
            ``$THREADBOX_URL``, then ``http://127.0.0.1:7420``.
        api_key: Sent as ``Authorization: Bearer``. Defaults to ``$THREADBOX_API_KEY``.
        timeout: Default HTTP timeout in seconds for non-exec calls. Execs use their
            own ``timeout`` plus a margin (unbounded when the exec has none).
        headers: Extra headers sent with every request.
        transport: A custom httpx transport (tests use ``httpx.MockTransport``).

    The client is thread-safe; use one per process. It is a context manager that
    closes its connection pool on exit.

    Example:
        >>> with Threadbox() as tb:
        ...     with tb.create(name="demo") as sb:
        ...         print(sb.exec("echo hi").stdout)
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float = c.DEFAULT_TIMEOUT,
        headers: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._config = c.resolve_config(url, api_key)
        self._timeout = c.client_timeout(timeout)
        if transport is None and self._config.uds:
            transport = httpx.HTTPTransport(uds=self._config.uds)
        self._http = httpx.Client(
            transport=transport,
            **c.client_options(self._config, self._timeout, headers, _tracing.request_hook, _tracing.response_hook),
        )

    @property
    def url(self) -> str:
        """The daemon URL this client talks to."""
        return self._config.display_url

    # -- plumbing -------------------------------------------------------------

    def _send(self, method: str, path: str, *, stream: bool = False, **kw: Any) -> httpx.Response:
        """Sends one request; raises the typed error of a failed answer."""
        return self._open(ops.Op(method, path, **kw), stream=stream)

    def _open(self, op: ops.Op[Any], *, stream: bool = False) -> httpx.Response:
        try:
            resp = self._http.send(self._http.build_request(**op.request_args(self._timeout)), stream=stream)
        except httpx.TransportError as e:
            raise ops.unreachable(self.url, e) from e
        if not c.is_success(resp.status_code):
            try:
                body = resp.read()
            finally:
                resp.close()
            raise ops.error_for(self._config, resp.status_code, body, op.path)
        return resp

    def _call(self, op: ops.Op[T]) -> T:
        return op.parse(self._open(op))

    def _json(self, method: str, path: str, **kw: Any) -> Any:
        return ops.parse_json(method, path, self._send(method, path, **kw))

    def close(self) -> None:
        """Closes the connection pool."""
        self._http.close()

    def __enter__(self) -> Threadbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def images(self) -> Images:
        """The image catalog: ``pull()``, ``list()``, ``remove()``, ``import_archive()``."""
        return Images(self)

    @property
    def templates(self) -> Templates:
        """Templates: ``create()``, ``list()``, ``get()``, ``delete()``; ``create(template=...)``."""
        return Templates(self)

    # -- daemon ---------------------------------------------------------------

    def health(self) -> Health:
        """``GET /healthz``."""
        return self._call(ops.health())

    # -- sandboxes ------------------------------------------------------------

    def create(
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
    ) -> Sandbox:
        """Creates a sandbox (``POST /v1/sandboxes``).

        When ``name`` already exists the daemon returns that sandbox instead
        (``Sandbox.created`` tells which). ``memory`` takes bytes or ``"512M"``.
        ``on_exit`` is what ``with sandbox:`` does at the end of the block, and it
        applies only to a sandbox this call created: an existing sandbox returned
        by name is left alone (call :meth:`Sandbox.delete` to delete it).
        ``network`` opens egress: a list of ``--allow`` rules (``["pypi.org",
        "python-packages"]``) or a policy mapping; without it the sandbox reaches
        nothing outside itself. ``tier`` names the isolation tier (the daemon's default
        when omitted). ``otlp_relay=True`` gives the sandbox an OTLP/HTTP endpoint at
        ``127.0.0.1:4318`` forwarded to the daemon's collector, so spans its programs
        export join the caller's trace.
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
        info, created = self._call(ops.create(body))
        return Sandbox(self, info, created=created, on_exit=c.effective_on_exit(on_exit, created))

    def get_or_create(
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
    ) -> Sandbox:
        """Returns the sandbox named ``name``, creating it when it does not exist.

        The settings only apply when the sandbox is created. So does ``on_exit``:
        ``with tb.get_or_create("thread-42") as sb:`` deletes the sandbox at the end
        of the block only when this call created it, never one that already existed.
        """
        return self.create(
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

    def get(self, sandbox: str, *, on_exit: c.OnExit = "none") -> Sandbox:
        """Fetches a sandbox by id or name; raises :class:`SandboxNotFound`."""
        return Sandbox(self, self._call(ops.get(sandbox)), on_exit=on_exit)

    def list(
        self,
        labels: Mapping[str, str] | None = None,
        *,
        state: Literal["creating", "running", "paused", "stopped"] | None = None,
    ) -> builtins.list[Sandbox]:
        """Lists sandboxes having all of ``labels`` (and in ``state``, if given)."""
        return [Sandbox(self, info) for info in self._call(ops.list_sandboxes(labels, state))]

    def delete(self, sandbox: str, *, force: bool = True, missing_ok: bool = False) -> None:
        """Deletes a sandbox by id or name (``force`` stops it first if running)."""
        try:
            self._call(ops.delete(sandbox, force))
        except ThreadboxError as e:
            if not ops.ignore_missing(e, missing_ok):
                raise


_default: Threadbox | None = None
_default_lock = threading.Lock()


def default_client() -> Threadbox:
    """A process-wide client configured from the environment (created on first use)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Threadbox()
        return _default


class Sandbox(SandboxView):
    """A handle on one sandbox.

    Obtain one with :meth:`Threadbox.create`, :meth:`Threadbox.get_or_create`,
    :meth:`Threadbox.get`, :meth:`Threadbox.list` or the class methods of the same
    names. ``info`` is the last known metadata; :meth:`refresh` reloads it.

    Used as a context manager, the sandbox is deleted (``on_exit="delete"``), stopped
    (``"stop"``) or left alone (``"none"``) when the block ends. ``create`` and
    ``get_or_create`` set ``on_exit`` to ``"none"`` when they found an existing
    sandbox instead of creating one, so a block never deletes what it did not create.
    """

    def __init__(
        self,
        client: Threadbox,
        info: SandboxInfo,
        *,
        created: bool = False,
        on_exit: c.OnExit = "none",
    ) -> None:
        self.client = client
        self._init_view(info, created, on_exit)
        self.files = Files(self)
        self.processes = Processes(self)
        self.contexts = _interp.Contexts(self)
        self.previews = _previews.Previews(self)
        """Ports of the sandbox published as URLs through the daemon."""
        self.network = _network.Network(self)
        """The egress policy and log (issue 13)."""
        """Persistent interpreter contexts (variables survive between calls)."""

    # -- class-level constructors (default client) ----------------------------

    @classmethod
    def create(cls, name: str | None = None, *, client: Threadbox | None = None, **kwargs: Any) -> Sandbox:
        """Like :meth:`Threadbox.create`, with ``client`` defaulting to the environment's."""
        return (client or default_client()).create(name, **kwargs)

    @classmethod
    def get_or_create(cls, name: str, *, client: Threadbox | None = None, **kwargs: Any) -> Sandbox:
        """Like :meth:`Threadbox.get_or_create`."""
        return (client or default_client()).get_or_create(name, **kwargs)

    @classmethod
    def get(cls, sandbox: str, *, client: Threadbox | None = None, on_exit: c.OnExit = "none") -> Sandbox:
        """Like :meth:`Threadbox.get`."""
        return (client or default_client()).get(sandbox, on_exit=on_exit)

    @classmethod
    def list(
        cls,
        labels: Mapping[str, str] | None = None,
        *,
        state: Literal["creating", "running", "paused", "stopped"] | None = None,
        client: Threadbox | None = None,
    ) -> builtins.list[Sandbox]:
        """Like :meth:`Threadbox.list`."""
        return (client or default_client()).list(labels, state=state)

    def refresh(self) -> SandboxInfo:
        """Reloads the metadata from the daemon."""
        self.info = self.client._call(ops.get(self.id))
        return self.info

    # -- lifecycle ------------------------------------------------------------

    def _lifecycle(self, action: str) -> SandboxInfo:
        self.info = self.client._call(ops.lifecycle(self.id, action))
        return self.info

    def pause(self) -> SandboxInfo:
        """Freezes every process of the sandbox (memory is kept)."""
        return self._lifecycle("pause")

    def hibernate(self) -> SandboxInfo:
        """Freezes the sandbox and moves its memory out of RAM (swap on the jail tier).

        Any later call wakes it, its processes continuing where they were. Raises
        :class:`ThreadboxError` (``unavailable``) where the host has no swap."""
        return self._lifecycle("hibernate")

    def resume(self) -> SandboxInfo:
        """Thaws a paused or hibernated sandbox."""
        return self._lifecycle("resume")

    def stop(self) -> SandboxInfo:
        """Stops the sandbox's processes; its files are kept."""
        return self._lifecycle("stop")

    def start(self) -> SandboxInfo:
        """Starts a stopped sandbox."""
        return self._lifecycle("start")

    # -- checkpoints (issue 14) ------------------------------------------------

    def checkpoint(self, label: str | None = None, *, with_memory: bool = False) -> CheckpointInfo:
        """Checkpoints the sandbox's disk (its processes frozen for the instant). With
        ``with_memory`` (a tier with ``checkpoint_memory``: gvisor) its memory and running
        processes are kept too, and :meth:`rewind` to it brings them back; the jail refuses
        it."""
        return self.client._call(_checkpoints.create(self.id, label, with_memory))

    def checkpoints(self) -> builtins.list[CheckpointInfo]:
        """The sandbox's checkpoints, oldest first."""
        return self.client._call(_checkpoints.list_(self.id))

    def delete_checkpoint(self, checkpoint: str) -> None:
        """Deletes a checkpoint (label or id)."""
        self.client._call(_checkpoints.delete(self.id, checkpoint))

    def rewind(self, to: str, *, drop_later: bool = False) -> SandboxInfo:
        """Returns the disk to checkpoint ``to`` (label or id); processes are restarted,
        the id and name stay."""
        self.info = self.client._call(_checkpoints.rewind(self.id, to, drop_later))
        return self.info

    def fork(
        self,
        count: int = 1,
        *,
        name_prefix: str | None = None,
        names: builtins.list[str] | None = None,
        checkpoint: str | None = None,
        labels: Mapping[str, str] | None = None,
        with_memory: bool | None = None,
    ) -> builtins.list[Sandbox]:
        """``count`` new running sandboxes with this one's files, limits, image, network
        policy and labels; this one keeps running.

        ``names`` gives each fork its exact name (one fork per name); ``checkpoint`` (a
        label or id) forks the disk as it was then instead of as it is now; ``labels`` are
        set on the forks over this one's. ``with_memory`` copies memory and running
        processes too (gvisor sandboxes; the default there while running); the jail forks
        files only and refuses ``True``."""
        infos = self.client._call(
            _checkpoints.fork(self.id, count, name_prefix, names, checkpoint, labels, with_memory)
        )
        return [Sandbox(self.client, i, created=True) for i in infos]

    def delete(self, *, force: bool = True, missing_ok: bool = False) -> None:
        """Deletes the sandbox and its files."""
        self.client.delete(self.id, force=force, missing_ok=missing_ok)

    def ensure_running(self) -> SandboxInfo:
        """Resumes or starts the sandbox if it is paused or stopped."""
        info = self.refresh()
        if info.state == "paused":
            return self.resume()
        if info.state == "stopped":
            return self.start()
        return info

    def selftest(self) -> SelftestReport:
        """Runs the isolation self-test inside the sandbox."""
        return self.client._call(ops.selftest(self.id))

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.on_exit == "delete":
            self.delete(missing_ok=True)
        elif self.on_exit == "stop":
            try:
                self.stop()
            except ThreadboxError as e:
                if e.code != "not_found":
                    raise

    def run_code(
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
        return _interp.run_code(self, code, context=context, timeout=timeout, env=env, on_output=on_output)

    # -- exec -----------------------------------------------------------------

    def exec(
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
        """Runs a command to completion.

        Args:
            cmd: A shell command line (``str``, run with ``/bin/sh -c``) or an argv list.
            timeout: Seconds after which the whole process tree is killed; the result
                then has ``timed_out=True`` and ``exit_code=None``.
            env: Extra environment variables.
            cwd: Working directory (default ``/home/user``).
            user: ``"user"`` (uid 1000, default) or ``"root"``.
            stdin: Data written to the process's standard input.
            max_output_bytes: Bound on captured stdout and stderr, each.

        A non-zero exit is not an exception: check ``result.exit_code``. A program
        that does not exist is a result too (exit code 127, ``command not found`` in
        stderr; 126 when it cannot be executed), as a shell reports it.
        """
        body = c.exec_body(
            cmd, timeout=timeout, env=env, cwd=cwd, user=user, stdin=stdin, max_output_bytes=max_output_bytes
        )
        return self.client._call(ops.exec_op(self.id, body, timeout, self.client._timeout))

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
    ) -> ExecStream:
        """Runs a command and streams its events as they happen.

        Returns an iterator of :class:`StartEvent`, :class:`OutputEvent` (stdout and
        stderr chunks) and a final :class:`EndEvent`; use it in a ``with`` block (or
        iterate it to the end) so the connection is released::

            with sb.exec_stream("make test") as events:
                for ev in events:
                    if isinstance(ev, OutputEvent):
                        print(ev.text, end="")
        """
        body = c.exec_body(
            cmd, timeout=timeout, env=env, cwd=cwd, user=user, stdin=stdin, max_output_bytes=max_output_bytes
        )
        return ExecStream(self.client, ops.exec_stream_op(self.id, body, timeout, self.client._timeout))


class ExecStream(Iterator[ExecEvent]):
    """Iterator over the events of a streamed exec (see :meth:`Sandbox.exec_stream`).

    A daemon-side error event is raised as the matching :class:`ThreadboxError`.
    After the iteration ends, ``end`` holds the :class:`EndEvent`.
    """

    def __init__(self, client: Threadbox, op: ops.Op[None]) -> None:
        self._client = client
        self._op = op
        self._decoder = ops.StreamDecoder(op.path)
        self._resp: httpx.Response | None = None
        self._lines: Iterator[str] | None = None
        self._done = False

    @property
    def end(self) -> EndEvent | None:
        """The :class:`EndEvent`, once the stream reached it."""
        return self._decoder.end

    def _start(self) -> Iterator[str]:
        if self._lines is None:
            self._resp = self._client._open(self._op, stream=True)
            self._lines = self._resp.iter_lines()
        return self._lines

    def __enter__(self) -> ExecStream:
        self._start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> ExecStream:
        return self

    def __next__(self) -> ExecEvent:
        if self._done:
            raise StopIteration
        lines = self._start()
        try:
            for line in lines:
                ev = self._decoder.feed(line)
                if ev is not None:
                    if self.end is not None:
                        self.close()
                    return ev
            self._decoder.finish()
            raise StopIteration
        except httpx.TransportError as e:
            self.close()
            raise ops.StreamDecoder.interrupted(e) from e
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Releases the connection (the command keeps running until its timeout)."""
        self._done = True
        if self._resp is not None:
            self._resp.close()

    def collect(self, on_output: Callable[[OutputEvent], object] | None = None) -> ExecResult:
        """Consumes the stream and returns the accumulated result; ``on_output`` sees
        each output event as it comes (to show progress)."""
        acc = ops.Collector(on_output)
        for ev in self:
            acc.add(ev)
        return acc.result(self.end)


class Process(ProcessView):
    """A background process of a sandbox."""

    def __init__(self, sandbox: Sandbox, info: ProcessInfo) -> None:
        self.sandbox = sandbox
        self.info = info

    def refresh(self) -> ProcessInfo:
        """Reloads the process's state."""
        self.info = ops.find_process(self.sandbox.client._call(ops.process_list(self.sandbox.id)), self.id)
        return self.info

    def logs(self) -> ProcessLogs:
        """Its captured output so far."""
        return self.sandbox.processes.logs(self.id)

    def kill(self, signal: int | None = None) -> None:
        """Sends ``signal`` (default SIGKILL)."""
        self.sandbox.processes.kill(self.id, signal=signal)

    def wait(self, timeout: float | None = None, *, poll: float = 0.1) -> ProcessInfo:
        """Polls until the process exits; raises ``TimeoutError`` after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            info = self.refresh()
            if not info.running:
                return info
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"process {self.id} still running after {timeout}s")
            time.sleep(poll)


class Processes:
    """Background processes of a sandbox (``sandbox.processes``)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def start(
        self,
        cmd: c.Command,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: Literal["user", "root"] | None = None,
    ) -> Process:
        """Starts a process that keeps running after the call returns."""
        body = c.process_body(cmd, env=env, cwd=cwd, user=user)
        return Process(self._sb, self._sb.client._call(ops.process_start(self._sb.id, body)))

    def list(self) -> builtins.list[Process]:
        """Every background process started through the API."""
        return [Process(self._sb, p) for p in self._sb.client._call(ops.process_list(self._sb.id))]

    def logs(self, process_id: int) -> ProcessLogs:
        """Captured output of a process."""
        return self._sb.client._call(ops.process_logs(self._sb.id, process_id))

    def kill(self, process_id: int, *, signal: int | None = None) -> None:
        """Sends ``signal`` (default SIGKILL) to a process."""
        self._sb.client._call(ops.process_kill(self._sb.id, process_id, signal))


def _iter_io(f: IO[bytes], chunk_size: int = _CHUNK) -> Iterator[bytes]:
    while True:
        b = f.read(chunk_size)
        if not b:
            return
        yield b


class Files:
    """Files of a sandbox (``sandbox.files``). Relative paths resolve against ``/home/user``."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def read(
        self,
        path: str,
        *,
        offset: int = 0,
        length: int | None = None,
        user: Literal["user", "root"] | None = None,
    ) -> bytes:
        """Reads a file, or ``length`` bytes of it from byte ``offset`` (only those are sent).

        A range that starts at or past the end of the file reads as ``b""``.
        """
        return self._sb.client._call(ops.file_read(self._sb.id, path, user, offset, length))

    def read_text(self, path: str, *, encoding: str = "utf-8", user: Literal["user", "root"] | None = None) -> str:
        """Reads a whole file as text."""
        return self.read(path, user=user).decode(encoding)

    def read_stream(
        self,
        path: str,
        *,
        chunk_size: int = _CHUNK,
        offset: int = 0,
        length: int | None = None,
        user: Literal["user", "root"] | None = None,
    ) -> Iterator[bytes]:
        """Streams a file (or ``length`` bytes from ``offset``) in chunks, for files too large to hold."""
        resp = self._sb.client._open(ops.file_read(self._sb.id, path, user, offset, length), stream=True)
        try:
            yield from resp.iter_bytes(chunk_size)
        finally:
            resp.close()

    def write(
        self,
        path: str,
        data: bytes | str | Iterable[bytes] | IO[bytes],
        *,
        user: Literal["user", "root"] | None = None,
        parents: bool = True,
    ) -> None:
        """Writes a file, replacing it if it exists.

        ``data`` may be bytes, text (written as UTF-8), an iterable of byte chunks or
        a binary file object (both streamed). With ``parents`` the missing parent
        directories are created.
        """
        client = self._sb.client
        body = ops.whole_body(data)
        if body is not None:
            op = ops.file_write(self._sb.id, path, user, body, streamed=False)
            try:
                client._call(op)
            except FileNotFound:
                parent = ops.parent_dir(path)
                if not parents or parent is None:
                    raise
                self.mkdir(parent, parents=True)
                client._call(op)
            return
        if parents and (parent := ops.parent_dir(path)) is not None:
            self.mkdir(parent, parents=True)
        content: Iterable[bytes] = _iter_io(data) if hasattr(data, "read") else data  # type: ignore[arg-type,assignment]
        client._call(ops.file_write(self._sb.id, path, user, content, streamed=True))

    def upload(
        self, local_path: str | os.PathLike[str], remote_path: str, *, user: Literal["user", "root"] | None = None
    ) -> None:
        """Streams a local file into the sandbox."""
        with open(local_path, "rb") as f:
            self.write(remote_path, f, user=user)

    def download(
        self, remote_path: str, local_path: str | os.PathLike[str], *, user: Literal["user", "root"] | None = None
    ) -> int:
        """Streams a sandbox file to a local file; returns the number of bytes."""
        n = 0
        tmp = Path(str(local_path) + ".part")
        try:
            with open(tmp, "wb") as f:
                for chunk in self.read_stream(remote_path, user=user):
                    f.write(chunk)
                    n += len(chunk)
            os.replace(tmp, local_path)
        finally:
            tmp.unlink(missing_ok=True)
        return n

    def list(self, path: str = ".") -> builtins.list[FileEntry]:
        """Lists a directory."""
        return self._sb.client._call(ops.file_list(self._sb.id, path))

    def stat(self, path: str) -> FileEntry:
        """Metadata of one path; raises :class:`FileNotFound`."""
        return self._sb.client._call(ops.file_stat(self._sb.id, path))

    def exists(self, path: str) -> bool:
        """True when ``path`` exists."""
        try:
            self.stat(path)
        except FileNotFound:
            return False
        return True

    def mkdir(self, path: str, *, parents: bool = True) -> None:
        """Creates a directory (and its parents with ``parents``)."""
        self._sb.client._call(ops.file_mkdir(self._sb.id, path, parents))

    def remove(self, path: str, *, recursive: bool = False, missing_ok: bool = False) -> None:
        """Removes a file, or a directory tree with ``recursive``."""
        try:
            self._sb.client._call(ops.file_remove(self._sb.id, path, recursive))
        except FileNotFound:
            if not missing_ok:
                raise
