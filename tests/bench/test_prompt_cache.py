"""bench.prompt_cache: the model of Anthropic's prompt cache that replays are billed with."""

from __future__ import annotations

from typing import Any

import pytest

from bench.prompt_cache import PrefixCache, TooManyBreakpoints, cost
from pipelines import TokenCounter

COUNTER = TokenCounter("o200k_base")
MARK = {"type": "ephemeral"}
SYSTEM = "You are the airline's booking agent. Follow the policy exactly. " * 120


def text(value: str, marked: bool = False) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": value}
    if marked:
        block["cache_control"] = dict(MARK)
    return block


def request(turns: int, *, mark_last: bool = False, marked: tuple[int, ...] = ()) -> dict[str, Any]:
    """A conversation of ``turns`` user/assistant exchanges (two blocks each); with
    ``mark_last`` its last block carries a marker, and so does each message in ``marked``."""
    messages: list[dict[str, Any]] = []
    for n in range(turns):
        messages.append({"role": "user", "content": [text(f"Question {n}: " + "why? " * 40)]})
        messages.append({"role": "assistant", "content": [text(f"Answer {n}: " + "yes. " * 40)]})
    for index in marked:
        messages[index]["content"][-1]["cache_control"] = dict(MARK)
    if mark_last:
        messages[-1]["content"][-1]["cache_control"] = dict(MARK)
    return {"model": "claude-sonnet-4-5", "system": [text(SYSTEM)], "messages": messages}


def total(request: dict[str, Any]) -> int:
    return sum(p.tokens for p in PrefixCache(COUNTER).positions(request))


def billed(usage: dict[str, int]) -> int:
    return sum(usage.values())


def test_without_markers_nothing_is_read_or_written() -> None:
    """No cache_control anywhere: every turn pays full input, however often it repeats."""
    cache = PrefixCache(COUNTER)
    for turns in (3, 4, 4, 5):
        body = request(turns)
        usage = cache.usage(body, now=float(turns))
        assert usage == {
            "input_tokens": total(body),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }


def test_a_rolling_marker_reads_the_previous_turn_and_writes_the_new_part() -> None:
    """With a marker on the last block, each turn reads exactly the previous turn's prompt
    and writes only what it added; the first turn writes everything."""
    cache = PrefixCache(COUNTER)
    first = cache.usage(request(2, mark_last=True), now=0.0)
    assert first["cache_read_input_tokens"] == 0
    assert first["cache_creation_input_tokens"] == total(request(2)) > 1_024
    for turns in range(3, 7):
        usage = cache.usage(request(turns, mark_last=True), now=turns * 10.0)
        assert usage["cache_read_input_tokens"] == total(request(turns - 1))
        assert usage["cache_creation_input_tokens"] == total(request(turns)) - total(
            request(turns - 1)
        )
        assert usage["input_tokens"] == 0


def test_the_cache_key_is_content_not_where_markers_sit() -> None:
    """A prompt is found again when its markers moved (they are not content), but not when
    a block's content changed."""
    cache = PrefixCache(COUNTER)
    cache.usage(request(3, marked=(3,)), now=0.0)
    moved = cache.usage(request(3, mark_last=True), now=1.0)
    first_four = {**request(3), "messages": request(3)["messages"][:4]}
    assert moved["cache_read_input_tokens"] == total(first_four)
    edited = request(3, mark_last=True)
    edited["system"] = [text(SYSTEM + " Be brief.")]
    assert cache.usage(edited, now=2.0)["cache_read_input_tokens"] == 0


def test_a_jump_past_the_lookback_misses_unless_a_marker_is_within_reach() -> None:
    """Twenty blocks back is as far as a breakpoint looks: a request that added 24 blocks
    misses the previous turn's entry with only its rolling marker, and reads it when
    another marker sits within 20 blocks after that entry."""
    before = request(2, mark_last=True)  # 1 system block + 4 message blocks
    far = request(14, mark_last=True)  # 24 blocks more
    near = request(14, mark_last=True, marked=(9,))  # 6 blocks after the old end
    assert (
        len(PrefixCache(COUNTER).positions(far)) - len(PrefixCache(COUNTER).positions(before)) == 24
    )
    for body, expected in ((far, 0), (near, total(request(2)))):
        cache = PrefixCache(COUNTER)
        cache.usage(before, now=0.0)
        assert cache.usage(body, now=5.0)["cache_read_input_tokens"] == expected
    cache = PrefixCache(COUNTER, lookback=30)
    cache.usage(before, now=0.0)
    assert cache.usage(far, now=5.0)["cache_read_input_tokens"] == total(request(2))


