"""The in-memory offload store: bounded by bytes, least recently used out first, with TTLs.

The default backend, and the one for a single process. Objects over ``compress_over``
bytes are kept zlib-compressed. An object larger than ``max_object_bytes`` is refused
(``StoreError``), so the stage keeps that content in place.
"""

from __future__ import annotations

import secrets
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable

from gateway.store.refs import make_ref
from pipelines import StoreError

__all__ = ["MemoryStore"]


class MemoryStore:
    """``pipelines.OffloadStore`` in this process's memory."""

    __slots__ = (
        "_clock",
        "_compress_over",
        "_entries",
        "_max_bytes",
        "_max_object_bytes",
        "_secret",
        "_size",
    )

    def __init__(
        self,
        *,
        max_bytes: int = 256 * 1024 * 1024,
        max_object_bytes: int = 16 * 1024 * 1024,
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
        self._size = 0

    @property
    def size(self) -> int:
        """Bytes held now."""
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
            self._entries[key] = (max(known[0], self._clock() + ttl), known[1], known[2])
            self._entries.move_to_end(key)
            return ref
        compressed = len(content) > self._compress_over
        stored = zlib.compress(content, 1) if compressed else content
        self._entries[key] = (self._clock() + ttl, compressed, stored)
        self._size += len(stored)
        self._evict()
        return ref

    async def touch(self, namespace: str, ref: str, ttl: int) -> bool:
        """Whether ``ref`` is still stored; if so, keep it at least ``ttl`` seconds more."""
        key = (namespace, ref)
        entry = self._entries.get(key)
        now = self._clock()
        if entry is None or entry[0] <= now:
            return False
        self._entries[key] = (max(entry[0], now + ttl), entry[1], entry[2])
        self._entries.move_to_end(key)
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
            self._size -= len(entry[2])

    def _evict(self) -> None:
        """Under pressure, expired objects go first, then the least recently used. (An
        expired object is otherwise only noticed when it is read.)"""
        if self._size <= self._max_bytes:
            return
        now = self._clock()
        for key in [k for k, (expires_at, _, _) in self._entries.items() if expires_at <= now]:
            self._drop(key)
        while self._size > self._max_bytes:
            self._drop(next(iter(self._entries)))
