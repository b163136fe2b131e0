"""The in-memory offload store: bounded by bytes, least recently used out first, with TTLs.

The default backend, and the one for a single process. Objects over ``compress_over``
bytes are kept zlib-compressed. An object larger than ``max_object_bytes`` is refused
(``StoreError``), so the stage keeps that content in place.
"""

from __future__ import annotations

import heapq
import secrets
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable
from typing import Final

from gateway.store.refs import make_ref
from pipelines import StoreError

__all__ = ["ENTRY_BYTES", "MemoryStore"]

ENTRY_BYTES: Final = 640
"""Memory an object costs besides its bytes, counted against ``max_bytes``: its ref, key
and value tuples, its index entry and up to two expiry-heap entries (504 bytes measured
with one). A store of small objects would otherwise use several times its bound: 80-byte
objects took 504 bytes each."""


class MemoryStore:
    """``pipelines.OffloadStore`` in this process's memory."""

    __slots__ = (
        "_clock",
        "_compress_over",
        "_entries",
        "_expiries",
        "_max_bytes",
        "_max_object_bytes",
        "_secret",
        "_size",
    )

    def __init__(
        self,
        *,
        max_bytes: int = 6 * 1024 * 1024,
        max_object_bytes: int = 6 * 1024 * 1024,
        compress_over: int = 10_240,
        secret: bytes | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < max_object_bytes <= max_bytes:
            raise ValueError("need 0 < max_object_bytes <= max_bytes")
        self._max_bytes = max_bytes
        self._max_object_bytes = max_object_bytes
        self._compress_over = compress_over
        self._secret = secret or secrets.token_bytes(32)
        self._clock = clock
        # (namespace, ref) -> (expires_at, compressed?, stored bytes)
        self._entries: OrderedDict[tuple[str, str], tuple[float, bool, bytes]] = OrderedDict()
        # (expires_at, key), soonest first: one per put or extension, so some are stale
        # (the key is gone, or lives longer now) and are skipped when they come up.
        self._expiries: list[tuple[float, tuple[str, str]]] = []
        self._size = 0

    @property
    def size(self) -> int:
        """Bytes held now: the objects' and ``ENTRY_BYTES`` for each."""
        return self._size

    async def put(self, namespace: str, content: bytes, *, ttl: int) -> str:
        if len(content) > self._max_object_bytes:
            raise StoreError(
                f"object of {len(content):,} bytes is over the {self._max_object_bytes:,} cap"
            )
        ref = make_ref(self._secret, namespace, content)
        key = (namespace, ref)
        known = self._entries.get(key)
        if known is not None:
            # The same content again (a resent history): keep it longer, store nothing new.
            self._extend(key, known, self._clock() + ttl)
            return ref
        compressed = len(content) > self._compress_over
        stored = zlib.compress(content, 1) if compressed else content
        if len(stored) + ENTRY_BYTES > self._max_bytes:
            raise StoreError(f"object of {len(content):,} bytes does not fit the store")
        expires_at = self._clock() + ttl
        self._entries[key] = (expires_at, compressed, stored)
        self._expire_at(expires_at, key)
        self._size += len(stored) + ENTRY_BYTES
        self._evict()
        return ref

    async def touch(self, namespace: str, ref: str, ttl: int) -> bool:
        """Whether ``ref`` is still stored; if so, keep it at least ``ttl`` seconds more."""
        key = (namespace, ref)
        entry = self._entries.get(key)
        now = self._clock()
        if entry is None or entry[0] <= now:
            return False
        self._extend(key, entry, now + ttl)
        return True

    async def get(self, namespace: str, ref: str) -> bytes | None:
        key = (namespace, ref)
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires_at, compressed, stored = entry
        if expires_at <= self._clock():
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return zlib.decompress(stored) if compressed else stored

    def _drop(self, key: tuple[str, str]) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._size -= len(entry[2]) + ENTRY_BYTES

    def _extend(
        self, key: tuple[str, str], entry: tuple[float, bool, bytes], expires_at: float
    ) -> None:
        """Keep ``key`` until ``expires_at`` at least, as the most recently used."""
        if expires_at > entry[0]:
            self._entries[key] = (expires_at, entry[1], entry[2])
            self._expire_at(expires_at, key)
        self._entries.move_to_end(key)

    def _expire_at(self, expires_at: float, key: tuple[str, str]) -> None:
        expiries = self._expiries
        heapq.heappush(expiries, (expires_at, key))
        if len(expiries) > 2 * len(self._entries) + 1_024:  # mostly stale: start afresh
            expiries[:] = [(entry[0], k) for k, entry in self._entries.items()]
            heapq.heapify(expiries)

    def _evict(self) -> None:
        """Under pressure, expired objects go first, soonest expired first, then the least
        recently used. (An expired object is otherwise only noticed when it is read.) Each
        step is a heap or list operation: a full store of 100,000 objects once rescanned
        them all on every write."""
        if self._size <= self._max_bytes:
            return
        now, expiries, entries = self._clock(), self._expiries, self._entries
        while self._size > self._max_bytes and expiries and expiries[0][0] <= now:
            expires_at, key = heapq.heappop(expiries)
            entry = entries.get(key)
            if entry is not None and entry[0] == expires_at:
                self._drop(key)
        while self._size > self._max_bytes:
            self._drop(next(iter(entries)))
