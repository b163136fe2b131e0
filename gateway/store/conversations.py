"""Where the gateway keeps each conversation's record between its requests.

The record (``pipelines.ConversationState``) is small: when the conversation last went
upstream, the usage the provider reported, and the cuts of the rewrites already applied.
Beside it, kept apart so that a request's record write cannot overwrite it, the latest
checkpoint prepared in the background, and the lock that makes summaries single-flight.
Losing it costs a cache-cold pass, never content: a conversation without a record is
treated as new. The in-memory backend here is bounded by count and by size and expires
records after a day; the Redis backend shares records between replicas.
"""

from __future__ import annotations

import secrets
import sys
import time
from collections import OrderedDict
from dataclasses import fields
from typing import Final, Protocol, runtime_checkable

import orjson

from pipelines import ConversationState

__all__ = ["ConversationRecords", "MemoryConversations", "record_bytes"]

RECORD_BYTES: Final = 1_024
"""What a record costs in memory besides its strings and checkpoint (``record_bytes``): the
object, its numbers, its key and index entry."""


@runtime_checkable
class ConversationRecords(Protocol):
    async def get(self, namespace: str, conversation: str) -> ConversationState | None:
        """The record, or ``None`` when there is none (or it could not be read)."""
        ...

    async def put(self, namespace: str, conversation: str, state: ConversationState) -> None:
        """Keep ``state`` as the conversation's record; failures are swallowed."""
        ...

    async def checkpoint(self, namespace: str, conversation: str) -> bytes | None:
        """The conversation's latest prepared checkpoint (JSON), or ``None``."""
        ...

    async def keep_checkpoint(self, namespace: str, conversation: str, data: bytes) -> None:
        """Keep ``data`` as the conversation's latest prepared checkpoint; failures are
        swallowed."""
        ...

    async def lock(self, namespace: str, conversation: str, seconds: float) -> str | None:
        """Take the conversation's summary lock for ``seconds`` at most: a token to
        release it with, or ``None`` when someone holds it; ``StoreError`` when the store
        cannot say."""
        ...

    async def unlock(self, namespace: str, conversation: str, token: str) -> None:
        """Release the lock taken with ``token`` (not one taken by another since)."""
        ...


