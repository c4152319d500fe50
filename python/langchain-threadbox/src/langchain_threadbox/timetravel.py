"""LangGraph time travel that moves the thread's sandbox too (issue 14 scope 8, ADR 0115).

:class:`TimeTravelSaver` wraps any LangGraph checkpointer (``InMemorySaver``,
``SqliteSaver``, ``PostgresSaver``, their async twins) and keeps each thread's sandbox
(``thread-<thread_id>``) in step with the graph's checkpoints:

- a step whose tools may have changed files (``run_python``, ``run_shell``,
  ``write_file``; not ``read_file``/``list_files``) is saved with a sandbox checkpoint
  labelled ``lg-<checkpoint_id>``, named in the LangGraph checkpoint's metadata
  (``metadata["threadbox"]``); a step that did not touch the sandbox takes none;
- a run resumed from an earlier ``checkpoint_id`` (replay, ``update_state``) rewinds the
  sandbox, before its first tool call, to the nearest sandbox checkpoint at or before
  that point of the graph's history;
- ``copy_thread(src, dst)`` (LangGraph's way to branch into a new thread) copies the
  graph's checkpoints; the first tool call on ``dst`` forks ``thread-<src>`` at the right
  sandbox checkpoint into ``thread-<dst>``, and ``src`` keeps its files.

Example::

    from langgraph.checkpoint.memory import InMemorySaver
    from langchain_threadbox import ThreadboxToolkit
    from langchain_threadbox.timetravel import TimeTravelSaver

    saver = TimeTravelSaver(InMemorySaver())
    toolkit = ThreadboxToolkit(binding=saver.sandboxes)
    graph = builder.compile(checkpointer=saver)   # tools from toolkit.get_tools()

    graph.invoke(turn1, {"configurable": {"thread_id": "t"}})   # writes report.txt
    first = list(graph.get_state_history({"configurable": {"thread_id": "t"}}))[-2].config
    graph.invoke(turn2, {"configurable": {"thread_id": "t"}})   # overwrites it
    graph.invoke(None, first)        # the sandbox is back at turn 1's report.txt
    saver.copy_thread("t", "t2")     # thread-t2: a fork of thread-t, on first use

Only the root graph's checkpoints (``checkpoint_ns == ""``) take sandbox checkpoints: a
subgraph's tool calls are captured when its parent step is saved. Parallel branches
(``Send``) of one step share the thread's sandbox and its one checkpoint.
"""

from __future__ import annotations

import asyncio
import builtins
import hashlib
import logging
import re
import threading
import time
import weakref
from collections import OrderedDict, defaultdict
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import httpx
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)

from threadbox import AsyncSandbox, AsyncThreadbox, Sandbox, Threadbox, ThreadboxError

from .binding import ClientFactory, ThreadSandboxes

__all__ = [
    "BASE_LABEL",
    "META_KEY",
    "SandboxHistoryLost",
    "TimeTravelSaver",
    "checkpoint_label",
]

log = logging.getLogger(__name__)

#: The key of LangGraph checkpoint metadata naming the sandbox checkpoint of that step.
META_KEY = "threadbox"
#: The label of a thread sandbox's checkpoint taken when it was created (empty disk).
BASE_LABEL = "lg-base"
LABEL_PREFIX = "lg-"
# How far back the parent chain is walked looking for a sandbox checkpoint.
MAX_WALK = 10_000
# How long a tool call waits for LangGraph's (background) put of the checkpoint its step
# runs from, and how many put checkpoint ids are remembered for that.
PUT_WAIT_SECS = 60.0
_PUT_MEMORY = 4096
_LABEL_SAFE = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")


class SandboxHistoryLost(RuntimeError):
    """The sandbox checkpoint of a point in the graph's history is gone (pruned, or its
    sandbox deleted), so the sandbox cannot be brought exactly there."""


def checkpoint_label(checkpoint_id: str) -> str:
    """The sandbox checkpoint label of a LangGraph ``checkpoint_id``: ``lg-<id>``."""
    cid = str(checkpoint_id)
    if _LABEL_SAFE.match(cid):
        return LABEL_PREFIX + cid
    return LABEL_PREFIX + "h" + hashlib.sha256(cid.encode("utf-8")).hexdigest()[:40]


