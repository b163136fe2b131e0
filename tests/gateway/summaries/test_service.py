"""The summary service on a real Redis: single flight across two services (replicas),
a waiter taking over when the lock holder gives up, and failing fast when the store
cannot say who holds the lock."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from gateway.config import StoreSettings
from gateway.store import MemoryStore
from gateway.store.redis import RedisBackend, RedisConversations
from gateway.summaries.service import SummaryService
from pipelines import StoreError
from pipelines.checkpoints import SummaryJob, chain_of
from pipelines.summary import FIELDS, LIST_FIELDS, Summary, SummaryFailed
from tests.harness import free_port

SETTINGS = StoreSettings(timeout=2.0)
"""A deadline a busy CI host meets: at 0.2 s, Redis calls timed out under load, opened the
breaker, and the replicas' lock failed with "circuit open" (a refused connection, the
store-down case, fails at once whatever the deadline)."""
MESSAGES = [
    {"role": "user", "content": "Book flight IB6251 for reservation ABC123."},
    {"role": "assistant", "content": "Booked IB6251 on ABC123."},
]
JOB = SummaryJob(
    start=0,
    end=2,
    chain=chain_of(MESSAGES),
    originals=tuple(MESSAGES),
    inputs=tuple(MESSAGES),
    base=None,
    model="gpt-4o",
    namespace="ns",
    ttl=600,
)


class Model:
    """A summarizer taking ``seconds``, failing when told to; counts its calls."""

    def __init__(self, seconds: float = 0.0, fail: bool = False) -> None:
        self.seconds, self.fail, self.calls = seconds, fail, 0

    async def summarize(self, messages: Any, *, model: str, previous: Any = None) -> Summary:
        self.calls += 1
        await asyncio.sleep(self.seconds)
        if self.fail:
            raise SummaryFailed("the model gave up")
        fields = {n: ([] if n in LIST_FIELDS else "") for n in FIELDS}
        return Summary(fields | {"key_findings": ["IB6251", "ABC123"]}, 1.0, 1)


def service(url: str) -> SummaryService:
    return SummaryService(RedisConversations(RedisBackend(url, SETTINGS)), MemoryStore())


async def close(*services: SummaryService) -> None:
    for each in services:
        records = each.records
        assert isinstance(records, RedisConversations)
        await records.backend.aclose()


async def test_two_replicas_asking_at_once_make_one_summary(redis_url: str) -> None:
    first, second = service(redis_url), service(redis_url)
    model = Model(seconds=0.3)
    key = ("ns", f"once-{time.monotonic_ns()}")
    made = await asyncio.gather(first.now(key, JOB, model, 5.0), second.now(key, JOB, model, 5.0))
    await close(first, second)
    assert model.calls == 1
    assert made[0].summary == made[1].summary
    assert made[0].chain == JOB.chain


async def test_a_waiter_takes_over_when_the_holder_gives_up(redis_url: str) -> None:
    """The replica holding the lock fails without writing a checkpoint and lets the lock
    go: the one waiting makes the summary itself, well within its deadline."""
    first, second = service(redis_url), service(redis_url)
    failing, working = Model(seconds=0.3, fail=True), Model()
    key = ("ns", f"takeover-{time.monotonic_ns()}")
    holder = asyncio.create_task(first.now(key, JOB, failing, 5.0))
    await asyncio.sleep(0.1)
    started = time.monotonic()
    checkpoint = await second.now(key, JOB, working, 5.0)
    elapsed = time.monotonic() - started
    with pytest.raises(SummaryFailed):
        await holder
    await close(first, second)
    assert elapsed < 2.0
    assert working.calls == 1
    assert checkpoint.chain == JOB.chain


async def test_with_the_store_down_a_summary_fails_fast() -> None:
    """No Redis: nobody can be known to hold the lock, so the request does not wait for a
    checkpoint that cannot come; it falls back at once."""
    down = service(f"redis://127.0.0.1:{free_port()}/0")
    started = time.monotonic()
    with pytest.raises(StoreError):
        await down.now(("ns", "down"), JOB, Model(), 5.0)
    elapsed = time.monotonic() - started
    await close(down)
    assert elapsed < 1.0


async def test_a_background_job_made_stale_by_a_larger_summary_is_dropped() -> None:
    """A preparation still queued when a request made a larger summary on the spot does
    not ask the model again, and does not shrink the conversation's checkpoint."""
    from gateway.store.conversations import MemoryConversations
    from pipelines.checkpoints import Checkpoint

    history = [
        {"role": "user" if n % 2 == 0 else "assistant", "content": f"m{n} IB{n}"} for n in range(20)
    ]

    def job(end: int) -> SummaryJob:
        part = tuple(history[:end])
        return SummaryJob(0, end, chain_of(part), part, part, None, "gpt-4o", "ns", 600)

    summaries = SummaryService(MemoryConversations(), MemoryStore(), workers=1)
    slow, model = Model(seconds=0.3), Model()
    key = ("ns", "stale")
    assert summaries.schedule(("ns", "other"), job(4), slow, 5.0)  # holds the one worker
    await asyncio.sleep(0.01)
    assert summaries.schedule(key, job(10), model, 5.0)  # a preparation, queued
    made = await summaries.now(key, job(16), model, 5.0)  # the cut: made on the spot
    assert made.end == 16
    while summaries.busy:
        await asyncio.sleep(0.02)
    latest = Checkpoint.from_json(await summaries.records.checkpoint(*key))
    await summaries.aclose()
    assert model.calls == 1
    assert latest is not None
    assert latest.end == 16
