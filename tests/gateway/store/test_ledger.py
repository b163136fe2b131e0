"""The inspector's ledger, in memory and on a real redis-server: entries newest first and
a page at a time, a conversation's totals, the bounds (entries, details, conversations,
TTL, bytes), namespaces kept apart, a Redis that is down, and a Redis Cluster."""

from __future__ import annotations

import asyncio
import base64
import random
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.config import StoreSettings
from gateway.store.ledger import Ledger, LedgerEntry, MemoryLedger, Totals
from gateway.store.ledger_redis import RedisLedger
from gateway.store.redis import RedisBackend
from pipelines import StoreError
from tests.harness import RedisServer, redis_server
from tests.redis_topologies import ClusterDeployment, cluster_deployment

SETTINGS = StoreSettings(timeout=1.0)


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    """A redis-server of this module's own, flushed by each test that uses it (never the
    one ``REDIS_URL`` names, which may hold someone's data)."""
    with redis_server() as running:
        yield running


class Bench:
    """Builds the ledger under test (in memory when ``url`` is ``None``, else on Redis)
    and lets time pass for it."""

    def __init__(self, url: str | None) -> None:
        self.url = url
        self.now = 1_000.0
        """The in-memory ledger's clock."""
        self.backends: list[RedisBackend] = []

    def ledger(
        self,
        *,
        max_requests: int = 200,
        max_details: int = 5,
        max_conversations: int = 100,
        ttl: int = 3_600,
    ) -> Ledger:
        if self.url is None:
            return MemoryLedger(
                max_requests=max_requests,
                max_details=max_details,
                max_conversations=max_conversations,
                ttl=float(ttl),
                clock=lambda: self.now,
            )
        backend = RedisBackend(self.url, SETTINGS)
        self.backends.append(backend)
        return RedisLedger(
            backend,
            max_requests=max_requests,
            max_details=max_details,
            max_conversations=max_conversations,
            ttl=ttl,
        )

    async def wait(self, seconds: float) -> None:
        """Let ``seconds`` pass: the in-memory ledger's clock moves on, Redis waits."""
        if self.url is None:
            self.now += seconds
        else:
            await asyncio.sleep(seconds)

    async def aclose(self) -> None:
        for backend in self.backends:
            await backend.aclose()


@pytest.fixture(params=["memory", "redis"])
async def bench(request: pytest.FixtureRequest) -> AsyncIterator[Bench]:
    url = None
    if request.param == "redis":
        server: RedisServer = request.getfixturevalue("server")
        url = server.url
        admin = RedisBackend(url, SETTINGS)
        await admin.client.flushall()
        await admin.aclose()
    bench = Bench(url)
    yield bench
    await bench.aclose()


