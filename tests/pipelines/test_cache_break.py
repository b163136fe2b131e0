"""Cache-break detection: fingerprints without markers, the predicted cause, the observed
drop in cache reads."""

from __future__ import annotations

import pytest

from pipelines import BREAK_CAUSES, observed_break
from pipelines.cache_break import (
    Fingerprints,
    cache_ttl,
    fingerprint,
    predicted_break,
    without_markers,
)

MARK = {"type": "ephemeral"}


def test_markers_are_not_content() -> None:
    """A message, tool or part fingerprints the same with or without cache_control at any
    depth; the unmarked value comes back as the very same object."""
    plain = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    marked = {
        "role": "user",
        "content": [{"type": "text", "text": "hi", "cache_control": MARK}],
        "cache_control": MARK,
    }
    assert without_markers(marked) == plain
    assert without_markers(plain) is plain
    assert fingerprint(marked) == fingerprint(plain)
    assert fingerprint({**plain, "content": "hi"}) != fingerprint(plain)


def prints(
    model: str = "m", system: str = "s", tools: tuple[str, ...] = ("a", "b")
) -> Fingerprints:
    return Fingerprints(model, system, tools)


@pytest.mark.parametrize(
    ("before", "now", "compaction", "expired", "expected"),
    [
        (prints(), prints(), False, False, None),
        (prints(), prints(model="n", system="t"), True, True, ("model", None)),
        (prints(), prints(system="t", tools=()), True, True, ("system", None)),
        (prints(), prints(tools=("b", "a")), True, True, ("tools", "order")),
        (prints(), prints(tools=("a", "c")), False, False, ("tools", "changed")),
        (prints(), prints(tools=("a", "b", "c")), False, False, ("tools", "added")),
        (prints(), prints(tools=("a",)), False, False, ("tools", "removed")),
        (prints(), prints(), True, True, ("compaction", None)),
        (prints(), prints(), False, True, ("ttl", None)),
        (Fingerprints("", "", None), prints(model="n"), False, False, None),
        (None, prints(), False, True, ("ttl", None)),
    ],
)
def test_the_cause_is_named_in_order_of_precedence(
    before: Fingerprints | None,
    now: Fingerprints,
    compaction: bool,
    expired: bool,
    expected: tuple[str, str | None] | None,
) -> None:
    """model, then system, then tools (and how they changed), then a compaction event,
    then an expired TTL; fingerprints a record did not keep compare as unchanged."""
    found = predicted_break(before, now, compaction=compaction, expired=expired)
    assert found == expected
    assert found is None or found[0] in BREAK_CAUSES


@pytest.mark.parametrize(
    ("previous", "now", "broke"),
    [
        (100_000, 94_000, True),  # 6% and 6,000 tokens fewer
        (100_000, 96_000, False),  # 4,000 fewer but only 4%
        (20_000, 18_500, False),  # 7.5% but only 1,500 tokens
        (20_000, 17_000, True),
        (20_000, 40_000, False),  # reads grew
        (None, 0, False),
        (20_000, None, False),
    ],
)
def test_observed_break_needs_a_drop_of_5_percent_and_2000_tokens(
    previous: int | None, now: int | None, broke: bool
) -> None:
    """Cache reads must fall by more than 5% and by at least 2,000 tokens to be a break;
    unknown figures are none."""
    assert observed_break(previous, now) is broke


def test_an_hour_of_automatic_caching_keeps_the_cache_an_hour() -> None:
    """A top-level ``ttl: "1h"`` cache_control (automatic caching, on the newest block) makes
    the conversation's cache last an hour, as a 1-hour marker on its newest message does."""
    messages = [{"role": "user", "content": "Hello"}]
    assert cache_ttl(messages, 300) == 300
    assert cache_ttl(messages, 300, {"type": "ephemeral", "ttl": "1h"}) == 3_600
    assert cache_ttl(messages, 300, MARK) == 300
    marked = [{"role": "user", "content": "Hello", "cache_control": {**MARK, "ttl": "1h"}}]
    assert cache_ttl(marked, 300) == 3_600