def test_entries_expire_after_the_ttl_since_their_last_use() -> None:
    """An entry lives 5 minutes after its last write or read: a turn every 4 minutes keeps
    reading it, a 6-minute pause finds nothing; a 1-hour marker outlives the pause."""
    cache = PrefixCache(COUNTER)
    body = request(3, mark_last=True)
    cache.usage(body, now=0.0)
    for now in (240.0, 480.0, 720.0):
        assert cache.usage(body, now=now)["cache_read_input_tokens"] == total(body)
    assert cache.usage(body, now=720.0 + 360)["cache_read_input_tokens"] == 0
    hour = request(3)
    hour["messages"][-1]["content"][-1]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    cache.usage(hour, now=0.0)
    assert cache.usage(hour, now=3_000.0)["cache_read_input_tokens"] == total(hour)


def test_markers_on_short_prefixes_write_nothing() -> None:
    """A marked prefix under min_tokens is neither written nor billed as a write, so the
    next identical request reads nothing."""
    short = {
        "model": "claude-sonnet-4-5",
        "messages": [{"role": "user", "content": [text("Hello there", marked=True)]}],
    }
    cache = PrefixCache(COUNTER)
    for now in (0.0, 1.0):
        usage = cache.usage(short, now=now)
        assert usage["cache_creation_input_tokens"] == usage["cache_read_input_tokens"] == 0
        assert usage["input_tokens"] == total(short)


def test_more_than_four_markers_are_refused_as_by_the_api() -> None:
    """Five cache_control markers (a tool, the system prompt, three messages) raise; four
    pass; a 1-hour marker after a 5-minute one is refused too."""
    body = request(4, mark_last=True, marked=(1, 3))
    body["system"][0]["cache_control"] = dict(MARK)
    cache = PrefixCache(COUNTER)
    assert billed(cache.usage(body, now=0.0)) == total(body)
    body["tools"] = [{"name": "lookup", "input_schema": {}, "cache_control": dict(MARK)}]
    with pytest.raises(TooManyBreakpoints, match="Found 5"):
        cache.usage(body, now=1.0)
    late_hour = request(3, marked=(1,))
    late_hour["messages"][3]["content"][0]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    with pytest.raises(ValueError, match="1h"):
        cache.usage(late_hour, now=2.0)


def test_cost_uses_sonnet_prices_per_million_tokens() -> None:
    """A million tokens each of input, cache writes and cache reads cost 3.00, 3.75, 0.30."""
    usage = {
        "input_tokens": 1_000_000,
        "cache_creation_input_tokens": 2_000_000,
        "cache_read_input_tokens": 10_000_000,
    }
    assert cost(usage) == pytest.approx(3.0 + 7.5 + 3.0)
    assert cost(usage, input=1.0, write=0.0, read=0.0) == pytest.approx(1.0)


def test_markers_nested_deeper_count_and_are_not_content() -> None:
    """A marker on the text of a document's content source (two levels into the block) is
    a breakpoint the API counts (a fifth one is refused), and, not being content, moving
    it away still finds the prompt again."""
    body = request(4, mark_last=True, marked=(1, 3))
    body["system"][0]["cache_control"] = dict(MARK)
    inner = text("Refunds within 24 h. " * 100, marked=True)
    document = {"type": "document", "source": {"type": "content", "content": [inner]}}
    body["messages"][0]["content"].append(document)
    with pytest.raises(TooManyBreakpoints, match="Found 5"):
        PrefixCache(COUNTER).usage(body, now=0.0)
    body["system"][0].pop("cache_control")
    cache = PrefixCache(COUNTER)
    cache.usage(body, now=0.0)
    inner.pop("cache_control")
    assert cache.usage(body, now=1.0)["cache_read_input_tokens"] == total(body)


def test_a_one_hour_marker_nested_in_a_marked_block_comes_first() -> None:
    """A block's own marker sits at its end, after the blocks nested in it: a 1-hour
    marker on a document's content and a 5-minute one on the document are in order."""
    body = request(3, mark_last=True)
    hour = {"type": "ephemeral", "ttl": "1h"}
    inner = {**text("Refunds within 24 h. " * 100), "cache_control": hour}
    document = {"type": "document", "source": {"type": "content", "content": [inner]}}
    body["messages"][0]["content"].append({**document, "cache_control": MARK})
    assert billed(PrefixCache(COUNTER).usage(body, now=0.0)) == total(body)
