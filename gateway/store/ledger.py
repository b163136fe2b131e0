"""The ledger: what the gateway did to each conversation's requests, kept for the inspector.

Each request a conversation sends leaves one entry (``LedgerEntry``, written by
``gateway.context.ledger`` after the answer is over): a JSON summary of what happened (the
tokens, the stages, the cache, the cost) and, for the latest ``max_details`` requests of
the conversation only, its detail (the messages the client sent next to those that went
up). Beside the entries, each conversation has a row of running totals (requests, tokens,
cost, cache) and each namespace an index of its conversations by last activity.

Everything is bounded: ``max_requests`` entries per conversation (the oldest dropped),
``max_conversations`` conversations per namespace (the least recently active dropped,
entries and all), and a TTL renewed by each write. The in-memory ledger is bounded in
bytes too (least recently active conversation out first); the Redis one shares the
ledger between replicas (``gateway.store.ledger_redis``).

A ledger write that fails is dropped (the inspector misses a request; the request itself
was answered long before); a read that fails raises ``StoreError``.
"""

from __future__ import annotations

import time
import zlib
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, runtime_checkable

import orjson

__all__ = [
    "ENTRY_OVERHEAD",
    "Ledger",
    "LedgerEntry",
    "LedgerPage",
    "MemoryLedger",
    "Totals",
]

ENTRY_OVERHEAD: Final = 256
"""Memory an entry costs in the in-memory ledger besides its compressed summary and
detail: its bytes objects, deque slot and detail key."""
ROW_OVERHEAD: Final = 2_048
"""Memory a conversation's row and index entry cost besides its entries."""


@dataclass(frozen=True, slots=True)
class Totals:
    """What one request adds to its conversation's row: counts added up (``add``), fields
    set to the latest request's (``latest``) and fields set by the first request only
    (``first``)."""

    add: Mapping[str, int | float] = field(default_factory=dict)
    latest: Mapping[str, str | int | float] = field(default_factory=dict)
    first: Mapping[str, str | int | float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One request's entry: ``summary`` and ``detail`` are JSON objects, encoded (the
    ledgers keep both compressed: ``pack``)."""

    request_id: str
    at: float
    """When the request came (seconds since the epoch)."""
    summary: bytes
    detail: bytes | None
    totals: Totals


@dataclass(frozen=True, slots=True)
class LedgerPage:
    """A page of a newest-first list, and how many there are in all."""

    items: list[dict[str, Any]]
    total: int


@runtime_checkable
class Ledger(Protocol):
    async def add(self, namespace: str, conversation: str, entry: LedgerEntry) -> None:
        """Add ``entry`` to the conversation's ledger and its row; failures are swallowed."""
        ...

    async def conversations(self, namespace: str, *, offset: int, limit: int) -> LedgerPage:
        """The namespace's conversation rows, the most recently active first; each row is
        its totals with ``id``."""
        ...

    async def conversation(self, namespace: str, conversation: str) -> dict[str, Any] | None:
        """One conversation's row, or ``None``."""
        ...

    async def requests(
        self, namespace: str, conversation: str, *, offset: int, limit: int
    ) -> LedgerPage:
        """The conversation's entries' summaries, newest first (empty when it has none)."""
        ...

    async def request(
        self, namespace: str, conversation: str, request_id: str
    ) -> dict[str, Any] | None:
        """One entry's summary with its ``detail`` (``None`` when no longer kept), or
        ``None`` when the entry is not in the ledger."""
        ...


def pack(data: bytes) -> bytes:
    """A summary's or a detail's JSON as the ledgers keep it: zlib-compressed (mostly keys,
    stage names and message text, which compress four to eight times; level 1, about 1 ms
    for the largest detail)."""
    return zlib.compress(data, 1)


def unpack(packed: bytes | None) -> Any:
    """A kept summary or detail, decoded (``None`` when there is none)."""
    return orjson.loads(zlib.decompress(packed)) if packed else None


def apply_totals(row: dict[str, Any], totals: Totals) -> None:
    """Add one request's ``totals`` to a conversation's ``row`` (in place)."""
    for name, added in totals.add.items():
        row[name] = row.get(name, 0) + added
    row.update(totals.latest)
    for name, value in totals.first.items():
        row.setdefault(name, value)


class _Conversation:
    __slots__ = ("bytes", "details", "entries", "expires", "row")

    def __init__(self) -> None:
        self.entries: deque[tuple[str, bytes]] = deque()
        self.details: dict[str, bytes] = {}
        self.row: dict[str, Any] = {}
        self.bytes = ROW_OVERHEAD
        self.expires = 0.0


