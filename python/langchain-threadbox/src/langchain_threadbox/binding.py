"""Which sandbox a tool call runs in: a fixed one, or one per LangGraph thread."""

from __future__ import annotations

import asyncio
import hashlib
import re
import threading
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from langchain_core.runnables import RunnableConfig

from threadbox import AsyncSandbox, AsyncThreadbox, Sandbox, Threadbox, ThreadboxError

__all__ = [
    "DEFAULT_THREAD_PREFIX",
    "ClientFactory",
    "FixedSandbox",
    "SandboxBinding",
    "ThreadIdMissing",
    "ThreadSandboxes",
    "release_thread_sandbox",
    "thread_id_from_config",
    "thread_sandbox_name",
]

DEFAULT_THREAD_PREFIX = "thread-"
# A thread's sandbox pauses (no CPU, memory and processes kept) after this long
# without calls; the next call resumes it in milliseconds. See ADR 0022.
DEFAULT_THREAD_IDLE_PAUSE_SECS = 60
# Stopped after an hour without a call: frees the memory a paused sandbox holds; files stay,
# and the next call starts it again (ADR 0022).
DEFAULT_THREAD_IDLE_STOP_SECS = 3600
# Hibernated after ten minutes without a call: the memory goes to swap and processes keep
# their place (a dev server, an interpreter's variables) until the next call wakes them.
# A host without swap answers that it cannot, and the sandbox stays paused (ADR 0129).
DEFAULT_THREAD_IDLE_HIBERNATE_SECS = 600
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")

if TYPE_CHECKING:
    from .timetravel import TimeTravelSaver


class ThreadIdMissing(LookupError):
    """The tool ran without ``configurable.thread_id`` in its config."""


def thread_sandbox_name(thread_id: str, prefix: str = DEFAULT_THREAD_PREFIX) -> str:
    """The sandbox name of a thread: ``thread-<thread_id>``.

    Thread ids that are not plain ``[A-Za-z0-9_.-]`` (or are long) are replaced by a
    stable hash so the name stays valid and unique per thread.
    """
    tid = str(thread_id)
    if _SAFE_ID.match(tid):
        return prefix + tid
    return prefix + "h" + hashlib.sha256(tid.encode("utf-8")).hexdigest()[:32]


def thread_id_from_config(config: RunnableConfig | Mapping[str, Any] | None) -> str:
    """Reads ``configurable.thread_id``, falling back to the current LangGraph config."""
    cfg: Mapping[str, Any] | None = config
    tid = ((cfg or {}).get("configurable") or {}).get("thread_id")
    if tid is None:
        try:
            from langgraph.config import get_config

            tid = (get_config().get("configurable") or {}).get("thread_id")
        except (ImportError, RuntimeError):
            tid = None
    if tid is None or str(tid) == "":
        raise ThreadIdMissing(
            "no thread_id in the run's config: invoke the graph with "
            '{"configurable": {"thread_id": ...}} (and a checkpointer) to bind tools to a thread'
        )
    return str(tid)


class ClientFactory:
    """Holds one sync client and one async client per event loop.

    httpx's async pools are tied to the loop that created them, so an
    :class:`AsyncThreadbox` is created lazily for each running loop.
    """

    def __init__(
        self,
        client: Threadbox | None = None,
        *,
        url: str | None = None,
        api_key: str | None = None,
        async_client: AsyncThreadbox | None = None,
    ) -> None:
        self._url = url if client is None else client.url
        self._api_key = api_key if client is None else client._config.api_key
        self._sync = client
        self._fixed_async = async_client
        self._async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncThreadbox] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    @property
    def sync(self) -> Threadbox:
        with self._lock:
            if self._sync is None:
                self._sync = Threadbox(self._url, api_key=self._api_key)
            return self._sync

    @property
    def async_(self) -> AsyncThreadbox:
        if self._fixed_async is not None:
            return self._fixed_async
        loop = asyncio.get_running_loop()
        with self._lock:
            c = self._async.get(loop)
            if c is None:
                c = AsyncThreadbox(self._url, api_key=self._api_key)
                self._async[loop] = c
            return c