class MemoryConversations:
    """Records in this process: at most ``max_records`` records and as many prepared
    checkpoints, in at most ``max_bytes`` together, least recently used dropped first, each
    kept ``ttl`` seconds after its last write.

    A record carries the checkpoint its conversation last applied (a summary and the refs
    of what it stands for, kilobytes), so the count alone does not bound the memory: 100,000
    summarised conversations would hold a gigabyte or more. A record is counted as
    ``RECORD_BYTES``, plus twice its checkpoint's JSON (what the parsed objects take), plus
    its strings as they are held (``record_bytes``); a prepared checkpoint as its
    bytes plus ``RECORD_BYTES``."""

    __slots__ = (
        "_bytes",
        "_checkpoints",
        "_locks",
        "_prune_over",
        "_records",
        "max_bytes",
        "max_records",
        "ttl",
    )

    def __init__(
        self,
        *,
        max_records: int = 10_000,
        max_bytes: int = 2 * 1024 * 1024,
        ttl: float = 86_400.0,
    ) -> None:
        self.max_records, self.max_bytes, self.ttl = max_records, max_bytes, ttl
        # key -> (expires, record, bytes counted for it)
        self._records: OrderedDict[tuple[str, str], tuple[float, ConversationState, int]] = (
            OrderedDict()
        )
        self._checkpoints: OrderedDict[tuple[str, str], tuple[float, bytes]] = OrderedDict()
        self._bytes = 0
        self._locks: dict[tuple[str, str], tuple[float, str]] = {}
        self._prune_over = max_records

    @property
    def size(self) -> int:
        """Bytes counted for the records and prepared checkpoints held now."""
        return self._bytes

    async def get(self, namespace: str, conversation: str) -> ConversationState | None:
        key = (namespace, conversation)
        found = self._records.get(key)
        if found is None:
            return None
        expires, state, _ = found
        if expires < time.monotonic():
            self._drop_record(key)
            return None
        self._records.move_to_end(key)
        return state

    async def put(self, namespace: str, conversation: str, state: ConversationState) -> None:
        key = (namespace, conversation)
        size = record_bytes(state)
        self._drop_record(key)
        self._records[key] = (time.monotonic() + self.ttl, state, size)
        self._bytes += size
        while len(self._records) > self.max_records:
            self._drop_record()
        self._shrink()

    async def checkpoint(self, namespace: str, conversation: str) -> bytes | None:
        found = self._checkpoints.get((namespace, conversation))
        return found[1] if found is not None and found[0] >= time.monotonic() else None

    async def keep_checkpoint(self, namespace: str, conversation: str, data: bytes) -> None:
        key = (namespace, conversation)
        self._drop_checkpoint(key)
        self._checkpoints[key] = (time.monotonic() + self.ttl, data)
        self._bytes += len(data) + RECORD_BYTES
        while len(self._checkpoints) > self.max_records:
            self._drop_checkpoint()
        self._shrink()

    def _shrink(self) -> None:
        """Within ``max_bytes``: of the least recently used record and the oldest prepared
        checkpoint, the one written first goes, until it fits (the newest record stays)."""
        records, checkpoints = self._records, self._checkpoints
        while self._bytes > self.max_bytes and (checkpoints or len(records) > 1):
            oldest = next(iter(records.values())) if len(records) > 1 else None
            prepared = next(iter(checkpoints.values())) if checkpoints else None
            if prepared is not None and (oldest is None or prepared[0] <= oldest[0]):
                self._drop_checkpoint()
            else:
                self._drop_record()

    def _drop_record(self, key: tuple[str, str] | None = None) -> None:
        """Forget the record of ``key`` (default: the least recently used one)."""
        if key is None:
            self._bytes -= self._records.popitem(last=False)[1][2]
        elif (found := self._records.pop(key, None)) is not None:
            self._bytes -= found[2]

    def _drop_checkpoint(self, key: tuple[str, str] | None = None) -> None:
        """Forget the prepared checkpoint of ``key`` (default: the oldest one)."""
        if key is None:
            self._bytes -= len(self._checkpoints.popitem(last=False)[1][1]) + RECORD_BYTES
        elif (found := self._checkpoints.pop(key, None)) is not None:
            self._bytes -= len(found[1]) + RECORD_BYTES

    async def lock(self, namespace: str, conversation: str, seconds: float) -> str | None:
        key, now = (namespace, conversation), time.monotonic()
        held = self._locks.get(key)
        if held is not None and held[0] > now:
            return None
        if len(self._locks) > self._prune_over:
            self._locks = {k: v for k, v in self._locks.items() if v[0] > now}
            # With more locks than that still held, the next pass waits until there are
            # twice as many, rather than coming on every call.
            self._prune_over = max(self.max_records, 2 * len(self._locks))
        token = secrets.token_hex(8)
        self._locks[key] = (now + seconds, token)
        return token

    async def unlock(self, namespace: str, conversation: str, token: str) -> None:
        key = (namespace, conversation)
        held = self._locks.get(key)
        if held is not None and held[1] == token:
            del self._locks[key]

    def __len__(self) -> int:
        return len(self._records)


def record_bytes(state: ConversationState) -> int:
    """What ``MemoryConversations`` counts for ``state``: ``RECORD_BYTES``, its strings and
    tuples of strings as they are held, and twice its checkpoint's JSON. A conversation past
    16 answers keeps 16 answer ids (60-90 bytes each) and one fingerprint per tool (65
    bytes each): at a flat ``RECORD_BYTES``, its record took 2.5 KB traced (5.4 KB with 40
    tools) against 1 KB counted, so the 2 MiB bound held 5 MiB (11 MiB)."""
    size = RECORD_BYTES
    for name in _TEXTS:
        value = getattr(state, name)
        if value:
            size += sys.getsizeof(value)
            if type(value) is tuple:
                size += sum(map(sys.getsizeof, value))
    if state.checkpoint is not None:
        size += 2 * len(orjson.dumps(state.checkpoint))
    return size


_TEXTS: Final = tuple(
    f.name for f in fields(ConversationState) if str(f.type).startswith(("str", "tuple[str"))
)
"""The record's fields that hold strings: digests, fingerprints, answer ids."""
