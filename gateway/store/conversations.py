"""Where the gateway keeps each conversation's record between its requests.

The record (``pipelines.ConversationState``) is small: when the conversation last went
upstream, the usage the provider reported, and the cuts of the rewrites already applied.
Losing it costs a cache-cold pass, never content: a conversation without a record is
treated as new. The in-memory backend here is bounded by count and expires records after
a day; the Redis backend shares records between replicas.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Protocol, runtime_checkable

from pipelines import ConversationState

__all__ = ["ConversationRecords", "MemoryConversations"]


@runtime_checkable
class ConversationRecords(Protocol):
    async def get(self, namespace: str, conversation: str) -> ConversationState | None:
        """The record, or ``None`` when there is none (or it could not be read)."""
        ...

    async def put(self, namespace: str, conversation: str, state: ConversationState) -> None:
        """Keep ``state`` as the conversation's record; failures are swallowed."""
        ...


class MemoryConversations:
    """Records in this process: at most ``max_records``, least recently used dropped
    first, each kept ``ttl`` seconds after its last write."""

    __slots__ = ("_records", "max_records", "ttl")

    def __init__(self, *, max_records: int = 100_000, ttl: float = 86_400.0) -> None:
        self.max_records, self.ttl = max_records, ttl
        self._records: OrderedDict[tuple[str, str], tuple[float, ConversationState]] = OrderedDict()

    async def get(self, namespace: str, conversation: str) -> ConversationState | None:
        key = (namespace, conversation)
        found = self._records.get(key)
        if found is None:
            return None
        expires, state = found
        if expires < time.monotonic():
            del self._records[key]
            return None
        self._records.move_to_end(key)
        return state

    async def put(self, namespace: str, conversation: str, state: ConversationState) -> None:
        key = (namespace, conversation)
        self._records[key] = (time.monotonic() + self.ttl, state)
        self._records.move_to_end(key)
        while len(self._records) > self.max_records:
            self._records.popitem(last=False)

    def __len__(self) -> int:
        return len(self._records)