class SandboxBinding:
    """Resolves the sandbox for a tool call from its ``RunnableConfig``."""

    factory: ClientFactory

    def resolve(self, config: RunnableConfig | None, *, writes: bool = True) -> Sandbox:
        """``writes=False``: the call only reads (a time-travel checkpointer takes no
        checkpoint for it)."""
        raise NotImplementedError

    async def aresolve(self, config: RunnableConfig | None, *, writes: bool = True) -> AsyncSandbox:
        raise NotImplementedError

    def describe(self, config: RunnableConfig | None) -> str:
        """A short human description (for approval payloads); no I/O."""
        raise NotImplementedError


def _ensure_running(sb: Sandbox) -> Sandbox:
    if sb.state == "paused":
        sb.resume()
    elif sb.state in ("stopped",):
        sb.start()
    return sb


async def _aensure_running(sb: AsyncSandbox) -> AsyncSandbox:
    if sb.state == "paused":
        await sb.resume()
    elif sb.state in ("stopped",):
        await sb.start()
    return sb


class FixedSandbox(SandboxBinding):
    """Every call runs in the same sandbox (given as a handle, id or name).

    With ``create=True`` a name that does not exist yet is created on first use.
    """

    def __init__(
        self,
        sandbox: Sandbox | str,
        *,
        factory: ClientFactory | None = None,
        create: bool = False,
        create_options: Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(sandbox, Sandbox):
            self.factory = factory or ClientFactory(sandbox.client)
            self._ref = sandbox.id
            self._sandbox: Sandbox | None = sandbox
        else:
            self.factory = factory or ClientFactory()
            self._ref = sandbox
            self._sandbox = None
        self._create = create
        self._options = dict(create_options or {})

    def resolve(self, config: RunnableConfig | None, *, writes: bool = True) -> Sandbox:
        if self._sandbox is None:
            tb = self.factory.sync
            self._sandbox = (
                tb.get_or_create(self._ref, on_exit="none", **self._options) if self._create else tb.get(self._ref)
            )
        else:
            self._sandbox.refresh()
        return _ensure_running(self._sandbox)

    async def aresolve(self, config: RunnableConfig | None, *, writes: bool = True) -> AsyncSandbox:
        tb = self.factory.async_
        ref = self._sandbox.id if self._sandbox is not None else self._ref
        if self._create and self._sandbox is None:
            sb = await tb.get_or_create(ref, on_exit="none", **self._options)
        else:
            sb = await tb.get(ref)
        return await _aensure_running(sb)

    def describe(self, config: RunnableConfig | None) -> str:
        return f"sandbox {self._ref}"


class ThreadSandboxes(SandboxBinding):
    """One sandbox per LangGraph thread, named ``thread-<thread_id>``.

    The sandbox is looked up by name on every call (get-or-create), so a graph
    resumed in another process finds the same sandbox and files; a paused or
    stopped sandbox is resumed or started, never replaced.

    Args:
        factory: Where the clients come from.
        prefix: Name prefix (``thread-``).
        create_options: Keyword arguments for :meth:`Threadbox.get_or_create`
            (``memory``, ``cpus``, ``idle_pause_secs``, ``ttl_secs``, ``image``...).
            ``idle_pause_secs`` defaults to 60 (pass ``None`` to never pause),
            ``idle_hibernate_secs`` to 600 (memory to swap after ten minutes, processes
            kept, where the host has swap) and ``idle_stop_secs`` to 3600 (stop after
            an hour without a call: files are kept, processes end; ``None`` never
            stops); there is no TTL from creation unless you set one (``ttl_secs``,
            ``ttl_action``).
        labels: Extra labels; ``langchain-thread`` (the thread id, when label-safe)
            and ``managed-by`` are always set.
    """

    def __init__(
        self,
        factory: ClientFactory | None = None,
        *,
        prefix: str = DEFAULT_THREAD_PREFIX,
        create_options: Mapping[str, Any] | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        self.factory = factory or ClientFactory()
        self.prefix = prefix
        self._options = {
            "idle_pause_secs": DEFAULT_THREAD_IDLE_PAUSE_SECS,
            "idle_hibernate_secs": DEFAULT_THREAD_IDLE_HIBERNATE_SECS,
            "idle_stop_secs": DEFAULT_THREAD_IDLE_STOP_SECS,
            **dict(create_options or {}),
        }
        self._labels = dict(labels or {})
        # Set by a TimeTravelSaver: it then brings the sandbox to the graph's checkpoint
        # before each call and notes the calls that may change files (ADR 0115).
        self.timeline: TimeTravelSaver | None = None

    def name_for(self, thread_id: str) -> str:
        return thread_sandbox_name(thread_id, self.prefix)

    def labels_for(self, thread_id: str) -> dict[str, str]:
        """The labels of the thread's sandbox (``managed-by``, ``langchain-thread``, extras)."""
        labels = {"managed-by": "langchain-threadbox", **self._labels}
        if _SAFE_ID.match(thread_id):
            labels["langchain-thread"] = thread_id
        return labels

    def resolve(self, config: RunnableConfig | None, *, writes: bool = True) -> Sandbox:
        tid = thread_id_from_config(config)
        if self.timeline is not None:
            return _ensure_running(self.timeline.sandbox_for_call(self, tid, config, writes))
        return _ensure_running(self.get_or_create(tid))

    async def aresolve(self, config: RunnableConfig | None, *, writes: bool = True) -> AsyncSandbox:
        tid = thread_id_from_config(config)
        if self.timeline is not None:
            return await _aensure_running(await self.timeline.asandbox_for_call(self, tid, config, writes))
        return await _aensure_running(await self.aget_or_create(tid))

    def get_or_create(self, thread_id: str) -> Sandbox:
        """The thread's sandbox, created if missing (not resumed or started)."""
        return self.factory.sync.get_or_create(
            self.name_for(thread_id), labels=self.labels_for(thread_id), on_exit="none", **self._options
        )

    async def aget_or_create(self, thread_id: str) -> AsyncSandbox:
        """Async twin of :meth:`get_or_create`."""
        return await self.factory.async_.get_or_create(
            self.name_for(thread_id), labels=self.labels_for(thread_id), on_exit="none", **self._options
        )

    def describe(self, config: RunnableConfig | None) -> str:
        try:
            return f"sandbox {self.name_for(thread_id_from_config(config))}"
        except ThreadIdMissing:
            return "the thread's sandbox"

    def release(self, thread_id: str, *, action: ReleaseAction = "delete") -> bool:
        """Stops or deletes a thread's sandbox; returns False if it did not exist."""
        return release_thread_sandbox(thread_id, action=action, client=self.factory.sync, prefix=self.prefix)

    async def arelease(self, thread_id: str, *, action: ReleaseAction = "delete") -> bool:
        return await arelease_thread_sandbox(thread_id, action=action, client=self.factory.async_, prefix=self.prefix)


#: What :func:`release_thread_sandbox` does with a finished (or waiting) thread's sandbox.
ReleaseAction = Literal["delete", "stop", "pause", "hibernate"]


def release_thread_sandbox(
    thread_id: str,
    *,
    action: ReleaseAction = "delete",
    client: Threadbox | None = None,
    prefix: str = DEFAULT_THREAD_PREFIX,
) -> bool:
    """Puts away the sandbox of a finished (or waiting) conversation.

    ``delete`` frees the disk; ``stop`` keeps the files (the next turn starts it again,
    its processes gone); ``pause`` freezes it in RAM (no CPU; the next call resumes it);
    ``hibernate`` freezes it and moves its memory out of RAM (swap on the jail tier, a
    checkpoint on disk on gvisor), processes and interpreter contexts continuing on the next
    call. Returns False when the thread has no sandbox.
    """
    tb = client or Threadbox()
    name = thread_sandbox_name(thread_id, prefix)
    try:
        if action == "delete":
            tb.delete(name, force=True)
        elif action == "stop":
            tb.get(name).stop()
        elif action == "pause":
            tb.get(name).pause()
        else:
            tb.get(name).hibernate()
    except ThreadboxError as e:
        if e.code == "not_found":
            return False
        raise
    return True


async def arelease_thread_sandbox(
    thread_id: str,
    *,
    action: ReleaseAction = "delete",
    client: AsyncThreadbox | None = None,
    prefix: str = DEFAULT_THREAD_PREFIX,
) -> bool:
    """Async twin of :func:`release_thread_sandbox`."""
    tb = client or AsyncThreadbox()
    name = thread_sandbox_name(thread_id, prefix)
    try:
        if action == "delete":
            await tb.delete(name, force=True)
        elif action == "stop":
            await (await tb.get(name)).stop()
        elif action == "pause":
            await (await tb.get(name)).pause()
        else:
            await (await tb.get(name)).hibernate()
    except ThreadboxError as e:
        if e.code == "not_found":
            return False
        raise
    return True
