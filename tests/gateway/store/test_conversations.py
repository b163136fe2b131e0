"""The in-memory conversation records: summary locks, one holder per conversation however
many conversations hold one, and the bound on the memory the records take."""

from __future__ import annotations

import os
import tracemalloc

from gateway.store.conversations import MemoryConversations
from pipelines import ConversationState
from pipelines.summary import FIELDS, LIST_FIELDS


async def test_locks_hold_past_the_record_bound_without_a_pass_per_call() -> None:
    """With more conversations holding a lock than ``max_records``, each lock still holds
    and a new one is granted; dropping expired locks does not come back on every call
    once most of those kept are still held."""
    records = MemoryConversations(max_records=100)
    tokens = [await records.lock("ns", f"c{n}", 60) for n in range(500)]
    assert all(tokens)
    kept = records._locks
    for n in range(0, 500, 50):
        assert await records.lock("ns", f"c{n}", 60) is None  # held
        assert await records.lock("ns", f"new-{n}", 60) is not None
    assert records._locks is kept  # no pass over the 500 for these calls
    await records.unlock("ns", "c0", tokens[0])  # type: ignore[arg-type]
    assert await records.lock("ns", "c0", 60) is not None


def summarised(number: int) -> ConversationState:
    """A record as a summarised conversation leaves it: with the checkpoint it applied
    (eleven fields of summary, the refs of what it stands for), read back from JSON."""
    summary = {
        field: [f"{field} {i} of conversation {number}: {os.urandom(30).hex()}" for i in range(4)]
        if field in LIST_FIELDS
        else f"{field} of conversation {number}: {os.urandom(100).hex()}"
        for field in FIELDS
    }
    checkpoint = {
        "start": 3,
        "end": 40,
        "chain": os.urandom(16).hex(),
        "summary": summary,
        "refs": [f"ctx_{os.urandom(12).hex()}" for _ in range(12)],
        "cut": 41,
        "made": {"model": "gpt-4o-mini", "attempts": 1},
        "kept": [5, 9],
        "index": f"ctx_{os.urandom(12).hex()}",
    }
    state = ConversationState(last_seen=1.0, calls=3, seen=40, checkpoint=checkpoint)
    return ConversationState.from_json(state.to_json())


async def test_summarised_records_take_no_more_memory_than_the_bound() -> None:
    """Records carry the checkpoint their conversation applied (about 10 KB here), so the
    count bound alone let 100,000 of them take a gigabyte: the byte bound holds the memory
    they take under it, dropping the least recently used, while the newest stay."""
    bound = 4_000_000
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        records = MemoryConversations(max_bytes=bound)
        for number in range(2_000):
            await records.put("ns", f"c{number}", summarised(number))
            await records.keep_checkpoint("ns", f"c{number}", os.urandom(2_000))
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert used <= bound
    assert records.size <= bound
    assert await records.get("ns", "c1999") is not None
    assert await records.checkpoint("ns", "c1999") is not None
    assert await records.get("ns", "c0") is None
    assert 100 < len(records) < 2_000


def answered(number: int, tools: int) -> ConversationState:
    """A record as a conversation past 16 answers leaves it, with ``tools`` tools: an id
    for each of its last 16 answers and a fingerprint for each tool, read back from JSON
    (each string an object of its own, as the answers' and requests' parsing makes them)."""
    state = ConversationState(
        last_seen=1.0,
        calls=20,
        seen=40,
        last_digest=os.urandom(12).hex(),
        model_hash=os.urandom(8).hex(),
        system_hash=os.urandom(8).hex(),
        sent_last=os.urandom(8).hex(),
        sent_prompt=os.urandom(12).hex(),
        tool_hashes=tuple(os.urandom(8).hex() for _ in range(tools)),
        answer_ids=tuple(f"chatcmpl-{os.urandom(15).hex()[:29]}" for _ in range(16)),
    )
    return ConversationState.from_json(state.to_json())


async def test_records_of_long_conversations_take_no_more_memory_than_the_bound() -> None:
    """A record keeps its conversation's last 16 answer ids and a fingerprint per tool
    (1.5 KB and 3 KB here): counted at a flat 1 KB, the records held 2.5-5 times their
    bound. Counted as held, they stay within it."""
    bound = 1_000_000
    for tools in (0, 40):
        warm = MemoryConversations(max_bytes=bound)  # the allocator's free lists, filled
        for number in range(2_000):
            await warm.put("ns", f"c{number}", answered(number, tools))
        del warm
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            records = MemoryConversations(max_bytes=bound)
            for number in range(2_000):
                namespace = f"key:{os.urandom(16).hex()}"  # an object per request, as served
                await records.put(namespace, f"c{number}", answered(number, tools))
            used = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert used <= bound, tools
        assert records.size <= bound
        assert 100 < len(records) < 2_000