def _root_checkpoint_id(config: RunnableConfig | Mapping[str, Any] | None) -> str | None:
    """The root graph's checkpoint a task runs from (LangGraph's ``checkpoint_map[""]``)."""
    conf: Mapping[str, Any] = (config or {}).get("configurable") or {}
    if config is None:
        try:
            from langgraph.config import get_config

            conf = get_config().get("configurable") or {}
        except (ImportError, RuntimeError):
            conf = {}
    if conf.get("__pregel_durability") == "exit":
        # Nothing is saved before the run ends: the step's checkpoint cannot be waited for
        # or walked; the disk is taken to follow the thread's latest saved one (ADR 0115).
        return None
    cid = (conf.get("checkpoint_map") or {}).get("")
    return str(cid) if cid else None


def _thread_config(thread_id: str, checkpoint_id: str | None = None, ns: str = "") -> RunnableConfig:
    conf: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ns}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


@dataclass(frozen=True)
class _Mark:
    """A point of the graph's history whose step took a sandbox checkpoint."""

    checkpoint_id: str
    sandbox: str
    label: str


def _mark_of(tup: CheckpointTuple) -> _Mark | None:
    m = (tup.metadata or {}).get(META_KEY)
    if isinstance(m, Mapping) and isinstance(m.get("sandbox"), str) and isinstance(m.get("checkpoint"), str):
        return _Mark(str(tup.checkpoint["id"]), m["sandbox"], m["checkpoint"])
    return None


@dataclass
class _Thread:
    # The LangGraph checkpoint (root namespace) whose files the disk holds; None: not known
    # in this process yet.
    disk: str | None = None
    # The disk is known not to hold `disk`'s successor the graph went on from (a branch).
    stale: bool = False
    # A call that may change files ran since the last sandbox checkpoint.
    dirty: bool = False
    # LangGraph's put of a dirty step failed: if the step runs again, the disk is first
    # brought back to where it ran from.
    unsaved: bool = False


@dataclass(frozen=True)
class _Action:
    kind: Literal["keep", "rewind", "fork", "base", "fresh"]
    sandbox: str = ""
    label: str = ""


def _lg_labels(labels: Sequence[str | None]) -> list[str]:
    return [lab for lab in labels if lab and lab.startswith(LABEL_PREFIX) and lab != BASE_LABEL]