def entry(
    n: int,
    *,
    at: float | None = None,
    detail: bool = True,
    totals: Totals | None = None,
    padding: int = 0,
) -> LedgerEntry:
    """The ``n``-th request's entry (request id ``cg-<n>``), at ``n`` milliseconds from
    now unless ``at`` is given (so later entries are later); ``padding`` bytes more in its
    summary and in its detail, random text, which the ledgers keep compressed to about
    three quarters of that."""
    request_id = f"cg-{n:04d}"
    when = time.time() + n / 1_000 if at is None else at
    summary = {"id": request_id, "at": when, "api": "chat", "tokens": {"client": 1_000 + n}}
    if padding:
        summary["note"] = base64.b64encode(random.Random(-n).randbytes(padding * 3 // 4)).decode()
    noise = base64.b64encode(random.Random(n).randbytes(padding * 3 // 4)).decode()
    body = {"messages": [{"fate": "kept", "role": "user", "text": f"request {n}" + noise}]}
    return LedgerEntry(
        request_id,
        when,
        orjson.dumps(summary),
        orjson.dumps({**body, "truncated": False}) if detail else None,
        totals if totals is not None else Totals(add={"requests": 1}),
    )


def ids(items: list[dict[str, Any]]) -> list[str]:
    return [item["id"] for item in items]


async def test_entries_come_newest_first_a_page_at_a_time(bench: Bench) -> None:
    """A conversation's entries are listed newest first, ``offset``/``limit`` at a time,
    with how many there are in all."""
    ledger = bench.ledger()
    for n in range(7):
        await ledger.add("ns", "conv", entry(n))
    first = await ledger.requests("ns", "conv", offset=0, limit=3)
    assert ids(first.items) == ["cg-0006", "cg-0005", "cg-0004"]
    assert first.total == 7
    assert first.items[0]["tokens"] == {"client": 1_006}
    last = await ledger.requests("ns", "conv", offset=6, limit=3)
    assert ids(last.items) == ["cg-0000"]
    beyond = await ledger.requests("ns", "conv", offset=9, limit=3)
    assert (beyond.items, beyond.total) == ([], 7)
    none = await ledger.requests("ns", "conv", offset=0, limit=0)
    assert (none.items, none.total) == ([], 7)


async def test_conversations_come_most_recently_active_first(bench: Bench) -> None:
    """The namespace's conversations are listed by their latest request, a page at a
    time, each row with its id."""
    ledger = bench.ledger()
    for n, conversation in enumerate(["c0", "c1", "c2", "c0"]):
        await ledger.add("ns", conversation, entry(n))
    page = await ledger.conversations("ns", offset=0, limit=10)
    assert ids(page.items) == ["c0", "c2", "c1"]
    assert page.total == 3
    assert page.items[0] == {"id": "c0", "requests": 2}
    second = await ledger.conversations("ns", offset=1, limit=1)
    assert (ids(second.items), second.total) == (["c2"], 3)


async def test_a_conversations_row_adds_up_its_requests(bench: Bench) -> None:
    """Counts add up, ``latest`` fields follow the latest request, ``first`` fields keep
    the first request's; numbers come back as the types they were given, and a title
    that reads like a number stays text."""

    def totals(tokens: int, cost: float | int, model: str, at: float) -> Totals:
        return Totals(
            add={"requests": 1, "client_tokens": tokens, "cost_with": cost},
            latest={"model": model, "last_at": at, "tenant": ""},
            first={"first_at": at, "title": "2024"},
        )

    ledger = bench.ledger()
    await ledger.add("ns", "conv", entry(0, totals=totals(1_000, 0, "gpt-4o", 1_764_410_000.5)))
    await ledger.add("ns", "conv", entry(1, totals=totals(500, 0.25, "gpt-4.1", 1_764_410_060.25)))
    await ledger.add("ns", "conv", entry(2, totals=totals(250, 0.5, "gpt-4.1", 1_764_410_120.0)))
    row = await ledger.conversation("ns", "conv")
    assert row == {
        "id": "conv",
        "requests": 3,
        "client_tokens": 1_750,
        "cost_with": 0.75,
        "model": "gpt-4.1",
        "last_at": 1_764_410_120.0,
        "tenant": "",
        "first_at": 1_764_410_000.5,
        "title": "2024",
    }
    assert type(row["requests"]) is int
    assert type(row["cost_with"]) is float
    assert type(row["last_at"]) is float
    listed = await ledger.conversations("ns", offset=0, limit=1)
    assert listed.items == [row]


async def test_a_conversation_keeps_its_latest_entries_only(bench: Bench) -> None:
    """Past ``max_requests`` entries the oldest go, and can no longer be opened."""
    ledger = bench.ledger(max_requests=5, max_details=2)
    for n in range(8):
        await ledger.add("ns", "conv", entry(n))
    page = await ledger.requests("ns", "conv", offset=0, limit=10)
    assert ids(page.items) == ["cg-0007", "cg-0006", "cg-0005", "cg-0004", "cg-0003"]
    assert page.total == 5
    assert await ledger.request("ns", "conv", "cg-0002") is None
    row = await ledger.conversation("ns", "conv")
    assert row is not None
    assert row["requests"] == 8


async def test_only_the_latest_entries_keep_their_detail(bench: Bench) -> None:
    """The latest ``max_details`` entries open with their detail; older ones with their
    summary and ``detail`` None."""
    ledger = bench.ledger(max_details=2)
    for n in range(5):
        await ledger.add("ns", "conv", entry(n, detail=n != 3))
    newest = await ledger.request("ns", "conv", "cg-0004")
    assert newest is not None
    assert newest["detail"]["messages"][0]["text"] == "request 4"
    assert newest["tokens"] == {"client": 1_004}
    without = await ledger.request("ns", "conv", "cg-0003")  # sent none
    assert without is not None
    assert without["detail"] is None
    for n in range(3):
        older = await ledger.request("ns", "conv", f"cg-{n:04d}")
        assert older is not None
        assert (older["id"], older["detail"]) == (f"cg-{n:04d}", None)


async def test_no_detail_is_kept_when_none_is_asked_for(bench: Bench) -> None:
    """With ``max_details`` 0 even the newest entry opens without its detail."""
    ledger = bench.ledger(max_details=0)
    await ledger.add("ns", "conv", entry(0))
    found = await ledger.request("ns", "conv", "cg-0000")
    assert found is not None
    assert found["detail"] is None


async def test_every_kept_entry_opens(bench: Bench) -> None:
    """An entry is found wherever it is in the log, the newest to the oldest kept."""
    ledger = bench.ledger(max_requests=70, max_details=70)
    for n in range(75):
        await ledger.add("ns", "conv", entry(n))
    for n in range(5, 75):
        found = await ledger.request("ns", "conv", f"cg-{n:04d}")
        assert found is not None
        assert found["detail"]["messages"][0]["text"] == f"request {n}"
    assert await ledger.request("ns", "conv", "cg-0004") is None


async def test_what_is_not_there_reads_as_nothing(bench: Bench) -> None:
    """Unknown entries, conversations and namespaces read as None or an empty page."""
    ledger = bench.ledger()
    await ledger.add("ns", "conv", entry(0))
    assert await ledger.request("ns", "conv", "cg-9999") is None
    assert await ledger.request("ns", "other", "cg-0000") is None
    assert await ledger.conversation("ns", "other") is None
    page = await ledger.requests("ns", "other", offset=0, limit=5)
    assert (page.items, page.total) == ([], 0)
    listed = await ledger.conversations("elsewhere", offset=0, limit=5)
    assert (listed.items, listed.total) == ([], 0)


async def test_past_the_conversation_cap_the_least_recently_active_goes(bench: Bench) -> None:
    """With ``max_conversations`` held, a new conversation drops the one whose latest
    request is the oldest (not the first created), entries and all."""
    ledger = bench.ledger(max_conversations=3)
    for n, conversation in enumerate(["c0", "c1", "c2", "c0", "c3"]):
        await ledger.add("ns", conversation, entry(n))
    page = await ledger.conversations("ns", offset=0, limit=10)
    assert (ids(page.items), page.total) == (["c3", "c0", "c2"], 3)
    assert await ledger.conversation("ns", "c1") is None
    gone = await ledger.requests("ns", "c1", offset=0, limit=10)
    assert (gone.items, gone.total) == ([], 0)
    assert await ledger.request("ns", "c1", "cg-0001") is None
    assert (await ledger.requests("ns", "c0", offset=0, limit=10)).total == 2


async def test_namespaces_do_not_see_each_others_conversations(bench: Bench) -> None:
    """The same conversation id in two namespaces is two conversations."""
    ledger = bench.ledger(max_conversations=1)
    await ledger.add("alice", "conv", entry(0))
    await ledger.add("bob", "conv", entry(1))
    await ledger.add("bob", "conv", entry(2))
    alice, bob = (
        await ledger.conversation("alice", "conv"),
        await ledger.conversation("bob", "conv"),
    )
    assert alice is not None
    assert alice["requests"] == 1
    assert bob is not None
    assert bob["requests"] == 2
    assert ids((await ledger.requests("alice", "conv", offset=0, limit=5)).items) == ["cg-0000"]
    assert await ledger.request("alice", "conv", "cg-0001") is None
    assert ids((await ledger.conversations("alice", offset=0, limit=5)).items) == ["conv"]
    assert (await ledger.conversations("carol", offset=0, limit=5)).total == 0


async def test_a_conversation_expires_ttl_after_its_last_request(bench: Bench) -> None:
    """Each request renews its conversation's TTL; once it has run out the conversation
    is neither listed nor readable, while the others stay."""
    ledger = bench.ledger(ttl=2)
    await ledger.add("ns", "quiet", entry(0, at=time.time()))
    await ledger.add("ns", "busy", entry(1, at=time.time()))
    await bench.wait(1.2)
    await ledger.add("ns", "busy", entry(2, at=time.time()))
    await bench.wait(1.2)  # 2.4 s after the first requests, 1.2 s after busy's last
    assert await ledger.conversation("ns", "quiet") is None
    assert await ledger.request("ns", "quiet", "cg-0000") is None
    assert (await ledger.requests("ns", "quiet", offset=0, limit=5)).total == 0
    page = await ledger.conversations("ns", offset=0, limit=5)
    assert (ids(page.items), page.total) == (["busy"], 1)
    assert (await ledger.requests("ns", "busy", offset=0, limit=5)).total == 2
    await bench.wait(1.5)
    assert await ledger.conversation("ns", "busy") is None
    assert (await ledger.conversations("ns", offset=0, limit=5)).total == 0


async def test_a_redis_that_is_down_drops_writes_and_fails_reads() -> None:
    """Writing to a Redis that is not there costs the request nothing (the entry is
    dropped); reading from it says the store is unavailable."""
    backend = RedisBackend("redis://127.0.0.1:1/0", StoreSettings(timeout=0.2))
    ledger = RedisLedger(backend, max_requests=10, max_details=2, max_conversations=10, ttl=60)
    await ledger.add("ns", "conv", entry(0))
    with pytest.raises(StoreError):
        await ledger.conversations("ns", offset=0, limit=5)
    with pytest.raises(StoreError):
        await ledger.conversation("ns", "conv")
    with pytest.raises(StoreError):
        await ledger.requests("ns", "conv", offset=0, limit=5)
    with pytest.raises(StoreError):
        await ledger.request("ns", "conv", "cg-0000")
    assert backend.failed["ledger_add"] == 1
    await backend.aclose()


async def test_the_ledgers_failures_never_stop_the_requests_store() -> None:
    """The ledger has a breaker of its own: failing ledger writes leave the requests'
    breaker closed and what the process knows is stored trusted."""
    with redis_server() as own:
        backend = RedisBackend(own.url, StoreSettings(timeout=0.2))
        ledger = RedisLedger(backend, max_requests=10, max_details=2, max_conversations=10, ttl=60)
        await ledger.add("ns", "conv", entry(0))
        backend.remember("cg:o:ns:ctx_known", 3_600)
        own.kill()
        for n in range(1, 4):
            await ledger.add("ns", "conv", entry(n))
        assert backend.failed["ledger_add"] == 3
        assert not ledger.breaker.allow()
        assert backend.breaker.allow()
        assert "cg:o:ns:ctx_known" in backend.known
        await backend.aclose()


async def test_a_conversation_takes_bounded_redis_memory(server: RedisServer) -> None:
    """Once a conversation is at ``max_requests``, more requests take no more Redis
    memory: it holds the latest entries and details, about their bytes."""
    backend = RedisBackend(server.url, SETTINGS)
    client = backend.client
    await client.flushall()
    ledger = RedisLedger(backend, max_requests=20, max_details=3, max_conversations=10, ttl=60)

    async def used() -> list[int]:
        keys = [key async for key in client.scan_iter("cg:*")]
        return [await client.memory_usage(key, samples=0) or 0 for key in keys]

    for n in range(20):
        await ledger.add("ns", "conv", entry(n, padding=3_000))
    full = await used()
    for n in range(20, 60):
        await ledger.add("ns", "conv", entry(n, padding=3_000))
    later = await used()
    one = entry(0, padding=3_000)
    assert one.detail is not None
    kept = 20 * len(one.summary) + 3 * len(one.detail)
    assert len(later) == 4  # the index, the log, the row and the details
    assert sum(full) < kept * 1.3
    assert sum(later) < sum(full) * 1.05
    assert 0 < min([await client.ttl(key) async for key in client.scan_iter("cg:*")]) <= 60
    await backend.aclose()


def memory_ledger(max_bytes: int, clock: list[float]) -> MemoryLedger:
    return MemoryLedger(max_bytes=max_bytes, ttl=60.0, clock=lambda: clock[0])


async def test_the_memory_ledger_stays_within_its_bytes() -> None:
    """Past ``max_bytes`` the least recently active conversation of any namespace goes,
    until the ledger fits; the one just written stays."""
    clock = [0.0]
    ledger = memory_ledger(1_048_576, clock)  # three conversations of 300 KB fit
    names = [("a", "c0"), ("b", "c1"), ("a", "c2"), ("a", "c0"), ("b", "c3"), ("a", "c4")]
    for n, (namespace, conversation) in enumerate(names):
        clock[0] += 1
        big = n != 3  # the second request of c0 is small: it makes c0 active again
        await ledger.add(namespace, conversation, entry(n, padding=200_000 if big else 0))
        assert ledger.size <= ledger.max_bytes
    held = {
        namespace: ids((await ledger.conversations(namespace, offset=0, limit=10)).items)
        for namespace in ("a", "b")
    }
    assert held == {"a": ["c4", "c0"], "b": ["c3"]}  # c1, then c2, went


async def test_the_conversation_just_written_stays_whatever_the_clock() -> None:
    """Two conversations written at the same instant: the one written last stays when
    only one fits, whichever namespace sorts first."""
    clock = [5.0]
    ledger = memory_ledger(1_048_576, clock)
    await ledger.add("b", "older", entry(0, padding=400_000))
    await ledger.add("a", "newer", entry(1, padding=400_000))
    assert await ledger.conversation("a", "newer") is not None
    assert await ledger.conversation("b", "older") is None
    assert ledger.size <= ledger.max_bytes


async def test_an_expired_conversation_starts_again_and_frees_its_bytes() -> None:
    """A conversation written again after its TTL ran out starts a new ledger (the only
    one of its namespace included) and the old one's bytes are no longer counted."""
    clock = [0.0]
    ledger = memory_ledger(1_048_576, clock)
    await ledger.add("ns", "conv", entry(0, at=1.0, padding=1_000))
    single = ledger.size
    clock[0] += 61
    await ledger.add("ns", "conv", entry(1, at=1.0, padding=1_000))
    row = await ledger.conversation("ns", "conv")
    assert row == {"id": "conv", "requests": 1}
    assert ids((await ledger.requests("ns", "conv", offset=0, limit=5)).items) == ["cg-0001"]
    assert ledger.size == pytest.approx(single, abs=32)  # not twice: compressed noise varies


async def test_the_ledger_works_on_a_redis_cluster() -> None:
    """On a cluster a namespace's keys share one slot: the script that writes an entry
    and drops another conversation's keys runs, and every key is on one node."""
    with cluster_deployment() as cluster:
        await _on_cluster(cluster)


async def _on_cluster(cluster: ClusterDeployment) -> None:
    backend = RedisBackend(cluster.url, SETTINGS)
    ledger = RedisLedger(backend, max_requests=3, max_details=1, max_conversations=2, ttl=60)
    for n, conversation in enumerate(["c0", "c1", "c1", "c2", "c2"]):
        await ledger.add("ns", conversation, entry(n))
    page = await ledger.conversations("ns", offset=0, limit=5)
    assert (ids(page.items), page.total) == (["c2", "c1"], 2)
    assert await ledger.conversation("ns", "c0") is None
    found = await ledger.request("ns", "c2", "cg-0004")
    assert found is not None
    assert found["detail"] is not None
    assert ids((await ledger.requests("ns", "c1", offset=0, limit=5)).items) == [
        "cg-0002",
        "cg-0001",
    ]
    holding = [count for count in cluster.keys_by_node("cg:{i:*").values() if count]
    assert holding == [7]  # the index, and c1's and c2's log, row and detail
    await backend.aclose()


# Random writes to both ledgers, then everything read from both: they agree.
_WRITE = st.tuples(
    st.sampled_from(["a", "b"]),
    st.sampled_from(["c0", "c1", "c2", "c3"]),
    st.booleans(),
    st.integers(0, 1_000),
    st.one_of(st.integers(0, 3), st.integers(0, 80).map(lambda k: k / 8)),
    st.sampled_from(["gpt-4o", "claude", "7"]),
)


@given(
    writes=st.lists(_WRITE, max_size=25),
    max_requests=st.integers(1, 4),
    max_details=st.integers(0, 4),
    max_conversations=st.integers(1, 3),
)
def test_the_redis_ledger_reads_as_the_memory_one(
    server: RedisServer,
    writes: list[tuple[str, str, bool, int, float, str]],
    max_requests: int,
    max_details: int,
    max_conversations: int,
) -> None:
    """Whatever is written, the Redis ledger answers every read as the in-memory one."""
    bounds = {
        "max_requests": max_requests,
        "max_details": min(max_details, max_requests),
        "max_conversations": max_conversations,
    }
    asyncio.run(_compare(server.url, bounds, writes))


async def _compare(
    url: str, bounds: dict[str, int], writes: list[tuple[str, str, bool, int, float, str]]
) -> None:
    backend = RedisBackend(url, SETTINGS)
    try:
        await backend.client.flushall()
        memory = MemoryLedger(**bounds)
        redis = RedisLedger(backend, ttl=3_600, **bounds)
        for n, (namespace, conversation, detail, tokens, cost, model) in enumerate(writes):
            totals = Totals(
                add={"requests": 1, "tokens": tokens, "cost": cost},
                latest={"model": model},
                first={"title": model, "first": n},
            )
            written = entry(n, detail=detail, totals=totals)
            await memory.add(namespace, conversation, written)
            await redis.add(namespace, conversation, written)
        assert await everything(redis, len(writes)) == await everything(memory, len(writes))
    finally:
        await backend.aclose()


async def everything(ledger: Ledger, written: int) -> dict[str, Any]:
    """All that ``ledger`` answers about namespaces ``a`` and ``b``, conversations ``c0``
    to ``c3`` and the first ``written`` request ids."""
    read: dict[str, Any] = {}
    for namespace in ("a", "b"):
        for offset, limit in ((0, 5), (1, 1)):
            page = await ledger.conversations(namespace, offset=offset, limit=limit)
            read[f"{namespace} {offset} {limit}"] = page
        for conversation in ("c0", "c1", "c2", "c3"):
            at = f"{namespace}/{conversation}"
            read[at] = await ledger.conversation(namespace, conversation)
            read[at + " requests"] = await ledger.requests(
                namespace, conversation, offset=0, limit=10
            )
            for n in range(written):
                request_id = f"cg-{n:04d}"
                read[f"{at} {request_id}"] = await ledger.request(
                    namespace, conversation, request_id
                )
    return read
