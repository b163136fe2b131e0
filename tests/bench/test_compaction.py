"""bench.compaction: the sessions the context-quality replay sends."""

from __future__ import annotations

import orjson

from bench.compaction import DATA, Tally, chained_sessions, cost_floor, single_sessions
from bench.quality import occurs, request_text
from pipelines import TokenCounter

TRAJECTORIES = orjson.loads(DATA.read_bytes())[:12]


def test_chained_facts_point_at_the_call_that_needs_them() -> None:
    """In sessions of chained trajectories each fact is needed at a tool call carrying
    the value or at the end of its trajectory (the next one's first user message), and
    was seen before the request that is checked for it."""
    sessions = chained_sessions(TRAJECTORIES, 40)
    assert sessions
    for session in sessions:
        assert len(session.requests) == 40
        for index, facts in session.due.items():
            history = session.requests[index]
            for fact in facts:
                assert occurs(fact.value, request_text(history))
                if fact.needed_at < len(session.messages):
                    message = session.messages[fact.needed_at]
                    if message["role"] == "assistant":
                        assert occurs(fact.value, request_text([message]))
                    else:
                        assert message["role"] == "user"
                assert len(history) <= fact.needed_at


def test_single_sessions_check_every_trajectory_with_facts() -> None:
    """Most trajectories have tracked facts, each checked once."""
    sessions = single_sessions(TRAJECTORIES)
    assert len(sessions) == len(TRAJECTORIES)
    assert sum(1 for s in sessions if s.due) >= len(TRAJECTORIES) // 2


def test_the_cost_floor_prices_what_a_method_keeping_the_target_must_send() -> None:
    """The floor writes a request's new tokens and reads the rest of what is kept: the
    raw history's own cost while it is under the kept size, less above it, never more."""
    assert cost_floor(2_000, 300, 3_600) == 0.1 * 1_700 + 1.25 * 300
    assert cost_floor(10_000, 500, 3_600) == 0.1 * 3_100 + 1.25 * 500
    assert cost_floor(10_000, 5_000, 3_600) == 1.25 * 3_600
    raw = Tally(TokenCounter(), 4_000)
    for session in single_sessions(TRAJECTORIES):
        for index, history in enumerate(session.requests):
            raw.add(history, index == 0)
    assert 0 < raw.floor < raw.cost