class MemoryLedger:
    """The ledger in this process's memory, within ``max_bytes`` in all. Summaries are
    kept zlib-compressed like the details: a compressed copy is allocated to its size,
    whereas the JSON ``orjson`` returns holds several times its length, so what is counted
    is what is held (within about 7% of what ``tracemalloc`` traces, docs/BENCHMARKS.md;
    uncompressed, a quarter to a seventh of it)."""

    __slots__ = (
        "_bytes",
        "_clock",
        "_conversations",
        "max_bytes",
        "max_conversations",
        "max_details",
        "max_requests",
        "ttl",
    )

    def __init__(
        self,
        *,
        max_requests: int = 200,
        max_details: int = 5,
        max_conversations: int = 1_000,
        max_bytes: int = 2 * 1024 * 1024,
        ttl: float = 86_400.0,
        clock: Any = time.monotonic,
    ) -> None:
        self.max_requests, self.max_details = max_requests, max_details
        self.max_conversations, self.max_bytes, self.ttl = max_conversations, max_bytes, ttl
        self._clock = clock
        # namespace -> conversation -> its ledger, least recently active first
        self._conversations: dict[str, OrderedDict[str, _Conversation]] = {}
        self._bytes = 0

    @property
    def size(self) -> int:
        """Bytes counted for what the ledger holds now."""
        return self._bytes

    async def add(self, namespace: str, conversation: str, entry: LedgerEntry) -> None:
        # An expired conversation starts again; dropping it may drop its namespace's dict,
        # so that dict is looked up after.
        found = self._live(namespace, conversation)
        held = self._conversations.setdefault(namespace, OrderedDict())
        if found is None:
            found = held[conversation] = _Conversation()
            self._bytes += found.bytes
        held.move_to_end(conversation)
        found.expires = self._clock() + self.ttl
        apply_totals(found.row, entry.totals)
        summary = pack(entry.summary)
        size = len(summary) + ENTRY_OVERHEAD
        found.entries.appendleft((entry.request_id, summary))
        if entry.detail is not None:
            detail = found.details[entry.request_id] = pack(entry.detail)
            size += len(detail)
        found.bytes += size
        self._bytes += size
        while len(found.entries) > self.max_requests:
            request_id, summary = found.entries.pop()
            self._forget(found, len(summary) + ENTRY_OVERHEAD)
            self._forget_detail(found, request_id)
        # The entry now just past the latest ``max_details`` loses its detail, whether or
        # not the newer ones have one.
        if len(found.entries) > self.max_details:
            self._forget_detail(found, found.entries[self.max_details][0])
        while len(held) > self.max_conversations:
            self._drop(namespace, next(iter(held)))
        self._shrink((namespace, conversation))

    def _forget(self, found: _Conversation, size: int) -> None:
        found.bytes -= size
        self._bytes -= size

    def _forget_detail(self, found: _Conversation, request_id: str) -> None:
        detail = found.details.pop(request_id, None)
        if detail is not None:
            self._forget(found, len(detail))

    def _drop(self, namespace: str, conversation: str) -> None:
        held = self._conversations.get(namespace)
        found = held.pop(conversation, None) if held is not None else None
        if found is not None:
            self._bytes -= found.bytes
        if held is not None and not held:
            del self._conversations[namespace]

    def _shrink(self, keep: tuple[str, str]) -> None:
        """Within ``max_bytes``: the least recently active conversation of all goes first,
        never ``keep`` (namespace, conversation), the one just written."""
        while self._bytes > self.max_bytes:
            oldest: tuple[float, str, str] | None = None
            for namespace, held in self._conversations.items():
                name, found = next(iter(held.items()))  # its least recently active
                if (namespace, name) != keep and (oldest is None or found.expires < oldest[0]):
                    oldest = (found.expires, namespace, name)
            if oldest is None:
                return
            self._drop(oldest[1], oldest[2])

    def _live(self, namespace: str, conversation: str) -> _Conversation | None:
        held = self._conversations.get(namespace)
        found = held.get(conversation) if held is not None else None
        if found is not None and found.expires < self._clock():
            self._drop(namespace, conversation)
            return None
        return found

    async def conversations(self, namespace: str, *, offset: int, limit: int) -> LedgerPage:
        held = self._conversations.get(namespace)
        if held is None:
            return LedgerPage([], 0)
        now = self._clock()
        for conversation in [c for c, found in held.items() if found.expires < now]:
            self._drop(namespace, conversation)
        names = list(reversed(held))
        rows = [{"id": name, **held[name].row} for name in names[offset : offset + limit]]
        return LedgerPage(rows, len(names))

    async def conversation(self, namespace: str, conversation: str) -> dict[str, Any] | None:
        found = self._live(namespace, conversation)
        return {"id": conversation, **found.row} if found is not None else None

    async def requests(
        self, namespace: str, conversation: str, *, offset: int, limit: int
    ) -> LedgerPage:
        found = self._live(namespace, conversation)
        if found is None:
            return LedgerPage([], 0)
        page = list(found.entries)[offset : offset + limit]
        entries = [unpack(summary) for _, summary in page]
        return LedgerPage(entries, len(found.entries))

    async def request(
        self, namespace: str, conversation: str, request_id: str
    ) -> dict[str, Any] | None:
        found = self._live(namespace, conversation)
        if found is None:
            return None
        summary = next((s for rid, s in found.entries if rid == request_id), None)
        if summary is None:
            return None
        detail = found.details.get(request_id)
        return {**unpack(summary), "detail": unpack(detail)}
