"""The in-memory offload store: refs, round trips, namespaces, bounds and expiry."""

from __future__ import annotations

import os
import tracemalloc

import pytest

from gateway.store import REF_PATTERN, MemoryStore
from gateway.store.memory import ENTRY_BYTES
from pipelines import StoreError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_round_trip_is_byte_identical_and_refs_are_well_formed() -> None:
    """What goes in comes out exactly, small or large (compressed) alike, under a ref of
    the documented form."""
    store = MemoryStore()
    for content in (b"small", os.urandom(200_000), b"x" * 300_000):
        ref = await store.put("ns", content, ttl=60)
        assert REF_PATTERN.fullmatch(ref)
        assert await store.get("ns", ref) == content
    # The repetitive object was compressed.
    assert store.size < 300_000 + 200_000 + 100 + 3 * ENTRY_BYTES


async def test_refs_are_content_addressed_per_namespace_and_secret() -> None:
    """The same content gets the same ref in one namespace, another ref in another, and a
    ref from one namespace finds nothing in another."""
    store = MemoryStore(secret=b"k" * 32)
    a1 = await store.put("tenant-a", b"payload", ttl=60)
    a2 = await store.put("tenant-a", b"payload", ttl=60)
    b = await store.put("tenant-b", b"payload", ttl=60)
    assert a1 == a2
    assert a1 != b
    assert await store.get("tenant-b", a1) is None
    assert await MemoryStore(secret=b"z" * 32).put("tenant-a", b"payload", ttl=60) != a1


async def test_expired_objects_are_gone() -> None:
    """An object is not returned after its TTL."""
    clock = Clock()
    store = MemoryStore(clock=clock)
    ref = await store.put("ns", b"data", ttl=60)
    clock.now += 59
    assert await store.get("ns", ref) == b"data"
    clock.now += 2
    assert await store.get("ns", ref) is None
    assert store.size == 0


async def test_bounded_by_bytes_least_recently_used_out() -> None:
    """Past its byte bound the store drops the least recently used objects first."""
    held = 1_000 + ENTRY_BYTES
    store = MemoryStore(max_bytes=3 * held, max_object_bytes=1_000, compress_over=10_000)
    first = await store.put("ns", b"1" * 1_000, ttl=60)
    second = await store.put("ns", b"2" * 1_000, ttl=60)
    await store.put("ns", b"3" * 1_000, ttl=60)
    assert await store.get("ns", first) is not None  # now the most recently used
    await store.put("ns", b"4" * 1_000, ttl=60)
    assert await store.get("ns", second) is None
    assert await store.get("ns", first) is not None
    assert store.size <= 3 * held


async def test_object_over_the_cap_is_refused() -> None:
    """An object larger than the per-object cap is a StoreError, never a silent drop."""
    store = MemoryStore(max_bytes=10_000, max_object_bytes=100)
    with pytest.raises(StoreError, match="cap"):
        await store.put("ns", b"x" * 101, ttl=60)
    # Nor is one that, with its bookkeeping, would not fit the whole store: it would be
    # evicted by its own write and its ref name nothing.
    whole = MemoryStore(max_bytes=1_000, max_object_bytes=1_000, compress_over=10_000)
    with pytest.raises(StoreError, match="does not fit"):
        await whole.put("ns", b"x" * 1_000, ttl=60)
    assert whole.size == 0


async def test_same_content_again_stores_nothing_new() -> None:
    """Putting content that is already there returns its ref, extends its life, and adds
    no bytes (a resent history re-offloads the same outputs on every request)."""
    clock = Clock()
    store = MemoryStore(clock=clock)
    content = b"y" * 50_000
    ref = await store.put("ns", content, ttl=60)
    size = store.size
    clock.now += 50
    assert await store.put("ns", content, ttl=60) == ref
    assert store.size == size
    clock.now += 50
    assert await store.get("ns", ref) == content


async def test_under_pressure_expired_objects_go_before_live_ones() -> None:
    """A full store makes room from what has expired first, even when that was used more
    recently than live objects; an object whose life was extended is live."""
    clock = Clock()
    held = 1_000 + ENTRY_BYTES
    store = MemoryStore(clock=clock, max_bytes=4 * held, max_object_bytes=1_000)
    live = await store.put("ns", b"1" * 1_000, ttl=600)
    extended = await store.put("ns", b"2" * 1_000, ttl=50)
    short = await store.put("ns", b"3" * 1_000, ttl=60)
    assert await store.touch("ns", extended, 600)
    assert await store.get("ns", short) is not None  # the most recently used of the three
    clock.now += 120  # short has expired; extended has not
    await store.put("ns", b"4" * 1_000, ttl=600)
    await store.put("ns", b"5" * 1_000, ttl=600)
    assert await store.get("ns", short) is None
    assert await store.get("ns", live) is not None
    assert await store.get("ns", extended) is not None
    assert store.size <= 4 * held


async def test_a_full_store_of_many_objects_keeps_its_bookkeeping_bounded() -> None:
    """Writing into a full store of thousands of small objects, and extending the same
    ones again and again as resent histories do, keeps the expiry index within a small
    multiple of the objects held."""
    store = MemoryStore(max_bytes=1_000_000, max_object_bytes=1_000)
    refs = [await store.put("ns", os.urandom(100), ttl=3_600) for _ in range(5_000)]
    held = [ref for ref in refs if await store.get("ns", ref) is not None]
    assert len(held) == 1_000_000 // (100 + ENTRY_BYTES)
    for _ in range(20):
        for ref in held[-500:]:
            assert await store.touch("ns", ref, 7_200)
    assert len(store._expiries) <= 2 * len(held) + 1_024
    assert store.size <= 1_000_000


async def test_a_store_of_small_objects_uses_no_more_memory_than_its_bound() -> None:
    """What ``max_bytes`` bounds is the memory the store takes, bookkeeping included: full
    of 80-byte objects, extended as resent histories extend them, it holds under its bound
    (each such object once cost six times its bytes)."""
    bound = 2_000_000

    def small() -> bytes:
        return os.urandom(40).hex().encode()

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        store = MemoryStore(max_bytes=bound, max_object_bytes=1_000)
        refs = [await store.put("tenant", small(), ttl=60) for _ in range(20_000)][-2_000:]
        for ref in refs:
            await store.touch("tenant", ref, 600)
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert await store.get("tenant", refs[-1]) is not None
    assert used <= bound