class TimeTravelSaver(BaseCheckpointSaver[Any]):
    """A checkpointer that wraps ``inner`` and moves thread sandboxes with time travel.

    Args:
        inner: The LangGraph checkpointer that stores the graph's checkpoints (the
            truth: the sandbox follows it).
        sandboxes: The per-thread binding the tools use (give the same object to
            ``ThreadboxToolkit(binding=...)``); one is made from ``client`` if omitted.
        client: The threadbox client for a binding made here.
        max_checkpoints: Most ``lg-`` sandbox checkpoints kept per thread sandbox; the
            oldest go first (``None``: no bound). Each one counts in the tenant's disk.
        on_missing: When the sandbox checkpoint of the point resumed from is gone:
            ``"warn"`` (log, use the nearest older one) or ``"raise"``
            (:class:`SandboxHistoryLost`).
    """

    def __init__(
        self,
        inner: BaseCheckpointSaver[Any],
        sandboxes: ThreadSandboxes | None = None,
        *,
        client: Threadbox | None = None,
        max_checkpoints: int | None = 64,
        on_missing: Literal["warn", "raise"] = "warn",
    ) -> None:
        super().__init__(serde=inner.serde)
        self.inner = inner
        self.sandboxes = sandboxes if sandboxes is not None else ThreadSandboxes(ClientFactory(client))
        self.sandboxes.timeline = self
        self.max_checkpoints = max_checkpoints
        self.on_missing = on_missing
        self._threads: dict[str, _Thread] = defaultdict(_Thread)
        self._lock = threading.Lock()
        # Signalled after each put: a tool call waits for its step's checkpoint (LangGraph
        # saves in the background, durability="async", while the next step's tools run).
        self._put_cond = threading.Condition(self._lock)
        self._put_done: OrderedDict[str, None] = OrderedDict()
        self._tlocks: dict[str, threading.Lock] = defaultdict(threading.Lock)
        self._alocks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Lock]] = (
            weakref.WeakKeyDictionary()
        )

    # -- state ----------------------------------------------------------------

    def _tlock(self, thread_id: str) -> threading.Lock:
        with self._lock:
            return self._tlocks[thread_id]

    def _alock(self, thread_id: str) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        with self._lock:
            locks = self._alocks.setdefault(loop, {})
            if thread_id not in locks:
                locks[thread_id] = asyncio.Lock()
            return locks[thread_id]

    def _saved(self, checkpoint_id: str) -> None:
        with self._put_cond:
            self._put_done[checkpoint_id] = None
            while len(self._put_done) > _PUT_MEMORY:
                self._put_done.popitem(last=False)
            self._put_cond.notify_all()

    def _wait_saved(self, thread_id: str, checkpoint_id: str) -> None:
        """Waits until the checkpoint a step runs from is stored (it may still be on its
        way: LangGraph puts in the background while the next step runs)."""
        with self._lock:
            if checkpoint_id in self._put_done:
                return
        if self.inner.get_tuple(_thread_config(thread_id, checkpoint_id)) is not None:
            return
        deadline = time.monotonic() + PUT_WAIT_SECS
        with self._put_cond:
            while checkpoint_id not in self._put_done:
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("LangGraph checkpoint %s was not saved in %gs; going on", checkpoint_id, PUT_WAIT_SECS)
                    return
                self._put_cond.wait(left)

    async def _await_saved(self, thread_id: str, checkpoint_id: str) -> None:
        with self._lock:
            if checkpoint_id in self._put_done:
                return
        if await self.inner.aget_tuple(_thread_config(thread_id, checkpoint_id)) is not None:
            return
        deadline = time.monotonic() + PUT_WAIT_SECS
        while True:
            with self._put_cond:
                if checkpoint_id in self._put_done:
                    return
            left = deadline - time.monotonic()
            if left <= 0:
                log.warning("LangGraph checkpoint %s was not saved in %gs; going on", checkpoint_id, PUT_WAIT_SECS)
                return
            # Off the event loop: aput runs on it and signals the condition.
            await asyncio.to_thread(self._wait_signal, checkpoint_id, min(left, 1.0))

    def _wait_signal(self, checkpoint_id: str, timeout: float) -> None:
        with self._put_cond:
            if checkpoint_id not in self._put_done:
                self._put_cond.wait(timeout)

    def _state(self, thread_id: str) -> _Thread:
        with self._lock:
            return self._threads[thread_id]

    def _lost(self, what: str) -> None:
        if self.on_missing == "raise":
            raise SandboxHistoryLost(what)
        log.warning("%s", what)

    # -- delegation -------------------------------------------------------------

    @property
    def config_specs(self) -> builtins.list[Any]:
        return list(self.inner.config_specs)

    def get_next_version(self, current: Any, channel: None) -> Any:
        return self.inner.get_next_version(current, channel)

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self.inner.get_tuple(config)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self.inner.aget_tuple(config)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        return self.inner.list(config, filter=filter, before=before, limit=limit)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        async for t in self.inner.alist(config, filter=filter, before=before, limit=limit):
            yield t

    def put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        self.inner.put_writes(config, writes, task_id, task_path)

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        await self.inner.aput_writes(config, writes, task_id, task_path)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        # The sandbox checkpoints of those runs' steps stay until the thread is pruned or
        # deleted, or the per-sandbox bound drops them (ADR 0115).
        self.inner.delete_for_runs(run_ids)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self.inner.adelete_for_runs(run_ids)

    def get_delta_channel_history(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.get_delta_channel_history(*args, **kwargs)

    async def aget_delta_channel_history(self, *args: Any, **kwargs: Any) -> Any:
        return await self.inner.aget_delta_channel_history(*args, **kwargs)

    # -- the graph's history ------------------------------------------------------

    def _latest_id(self, thread_id: str) -> str | None:
        t = self.inner.get_tuple(_thread_config(thread_id))
        return str(t.checkpoint["id"]) if t is not None else None

    async def _alatest_id(self, thread_id: str) -> str | None:
        t = await self.inner.aget_tuple(_thread_config(thread_id))
        return str(t.checkpoint["id"]) if t is not None else None

    def _marks(self, thread_id: str, checkpoint_id: str, first_only: bool = False) -> builtins.list[_Mark]:
        """The sandbox checkpoints on the path from ``checkpoint_id`` back to the root,
        nearest first."""
        out: builtins.list[_Mark] = []
        cfg: RunnableConfig | None = _thread_config(thread_id, checkpoint_id)
        for _ in range(MAX_WALK):
            if cfg is None:
                break
            tup = self.inner.get_tuple(cfg)
            if tup is None:
                break
            m = _mark_of(tup)
            if m is not None:
                out.append(m)
                if first_only:
                    break
            cfg = tup.parent_config
        return out

    async def _amarks(self, thread_id: str, checkpoint_id: str, first_only: bool = False) -> builtins.list[_Mark]:
        out: builtins.list[_Mark] = []
        cfg: RunnableConfig | None = _thread_config(thread_id, checkpoint_id)
        for _ in range(MAX_WALK):
            if cfg is None:
                break
            tup = await self.inner.aget_tuple(cfg)
            if tup is None:
                break
            m = _mark_of(tup)
            if m is not None:
                out.append(m)
                if first_only:
                    break
            cfg = tup.parent_config
        return out

    def _trusted(self, own: str, st: _Thread, desired: str, latest: str | None, nearest: builtins.list[_Mark]) -> bool:
        """First contact in this process: the disk is taken to hold the thread's latest
        checkpoint when the graph is there and the nearest sandbox checkpoint is its own."""
        return not st.stale and desired == latest and (not nearest or nearest[0].sandbox == own)

    def _plan(
        self,
        own: str,
        desired: str,
        marks: builtins.list[_Mark],
        labels_of: Mapping[str, set[str] | None],
    ) -> _Action:
        """Where the files of ``desired`` are: ``labels_of`` maps each sandbox named in
        ``marks`` to its checkpoint labels (``None``: no such sandbox)."""
        for m in marks:
            labels = labels_of.get(m.sandbox)
            if labels is not None and m.label in labels:
                return _Action("rewind" if m.sandbox == own else "fork", m.sandbox, m.label)
            where = "it was deleted" if labels is None else "its checkpoint was pruned"
            self._lost(
                f"the sandbox files of LangGraph checkpoint {m.checkpoint_id} were in {m.sandbox} "
                f"({m.label}), but {where}; using the nearest older point"
            )
        own_labels = labels_of.get(own)
        if own_labels is None:
            return _Action("fresh")
        if BASE_LABEL in own_labels:
            return _Action("base", own, BASE_LABEL)
        self._lost(f"{own} has no sandbox checkpoint at or before LangGraph checkpoint {desired}; its disk is kept")
        return _Action("keep")

    # -- the call path (ThreadSandboxes.resolve) ----------------------------------

    def sandbox_for_call(self, binding: ThreadSandboxes, thread_id: str, config: Any, writes: bool) -> Sandbox:
        """The thread's sandbox for a tool call, first brought to the graph's checkpoint."""
        desired = _root_checkpoint_id(config)
        if desired is not None:
            self._wait_saved(thread_id, desired)
        with self._tlock(thread_id):
            st = self._state(thread_id)
            desired = desired or self._latest_id(thread_id)
            if desired is not None and (st.disk != desired or st.unsaved):
                self._bring(binding, thread_id, desired, st)
            sb = binding.get_or_create(thread_id)
            if sb.created:
                self._on_created(sb, thread_id, desired)
            if writes:
                st.dirty = True
            return sb

    def _bring(self, binding: ThreadSandboxes, thread_id: str, desired: str, st: _Thread) -> None:
        own = binding.name_for(thread_id)
        if st.disk is None:
            nearest = self._marks(thread_id, desired, first_only=True)
            if self._trusted(own, st, desired, self._latest_id(thread_id), nearest):
                st.disk = desired
                # A step that crashed before LangGraph's put runs again: from its parent's files.
                if not self._orphan_check(thread_id):
                    return
        marks = self._marks(thread_id, desired)
        tb = binding.factory.sync
        handles: dict[str, Sandbox | None] = {}
        labels_of: dict[str, set[str] | None] = {}
        for name in {own, *(m.sandbox for m in marks)}:
            handles[name] = _get(tb, name)
            h = handles[name]
            labels_of[name] = None if h is None else {c.label for c in h.checkpoints() if c.label}
        act = self._plan(own, desired, marks, labels_of)
        mine = handles.get(own)
        if act.kind in ("rewind", "base") and mine is not None:
            mine.rewind(act.label)
            log.info("rewound %s to %s for LangGraph checkpoint %s", own, act.label, desired)
        elif act.kind == "fork":
            src = handles[act.sandbox]
            assert src is not None
            if mine is not None:
                log.warning("%s is replaced by a fork of %s at %s", own, act.sandbox, act.label)
                mine.delete(missing_ok=True)
            src.fork(names=[own], checkpoint=act.label, labels=binding.labels_for(thread_id))
            log.info("forked %s at %s into %s", act.sandbox, act.label, own)
        st.disk, st.stale, st.dirty, st.unsaved = desired, False, False, False

    def _on_created(self, sb: Sandbox, thread_id: str, desired: str | None) -> None:
        if desired is not None and any(m.sandbox == sb.name for m in self._marks(thread_id, desired)):
            self._lost(f"{sb.name} was deleted: its files of earlier turns are gone; it starts empty")
        sb.checkpoint(BASE_LABEL)
        st = self._state(thread_id)
        st.disk, st.stale = desired, False

    async def asandbox_for_call(
        self, binding: ThreadSandboxes, thread_id: str, config: Any, writes: bool
    ) -> AsyncSandbox:
        """Async twin of :meth:`sandbox_for_call`."""
        desired = _root_checkpoint_id(config)
        if desired is not None:
            await self._await_saved(thread_id, desired)
        async with self._alock(thread_id):
            st = self._state(thread_id)
            desired = desired or await self._alatest_id(thread_id)
            if desired is not None and (st.disk != desired or st.unsaved):
                await self._abring(binding, thread_id, desired, st)
            sb = await binding.aget_or_create(thread_id)
            if sb.created:
                if desired is not None and any(m.sandbox == sb.name for m in await self._amarks(thread_id, desired)):
                    self._lost(f"{sb.name} was deleted: its files of earlier turns are gone; it starts empty")
                await sb.checkpoint(BASE_LABEL)
                st.disk, st.stale = desired, False
            if writes:
                st.dirty = True
            return sb

    async def _abring(self, binding: ThreadSandboxes, thread_id: str, desired: str, st: _Thread) -> None:
        own = binding.name_for(thread_id)
        if st.disk is None:
            nearest = await self._amarks(thread_id, desired, first_only=True)
            if self._trusted(own, st, desired, await self._alatest_id(thread_id), nearest):
                st.disk = desired
                # A step that crashed before LangGraph's put runs again: from its parent's files.
                if not await self._aorphan_check(thread_id):
                    return
        marks = await self._amarks(thread_id, desired)
        tb = binding.factory.async_
        handles: dict[str, AsyncSandbox | None] = {}
        labels_of: dict[str, set[str] | None] = {}
        for name in {own, *(m.sandbox for m in marks)}:
            h = await _aget(tb, name)
            handles[name] = h
            labels_of[name] = None if h is None else {c.label for c in await h.checkpoints() if c.label}
        act = self._plan(own, desired, marks, labels_of)
        mine = handles.get(own)
        if act.kind in ("rewind", "base") and mine is not None:
            await mine.rewind(act.label)
            log.info("rewound %s to %s for LangGraph checkpoint %s", own, act.label, desired)
        elif act.kind == "fork":
            src = handles[act.sandbox]
            assert src is not None
            if mine is not None:
                log.warning("%s is replaced by a fork of %s at %s", own, act.sandbox, act.label)
                await mine.delete(missing_ok=True)
            await src.fork(names=[own], checkpoint=act.label, labels=binding.labels_for(thread_id))
            log.info("forked %s at %s into %s", act.sandbox, act.label, own)
        st.disk, st.stale, st.dirty, st.unsaved = desired, False, False, False

    # -- put ----------------------------------------------------------------------

    def _before_put(self, st: _Thread, parent: str | None, new: str, trusted: bool) -> None:
        """A step saved without sandbox changes: the disk holds ``new`` if it held its parent."""
        if st.disk is not None:
            if st.disk == parent:
                st.disk = new
        elif trusted:
            st.disk = new
        else:
            # A run went on from an earlier checkpoint than the latest one, or from a copy
            # of another thread, in a process that has not seen this thread yet: the disk
            # is somewhere else.
            st.stale = True

    def _trusted_put(self, thread_id: str, st: _Thread, parent: str | None) -> bool:
        if st.disk is not None or parent is None or st.dirty:
            return True
        own = self.sandboxes.name_for(thread_id)
        nearest = self._marks(thread_id, parent, True)
        ok = self._trusted(own, st, parent, self._latest_id(thread_id), nearest)
        if ok and self._orphan_check(thread_id):
            st.dirty = True
        return ok

    async def _atrusted_put(self, thread_id: str, st: _Thread, parent: str | None) -> bool:
        if st.disk is not None or parent is None or st.dirty:
            return True
        own = self.sandboxes.name_for(thread_id)
        nearest = await self._amarks(thread_id, parent, True)
        ok = self._trusted(own, st, parent, await self._alatest_id(thread_id), nearest)
        if ok and await self._aorphan_check(thread_id):
            st.dirty = True
        return ok

    def _orphan_check(self, thread_id: str) -> bool:
        """First contact with a thread that used its sandbox: a newest ``lg-`` checkpoint
        that no LangGraph checkpoint has is a step that crashed after its sandbox
        checkpoint and before LangGraph's put. The disk holds that step's changes (which
        LangGraph replays from its saved writes, or runs again). One look-up per thread
        and process; a daemon out of reach does not fail LangGraph's put."""
        try:
            sb = _get(self.sandboxes.factory.sync, self.sandboxes.name_for(thread_id))
            ours = _lg_labels([c.label for c in sb.checkpoints()]) if sb is not None else []
        except (ThreadboxError, httpx.HTTPError) as e:
            log.warning("%s: could not look at its sandbox's checkpoints: %s", thread_id, e)
            return False
        cid = _id_of_label(ours[-1]) if ours else None
        if cid is not None and self.inner.get_tuple(_thread_config(thread_id, cid)) is None:
            log.info("%s: %s has no LangGraph checkpoint (a crash before its put)", thread_id, ours[-1])
            return True
        return False

    async def _aorphan_check(self, thread_id: str) -> bool:
        try:
            sb = await _aget(self.sandboxes.factory.async_, self.sandboxes.name_for(thread_id))
            ours = _lg_labels([c.label for c in await sb.checkpoints()]) if sb is not None else []
        except (ThreadboxError, httpx.HTTPError) as e:
            log.warning("%s: could not look at its sandbox's checkpoints: %s", thread_id, e)
            return False
        cid = _id_of_label(ours[-1]) if ours else None
        if cid is not None and await self.inner.aget_tuple(_thread_config(thread_id, cid)) is None:
            log.info("%s: %s has no LangGraph checkpoint (a crash before its put)", thread_id, ours[-1])
            return True
        return False

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        conf = config.get("configurable") or {}
        if conf.get("checkpoint_ns") or conf.get("thread_id") is None:
            return self.inner.put(config, checkpoint, metadata, new_versions)
        tid = str(conf["thread_id"])
        parent = conf.get("checkpoint_id")
        new = str(checkpoint["id"])
        with self._tlock(tid):
            st = self._state(tid)
            trusted = self._trusted_put(tid, st, parent)
            # The state changes only once LangGraph's put went through: if it fails, the
            # disk's changes are still named by no checkpoint, and the next put names them.
            if st.dirty:
                mark = self._take(tid, new)
                if mark is not None:
                    metadata = cast(CheckpointMetadata, {**metadata, META_KEY: mark})
                try:
                    out = self.inner.put(config, checkpoint, metadata, new_versions)
                except BaseException:
                    st.unsaved = True
                    raise
                st.disk, st.stale, st.dirty, st.unsaved = new, False, False, False
            else:
                out = self.inner.put(config, checkpoint, metadata, new_versions)
                self._before_put(st, parent, new, trusted)
        self._saved(new)
        return out

    def _take(self, thread_id: str, new: str) -> dict[str, str] | None:
        """The sandbox checkpoint of step ``new``, taken before LangGraph's (ADR 0115)."""
        name = self.sandboxes.name_for(thread_id)
        sb = _get(self.sandboxes.factory.sync, name)
        if sb is None:
            log.warning("%s was deleted during the step: no sandbox checkpoint for %s", name, new)
            return None
        label = checkpoint_label(new)
        try:
            sb.checkpoint(label)
        except ThreadboxError as e:
            if e.code != "conflict":
                raise
            # Left by a step that crashed after its sandbox checkpoint and before
            # LangGraph's put (ADR 0115): this run's files replace it.
            sb.delete_checkpoint(label)
            sb.checkpoint(label)
        if self.max_checkpoints is not None:
            ours = _lg_labels([c.label for c in sb.checkpoints()])
            for old in ours[: max(0, len(ours) - self.max_checkpoints)]:
                sb.delete_checkpoint(old)
        return {"sandbox": name, "checkpoint": label}

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        conf = config.get("configurable") or {}
        if conf.get("checkpoint_ns") or conf.get("thread_id") is None:
            return await self.inner.aput(config, checkpoint, metadata, new_versions)
        tid = str(conf["thread_id"])
        parent = conf.get("checkpoint_id")
        new = str(checkpoint["id"])
        async with self._alock(tid):
            st = self._state(tid)
            trusted = await self._atrusted_put(tid, st, parent)
            if st.dirty:
                mark = await self._atake(tid, new)
                if mark is not None:
                    metadata = cast(CheckpointMetadata, {**metadata, META_KEY: mark})
                try:
                    out = await self.inner.aput(config, checkpoint, metadata, new_versions)
                except BaseException:
                    st.unsaved = True
                    raise
                st.disk, st.stale, st.dirty, st.unsaved = new, False, False, False
            else:
                out = await self.inner.aput(config, checkpoint, metadata, new_versions)
                self._before_put(st, parent, new, trusted)
        self._saved(new)
        return out

    async def _atake(self, thread_id: str, new: str) -> dict[str, str] | None:
        name = self.sandboxes.name_for(thread_id)
        sb = await _aget(self.sandboxes.factory.async_, name)
        if sb is None:
            log.warning("%s was deleted during the step: no sandbox checkpoint for %s", name, new)
            return None
        label = checkpoint_label(new)
        try:
            await sb.checkpoint(label)
        except ThreadboxError as e:
            if e.code != "conflict":
                raise
            await sb.delete_checkpoint(label)
            await sb.checkpoint(label)
        if self.max_checkpoints is not None:
            ours = _lg_labels([c.label for c in await sb.checkpoints()])
            for old in ours[: max(0, len(ours) - self.max_checkpoints)]:
                await sb.delete_checkpoint(old)
        return {"sandbox": name, "checkpoint": label}

    # -- threads: copy, delete, prune ------------------------------------------------

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copies the graph's checkpoints (and pending writes) of one thread to another.

        The sandbox checkpoints stay named in the copies' metadata: the first call on the
        target forks the source's sandbox at the right one into ``thread-<target>``.
        """
        try:
            self.inner.copy_thread(source_thread_id, target_thread_id)
        except NotImplementedError:
            for t in reversed(list(self.inner.list(_thread_config_any(source_thread_id)))):
                cfg, writes = _copy_args(t, target_thread_id)
                self.inner.put(cfg, t.checkpoint, t.metadata, dict(t.checkpoint["channel_versions"]))
                for wcfg, task, ws in writes:
                    self.inner.put_writes(wcfg, ws, task)
        self._forget(target_thread_id)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Async twin of :meth:`copy_thread`."""
        try:
            await self.inner.acopy_thread(source_thread_id, target_thread_id)
        except NotImplementedError:
            tuples = [t async for t in self.inner.alist(_thread_config_any(source_thread_id))]
            for t in reversed(tuples):
                cfg, writes = _copy_args(t, target_thread_id)
                await self.inner.aput(cfg, t.checkpoint, t.metadata, dict(t.checkpoint["channel_versions"]))
                for wcfg, task, ws in writes:
                    await self.inner.aput_writes(wcfg, ws, task)
        self._forget(target_thread_id)

    def _forget(self, thread_id: str) -> None:
        with self._lock:
            self._threads[thread_id] = _Thread(stale=True)

    def delete_thread(self, thread_id: str) -> None:
        """Deletes the thread's checkpoints and its sandbox's ``lg-`` checkpoints (the
        sandbox and its files stay: :func:`release_thread_sandbox` removes them)."""
        self.inner.delete_thread(thread_id)
        sb = _get(self.sandboxes.factory.sync, self.sandboxes.name_for(thread_id))
        if sb is not None:
            for c in sb.checkpoints():
                if c.label and c.label.startswith(LABEL_PREFIX):
                    sb.delete_checkpoint(c.id)
        with self._lock:
            self._threads.pop(thread_id, None)

    async def adelete_thread(self, thread_id: str) -> None:
        """Async twin of :meth:`delete_thread`."""
        await self.inner.adelete_thread(thread_id)
        sb = await _aget(self.sandboxes.factory.async_, self.sandboxes.name_for(thread_id))
        if sb is not None:
            for c in await sb.checkpoints():
                if c.label and c.label.startswith(LABEL_PREFIX):
                    await sb.delete_checkpoint(c.id)
        with self._lock:
            self._threads.pop(thread_id, None)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Prunes the graph's checkpoints, then the sandbox checkpoints no remaining
        checkpoint of the thread names (``lg-base`` stays)."""
        self.inner.prune(thread_ids, strategy=strategy)
        for tid in thread_ids:
            name = self.sandboxes.name_for(tid)
            sb = _get(self.sandboxes.factory.sync, name)
            if sb is None:
                continue
            named = _named(self.inner.list(_thread_config_any(tid)), name)
            for c in sb.checkpoints():
                if c.label in _lg_labels([c.label]) and c.label not in named:
                    sb.delete_checkpoint(c.id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Async twin of :meth:`prune`."""
        await self.inner.aprune(thread_ids, strategy=strategy)
        for tid in thread_ids:
            name = self.sandboxes.name_for(tid)
            sb = await _aget(self.sandboxes.factory.async_, name)
            if sb is None:
                continue
            named = _named([t async for t in self.inner.alist(_thread_config_any(tid))], name)
            for c in await sb.checkpoints():
                if c.label in _lg_labels([c.label]) and c.label not in named:
                    await sb.delete_checkpoint(c.id)


def _id_of_label(label: str) -> str | None:
    """The LangGraph checkpoint id a ``lg-`` label was made from (None for a hashed one)."""
    cid = label[len(LABEL_PREFIX) :]
    return None if cid.startswith("h") and len(cid) == 41 else cid


def _thread_config_any(thread_id: str) -> RunnableConfig:
    """Every namespace of a thread (``list`` without ``checkpoint_ns``)."""
    return {"configurable": {"thread_id": thread_id}}


def _named(tuples: Any, sandbox: str) -> set[str]:
    out: set[str] = set()
    for t in tuples:
        m = _mark_of(t)
        if m is not None and m.sandbox == sandbox:
            out.add(m.label)
    return out


def _copy_args(
    t: CheckpointTuple, target: str
) -> tuple[RunnableConfig, builtins.list[tuple[RunnableConfig, str, builtins.list[tuple[str, Any]]]]]:
    """``put`` and ``put_writes`` arguments that store ``t`` under thread ``target``."""
    ns = str((t.config.get("configurable") or {}).get("checkpoint_ns", ""))
    parent = (t.parent_config or {}).get("configurable", {}).get("checkpoint_id") if t.parent_config else None
    cfg = _thread_config(target, parent, ns)
    by_task: dict[str, builtins.list[tuple[str, Any]]] = {}
    for task_id, channel, value in t.pending_writes or []:
        by_task.setdefault(task_id, []).append((channel, value))
    wcfg = _thread_config(target, str(t.checkpoint["id"]), ns)
    return cfg, [(wcfg, task, ws) for task, ws in by_task.items()]


def _get(tb: Threadbox, name: str) -> Sandbox | None:
    try:
        return tb.get(name)
    except ThreadboxError as e:
        if e.code == "not_found":
            return None
        raise


async def _aget(tb: AsyncThreadbox, name: str) -> AsyncSandbox | None:
    try:
        return await tb.get(name)
    except ThreadboxError as e:
        if e.code == "not_found":
            return None
        raise
