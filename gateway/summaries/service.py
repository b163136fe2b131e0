"""Summaries for the gateway's requests: made in the background, single-flight across
replicas, kept where every replica finds them.

The summarize stage hands over ``SummaryJob``s (``pipelines.checkpoints``). A job scheduled
*later* goes into a bounded queue served by a few workers; one asked for *now* runs in the
request, within its deadline. Either way it runs under the conversation's summary lock in
the store (``SET NX`` with an expiry: the job's deadline plus a margin, so a replica that
dies holding it blocks nobody for long), and its checkpoint is kept as the conversation's
latest, where the next request, on any replica, reads it. A request that needs a summary
while one is being made waits for that one instead of asking for another: in this process
by awaiting it, across replicas by watching for the checkpoint the lock holder will write.

At most one job per conversation is queued or running in a process; a full queue drops
the newest job (a later request schedules it again). Shutting down cancels what is queued
and running, releasing the locks.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Final

from gateway.store.conversations import ConversationRecords
from pipelines import OffloadStore, StoreError, Summarizer
from pipelines.checkpoints import Checkpoint, SummaryJob
from pipelines.local_summaries import run_job
from pipelines.summary import SummaryFailed

__all__ = ["BoundSummaries", "SummaryService"]

log = logging.getLogger("contextgate.summaries")

_LOCK_MARGIN: Final = 5.0
"""Seconds a summary lock outlives its job's deadline."""
_WATCH_EVERY: Final = (0.05, 0.5)
"""First and longest wait between looks at another replica's checkpoint."""

_Key = tuple[str, str]


@dataclass(frozen=True, slots=True)
class _Queued:
    key: _Key
    job: SummaryJob
    summarizer: Summarizer
    timeout: float


class SummaryService:
    """The process's summary workers and its view of the shared checkpoints and locks."""

    __slots__ = (
        "_closed",
        "_pending",
        "_queue",
        "_running",
        "_workers",
        "counts",
        "objects",
        "queue_size",
        "records",
        "workers",
    )

    def __init__(
        self,
        records: ConversationRecords,
        objects: OffloadStore,
        *,
        workers: int = 2,
        queue_size: int = 64,
    ) -> None:
        self.records, self.objects = records, objects
        self.workers, self.queue_size = workers, queue_size
        self._queue: asyncio.Queue[_Queued] | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._pending: set[_Key] = set()
        """Conversations with a job queued or running here."""
        self._running: dict[_Key, asyncio.Future[Checkpoint | None]] = {}
        self._closed = False
        self.counts: Counter[str] = Counter()
        """Jobs by outcome: scheduled, busy, queue_full, made, reused, locked, failed."""

    def bind(
        self, namespace: str, conversation: str, summarizer: Summarizer | None, timeout: float
    ) -> BoundSummaries:
        """The ``pipelines.ports.Summaries`` of one request (``summarizer`` ``None``:
        a dry run, which reads checkpoints and makes none)."""
        return BoundSummaries(self, (namespace, conversation), summarizer, timeout)

    def schedule(self, key: _Key, job: SummaryJob, summarizer: Summarizer, timeout: float) -> bool:
        if self._closed:
            return False
        if key in self._pending or key in self._running:
            self.counts["busy"] += 1
            return False
        queue = self._started()
        try:
            queue.put_nowait(_Queued(key, job, summarizer, timeout))
        except asyncio.QueueFull:
            self.counts["queue_full"] += 1
            return False
        self._pending.add(key)
        self.counts["scheduled"] += 1
        return True

    async def now(
        self, key: _Key, job: SummaryJob, summarizer: Summarizer, within: float
    ) -> Checkpoint:
        namespace, conversation = key
        async with asyncio.timeout(within):
            before = await self.records.checkpoint(namespace, conversation)
            pause, longest = _WATCH_EVERY
            while True:
                running = self._running.get(key)
                if running is not None:
                    # The one being made here; if it ends without a checkpoint (its own
                    # request's deadline may have been shorter), this one tries next round.
                    found = await asyncio.shield(running)
                    if found is not None:
                        return found
                    continue
                made = await self._make(key, job, summarizer, within)
                if made is not None:
                    return made
                # Another replica holds the lock: it writes its checkpoint when done, or
                # lets the lock go (then this request takes it on the next round).
                await asyncio.sleep(pause)
                pause = min(longest, pause * 2)
                data = await self.records.checkpoint(namespace, conversation)
                found = Checkpoint.from_json(data) if data != before else None
                if found is not None:
                    return found

    async def _make(
        self,
        key: _Key,
        job: SummaryJob,
        summarizer: Summarizer,
        seconds: float,
        *,
        background: bool = False,
    ) -> Checkpoint | None:
        """Run ``job`` under the conversation's lock and keep its checkpoint; ``None``
        when another holds the lock (``StoreError`` when the store cannot say). A
        checkpoint of the same messages, still stored, made meanwhile is returned as it is."""
        namespace, conversation = key
        token = await self.records.lock(namespace, conversation, seconds + _LOCK_MARGIN)
        if token is None:
            self.counts["locked"] += 1
            return None
        future: asyncio.Future[Checkpoint | None] = asyncio.get_running_loop().create_future()
        self._running[key] = future
        made: Checkpoint | None = None
        try:
            existing = Checkpoint.from_json(await self.records.checkpoint(namespace, conversation))
            if (
                existing is not None
                and (
                    (existing.start, existing.end, existing.chain)
                    == (job.start, job.end, job.chain)
                    # A background job made stale by a larger checkpoint made meanwhile (on the
                    # spot, or by another replica) is dropped rather than shrinking it.
                    or (background and existing.start == job.start and existing.end > job.end)
                )
                and await self._stored(existing, job)
            ):
                self.counts["reused"] += 1
                made = existing
            else:
                async with asyncio.timeout(seconds):
                    made = await run_job(job, summarizer, self.objects)
                await self.records.keep_checkpoint(namespace, conversation, made.to_json())
                self.counts["made"] += 1
            return made
        except (SummaryFailed, StoreError, TimeoutError):
            self.counts["failed"] += 1
            raise
        finally:
            future.set_result(made)
            if self._running.get(key) is future:
                del self._running[key]
            await self.records.unlock(namespace, conversation, token)

    async def _stored(self, checkpoint: Checkpoint, job: SummaryJob) -> bool:
        touch = getattr(self.objects, "touch", None)
        if touch is None:
            return False
        for ref in checkpoint.stored:
            if not await touch(job.namespace, ref, job.ttl):
                return False
        return True

    def _started(self) -> asyncio.Queue[_Queued]:
        if self._queue is None:
            self._queue = asyncio.Queue(self.queue_size)
            loop = asyncio.get_running_loop()
            self._workers = [loop.create_task(self._work()) for _ in range(self.workers)]
        return self._queue

    async def _work(self) -> None:
        assert self._queue is not None
        while True:
            item = await self._queue.get()
            try:
                await self._make(item.key, item.job, item.summarizer, item.timeout, background=True)
            except (SummaryFailed, StoreError, TimeoutError) as exc:
                log.warning("background summary failed: %s", str(exc) or "deadline")
            except Exception:
                log.warning("background summary failed", exc_info=True)
            finally:
                self._pending.discard(item.key)

    @property
    def busy(self) -> bool:
        """Whether a summary is queued or being made in this process."""
        return bool(self._pending or self._running)

    async def aclose(self) -> None:
        """Stop: queued jobs are dropped, running ones cancelled (their locks released)."""
        self._closed = True
        for worker in self._workers:
            worker.cancel()
        if self._workers:
            await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []


