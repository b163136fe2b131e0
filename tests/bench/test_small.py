"""bench.small: how a run's request times become added latencies and ratios."""

from __future__ import annotations

from bench.peers import DIRECT
from bench.small import added, ratio


def test_added_is_each_rounds_median_less_the_mocks() -> None:
    """Per round, a target's median less the mock's median in that same round."""
    rounds = [
        {DIRECT: [1.0, 2.0, 9.0], "relay": [3.0, 4.0, 5.0]},
        {DIRECT: [2.0, 2.0, 2.0], "relay": [5.0, 6.0, 100.0]},
    ]
    figures = added(rounds)
    assert figures["relay"] == [2.0, 4.0]
    assert figures[DIRECT] == [2.0, 2.0]


def test_a_target_without_answers_in_a_round_is_left_out_of_it() -> None:
    rounds = [{DIRECT: [1.0], "relay": [2.0], "peer": []}]
    assert "peer" not in added(rounds)


def test_the_ratio_is_the_median_of_the_rounds_ratios() -> None:
    """Rounds where the reference added nothing are skipped rather than divided by."""
    assert ratio([2.0, 3.0, 8.0, 1.0], [1.0, 2.0, 2.0, 0.0]) == 2.0
