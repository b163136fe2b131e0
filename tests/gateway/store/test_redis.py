"""The Redis backend on a real redis-server: round trips, shared refs, TTLs, caps, and
what happens when Redis dies or stops answering."""

from __future__ import annotations

import asyncio
import base64
import os
import time
from collections.abc import Iterator

import pytest

from gateway.config import StoreSettings
from gateway.store import REF_PATTERN
from gateway.store.redis import RedisBackend, RedisConversations, RedisStore
from pipelines import ConversationState, StoreError
from tests.harness import RedisServer, redis_server

SETTINGS = StoreSettings(timeout=0.2, breaker_failures=2, breaker_cooldown=0.5)


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with redis_server() as running:
        yield running


def store_on(url: str, settings: StoreSettings = SETTINGS) -> RedisStore:
    return RedisStore(RedisBackend(url, settings))


async def test_round_trip_is_byte_identical(server: RedisServer) -> None:
    """A 200 KB tool output and a base64 screenshot come back exactly; big ones are kept
    compressed in Redis."""
    store = store_on(server.url)
    output = b"".join(b"row %d: %s\n" % (i, os.urandom(8).hex().encode()) for i in range(6_000))
    image = ("data:image/png;base64," + base64.b64encode(os.urandom(150_000)).decode()).encode()
    for content in (b"small", output, image):
        ref = await store.put("tenant-a", content, ttl=60)
        assert REF_PATTERN.fullmatch(ref)
        assert await store.get("tenant-a", ref) == content
    keys = [k async for k in store.backend.client.scan_iter("cg:o:*")]
    sizes = [await store.backend.client.strlen(k) for k in keys]
    assert len(keys) == 3
    assert max(sizes) < len(output)  # compressed
    await store.backend.aclose()


async def test_replicas_share_the_secret_so_refs_agree(server: RedisServer) -> None:
    """Two gateways on one Redis with no configured secret write the same ref for the
    same content, and each reads what the other wrote."""
    one, two = store_on(server.url), store_on(server.url)
    ref = await one.put("ns", b"the same output", ttl=60)
    assert await two.put("ns", b"the same output", ttl=60) == ref
    assert await two.get("ns", ref) == b"the same output"
    await one.backend.aclose()
    await two.backend.aclose()


async def test_namespaces_are_apart_and_ttl_is_renewed(server: RedisServer) -> None:
    store = store_on(server.url)
    ref = await store.put("ns", b"content", ttl=5)
    assert await store.get("other", ref) is None
    key = next(iter([k async for k in store.backend.client.scan_iter("cg:o:*")]))
    await store.put("ns", b"content", ttl=600)
    assert 5 < await store.backend.client.ttl(key) <= 600
    await store.backend.aclose()


async def test_objects_over_the_cap_are_refused(server: RedisServer) -> None:
    store = store_on(server.url, StoreSettings(max_object_bytes=2_048, memory_max_bytes=4_096))
    with pytest.raises(StoreError, match="over the 2,048 cap"):
        await store.put("ns", b"x" * 2_049, ttl=60)
    await store.backend.aclose()


async def test_a_killed_redis_fails_fast_then_recovers(server: RedisServer) -> None:
    """Redis killed: writes fail within the timeout (then at once, the circuit open); a
    ref is never returned for an unstored object. Redis back (empty): writes succeed again
    after the cooldown, and an object stored before is stored again, not assumed."""
    store = store_on(server.url)
    ref = await store.put("ns", b"before the crash", ttl=60)
    server.kill()
    for _ in range(4):
        started = time.monotonic()
        with pytest.raises(StoreError):
            await store.put("ns", b"during the outage", ttl=60)
        assert time.monotonic() - started < SETTINGS.timeout + 0.15
    assert store.backend.breaker.state == "open"
    server.start()
    await asyncio.sleep(SETTINGS.breaker_cooldown + 0.05)
    assert await store.put("ns", b"before the crash", ttl=60) == ref
    assert await store.get("ns", ref) == b"before the crash"
    await store.backend.aclose()


async def test_a_paused_redis_costs_at_most_the_timeout(server: RedisServer) -> None:
    store = store_on(server.url)
    await store.put("ns", b"warm the connection", ttl=60)
    server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(StoreError):
            await store.put("ns", b"while paused", ttl=60)
        assert time.monotonic() - started < SETTINGS.timeout + 0.15
        with pytest.raises(StoreError):
            await store.get("ns", "ctx_" + "A" * 24)
    finally:
        server.resume()
    await asyncio.sleep(SETTINGS.breaker_cooldown + 0.05)
    ref = await store.put("ns", b"after the pause", ttl=60)
    assert await store.get("ns", ref) == b"after the pause"
    await store.backend.aclose()


async def test_conversation_records_round_trip_and_fail_soft(server: RedisServer) -> None:
    backend = RedisBackend(server.url, SETTINGS)
    records = RedisConversations(backend)
    state = ConversationState(last_seen=1.5, calls=2, media_cut=3)
    await records.put("ns", "conv", state)
    assert await records.get("ns", "conv") == state
    assert await records.get("other", "conv") is None
    server.kill()
    assert await records.get("ns", "conv") is None  # unreadable: treated as new
    await records.put("ns", "conv", state)  # dropped, no exception
    await backend.aclose()