@dataclass(slots=True)
class BoundSummaries:
    """The summaries of one request's conversation (``pipelines.ports.Summaries``).

    One request sees one snapshot: the prepared checkpoint as it first read it, and the
    answer it first got for a job, when the pipeline runs twice over it (the second time
    with the restore tool, ``gateway.context.compaction``), so the second run takes the same path
    as the first and reports it the same way, without asking for any summary again."""

    service: SummaryService
    key: _Key
    summarizer: Summarizer | None
    """``None`` for a dry run: checkpoints are read, none is made."""
    timeout: float
    _ready: tuple[Checkpoint | None] | None = field(default=None, repr=False)
    """``ready``'s answer, once read."""
    _made: tuple[SummaryJob, Checkpoint | Exception] | None = field(default=None, repr=False)
    """The last job ``now`` was asked for, and what came of it."""
    _scheduled: tuple[SummaryJob, bool] | None = field(default=None, repr=False)
    """The last job ``later`` was asked for, and whether it was taken."""

    @property
    def background(self) -> bool:
        return self.summarizer is not None

    async def ready(self) -> Checkpoint | None:
        if self._ready is None:
            namespace, conversation = self.key
            data = await self.service.records.checkpoint(namespace, conversation)
            self._ready = (Checkpoint.from_json(data),)
        return self._ready[0]

    async def now(self, job: SummaryJob, *, within: float) -> Checkpoint:
        if self.summarizer is None:
            raise SummaryFailed("a dry run makes no summary")
        if self._made is not None and self._made[0] == job:
            made = self._made[1]
            if isinstance(made, Exception):
                raise made  # failed once for this request: not waited for twice
            return made
        try:
            checkpoint = await self.service.now(self.key, job, self.summarizer, within)
        except (SummaryFailed, TimeoutError, StoreError) as exc:
            self._made = (job, exc)
            raise
        self._made = (job, checkpoint)
        return checkpoint

    def later(self, job: SummaryJob) -> bool:
        if self.summarizer is None:
            return False
        if self._scheduled is None or self._scheduled[0] != job:
            taken = self.service.schedule(self.key, job, self.summarizer, self.timeout)
            self._scheduled = (job, taken)
        return self._scheduled[1]
