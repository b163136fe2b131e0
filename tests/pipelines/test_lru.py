"""The LRU map the per-process caches use: bounded in items and in bytes."""

from __future__ import annotations

import pytest

from pipelines.lru import ITEM_BYTES, Lru, text_bytes


def test_the_least_recently_used_item_goes_first_past_the_count() -> None:
    """Past ``entries``, the item used longest ago is dropped; a read counts as a use."""
    kept: Lru[str, int] = Lru(entries=2, max_bytes=1_000_000)
    kept.put("a", 1, 0)
    kept.put("b", 2, 0)
    assert kept.get("a") == 1
    kept.put("c", 3, 0)
    assert (kept.get("a"), kept.get("b"), kept.get("c")) == (1, None, 3)


def test_large_items_are_bounded_by_bytes_not_only_by_count() -> None:
    """Items of 10 KB each within a 50 KB bound: at most four are held, whatever the count."""
    kept: Lru[int, str] = Lru(entries=1_000, max_bytes=50_000)
    for n in range(100):
        text = str(n) * 10_000
        kept.put(n, text[:10_000], text_bytes(text[:10_000]))
    assert len(kept) == 4
    assert kept.held <= 50_000
    assert kept.get(99) is not None
    assert kept.get(95) is None


def test_an_item_replaced_or_too_large_is_counted_right() -> None:
    """A key put again is counted once, at its new size; an item over the whole bound is
    not kept (and drops the old value of its key)."""
    kept: Lru[str, str] = Lru(entries=10, max_bytes=1_000)
    kept.put("a", "x", 100)
    kept.put("a", "y", 200)
    assert kept.held == 200 + ITEM_BYTES
    assert kept.get("a") == "y"
    kept.put("a", "z", 5_000)
    assert kept.held == 0
    assert kept.get("a") is None


def test_bounds_must_be_positive() -> None:
    """A cache bounded at nothing is refused at construction."""
    with pytest.raises(ValueError, match="must be positive"):
        Lru(entries=0, max_bytes=1)
