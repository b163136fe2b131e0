"""A store under a deadline (``Deadlined``): a slow store costs a request at most its
deadline, and only time spent in the store counts against it."""

from __future__ import annotations

import time

from gateway.store import MemoryStore
from gateway.store.stores import Deadlined
from pipelines import StoreError


async def test_a_slow_store_costs_a_request_at_most_its_deadline() -> None:
    class Slow(MemoryStore):
        async def put(self, namespace: str, content: bytes, *, ttl: int) -> str:
            import asyncio

            await asyncio.sleep(0.1)
            return await super().put(namespace, content, ttl=ttl)

    store = Deadlined(Slow(), 0.25)
    started = time.monotonic()
    stored = failed = 0
    for n in range(10):
        try:
            await store.put("ns", f"object {n}".encode(), ttl=60)
            stored += 1
        except StoreError:
            failed += 1
    assert time.monotonic() - started < 0.4
    assert stored == 2
    assert failed == 8


async def test_only_time_in_the_store_counts_against_its_deadline() -> None:
    """A request that waits for something else (a summary made on the spot) still has
    its store time afterwards."""
    import asyncio

    store = Deadlined(MemoryStore(), 0.05)
    await asyncio.sleep(0.1)
    ref = await store.put("ns", b"after waiting for a summary", ttl=60)
    assert await store.get("ns", ref) == b"after waiting for a summary"
