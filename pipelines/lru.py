"""A map of the most recently used items, bounded in number and in bytes.

The per-process caches that save work (previews, trimmed texts, rewrites, refs) hold what
a resent history brings again. Their items vary in size: a bound on their number alone
lets a cache of long texts hold many times what one of short texts does, so each is also
bounded by the bytes its items take, as the caller counts them (``size``), plus
``ITEM_BYTES`` for the entry itself. The least recently used item goes first.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from typing import Final, Generic, TypeVar

__all__ = ["ITEM_BYTES", "Lru", "text_bytes"]

K = TypeVar("K")
V = TypeVar("V")

ITEM_BYTES: Final = 160
"""What an entry costs besides its key's and value's own objects: its slot in the dict's
table and index, the ordered dict's link and a key tuple (measured with tracemalloc:
140-160 bytes)."""


def text_bytes(text: str) -> int:
    """The memory a string takes (its header and its characters at their width)."""
    return sys.getsizeof(text)


class Lru(Generic[K, V]):
    """At most ``entries`` items taking at most ``max_bytes`` together."""

    __slots__ = ("_bytes", "_items", "entries", "max_bytes")

    def __init__(self, *, entries: int, max_bytes: int) -> None:
        if entries < 1 or max_bytes < 1:
            raise ValueError("entries and max_bytes must be positive")
        self.entries, self.max_bytes = entries, max_bytes
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def held(self) -> int:
        """Bytes counted for the items held now."""
        return self._bytes

    def get(self, key: K) -> V | None:
        """The item kept for ``key``, now the most recently used, or ``None``."""
        found = self._items.get(key)
        if found is None:
            return None
        self._items.move_to_end(key)
        return found[0]

    def put(self, key: K, value: V, size: int) -> None:
        """Keep ``value`` for ``key``, counted as ``size`` bytes besides ``ITEM_BYTES``;
        an item larger than the whole bound is not kept."""
        size += ITEM_BYTES
        old = self._items.pop(key, None)
        if old is not None:
            self._bytes -= old[1]
        if size > self.max_bytes:
            return
        self._items[key] = (value, size)
        self._bytes += size
        while len(self._items) > self.entries or self._bytes > self.max_bytes:
            self._bytes -= self._items.popitem(last=False)[1][1]
