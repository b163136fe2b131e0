"""The in-memory conversation records' summary locks: one holder per conversation, however
many conversations hold one."""

from __future__ import annotations

from gateway.store.conversations import MemoryConversations


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