async def test_replicas_agree_on_the_secret_after_redis_restarts_empty(
    server: RedisServer,
) -> None:
    """Redis crashes and comes back empty: the replica that was running puts its secret
    back, and a replica started afterwards adopts it, so their refs still agree."""
    running = store_on(server.url)
    ref = await running.put("ns", b"content", ttl=60)
    server.kill()
    with pytest.raises(StoreError):
        await running.put("ns", b"content", ttl=60)
    server.start()
    await asyncio.sleep(SETTINGS.breaker_cooldown + 0.05)
    assert await running.put("ns", b"content", ttl=60) == ref
    newcomer = store_on(server.url)
    assert await newcomer.put("ns", b"content", ttl=60) == ref
    await running.backend.aclose()
    await newcomer.backend.aclose()


async def test_a_configured_secret_is_never_replaced(server: RedisServer) -> None:
    configured = StoreSettings(secret="s" * 40, timeout=0.2, breaker_cooldown=0.3)
    one = store_on(server.url, configured)
    ref = await one.put("ns", b"content", ttl=60)
    server.kill()
    with pytest.raises(StoreError):
        await one.put("ns", b"content", ttl=60)
    server.start()
    await asyncio.sleep(0.35)
    assert await one.put("ns", b"content", ttl=60) == ref
    assert await one.backend.client.get("cg:secret") is None
    await one.backend.aclose()


async def test_the_unresolved_namespace_is_refused() -> None:
    """Without the secret callers cannot be told apart: nothing is stored or read for
    them, and their records are neither read nor written."""
    from gateway.config import Settings
    from gateway.store.stores import UNRESOLVED, Stores

    stores = Stores.build(Settings(redis_url="redis://127.0.0.1:1/0"))
    with pytest.raises(StoreError):
        await stores.objects.put(UNRESOLVED, b"x", ttl=60)
    with pytest.raises(StoreError):
        await stores.objects.get(UNRESOLVED, "ctx_" + "A" * 24)
    assert await stores.conversations.get(UNRESOLVED, "c") is None
    assert await stores.namespace_of("sk-a") == UNRESOLVED  # Redis is not there
    await stores.aclose()


async def test_the_secret_is_read_before_it_is_written(server: RedisServer) -> None:
    """A Redis at maxmemory refuses SET even when the key is there; reading first keeps
    the shared secret (and so the namespaces) available."""
    store = store_on(server.url)
    ref = await store.put("ns", b"content", ttl=60)
    await store.backend.client.config_set("maxmemory", "1")
    await store.backend.client.config_set("maxmemory-policy", "noeviction")
    store.backend._secret_confirmed = False  # as after any failure
    assert await store.backend.secret()
    assert await store.get("ns", ref) == b"content"
    await store.backend.aclose()


async def commands(client: object) -> int:
    info = await client.info("stats")  # type: ignore[attr-defined]
    return int(info["total_commands_processed"])


async def test_known_objects_cost_no_round_trip_while_the_epoch_holds(
    server: RedisServer,
) -> None:
    """Each request reads its record and the epoch together; after that, objects this
    process stored are not asked about again. A flush (or a restart) changes the epoch,
    and the next request stores them again instead of trusting them."""
    backend = RedisBackend(server.url, SETTINGS)
    store, records = RedisStore(backend), RedisConversations(backend)
    admin = backend.client
    await records.get("ns", "conv")  # request 1 starts
    ref = await store.put("ns", b"a resent tool output", ttl=600)
    await records.get("ns", "conv")  # request 2 starts
    before = await commands(admin)
    assert await store.put("ns", b"a resent tool output", ttl=600) == ref
    assert await commands(admin) - before == 1  # only the INFO itself
    await admin.flushall()
    await records.get("ns", "conv")  # request 3 starts: the epoch is gone
    assert await store.put("ns", b"a resent tool output", ttl=600) == ref
    assert await store.get("ns", ref) == b"a resent tool output"
    await backend.aclose()


async def test_without_a_confirmed_epoch_known_objects_are_confirmed(
    server: RedisServer,
) -> None:
    store = store_on(server.url)  # no record read: nothing vouches for what it knows
    ref = await store.put("ns", b"content", ttl=600)
    await store.backend.client.delete(*[k async for k in store.backend.client.scan_iter("cg:o:*")])
    assert await store.put("ns", b"content", ttl=600) == ref
    assert await store.get("ns", ref) == b"content"
    await store.backend.aclose()


async def test_a_probe_cancelled_by_its_caller_leaves_the_breaker_usable(
    server: RedisServer,
) -> None:
    """Half-open, the one operation let through is cancelled by its caller's own deadline
    (a request's, a summary's): that says nothing about Redis, so the next operation may
    probe again, and once Redis answers the store works."""
    store = store_on(server.url)
    backend = store.backend
    server.pause()
    with pytest.raises(StoreError):
        await store.put("ns", b"while paused", ttl=60)  # a timeout: open at once
    await asyncio.sleep(SETTINGS.breaker_cooldown + 0.05)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await store.put("ns", b"the probe", ttl=60)
    server.resume()
    assert await backend.ping()
    ref = await store.put("ns", b"after the probe", ttl=60)
    assert await store.get("ns", ref) == b"after the probe"
    await backend.aclose()
