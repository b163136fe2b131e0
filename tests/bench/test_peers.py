"""bench.peers: the requests it sends and how it describes what a proxy forwarded."""

from __future__ import annotations

from typing import Any

import orjson

from bench.peers import Payload
from bench.peers_report import Figures, Sent, compare, ratios
from bench.peers_targets import BARE
from pipelines import TokenCounter

HISTORY: tuple[dict[str, Any], ...] = (
    {"role": "system", "content": "You are an airline agent."},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function"}]},
    {"role": "tool", "tool_call_id": "c1", "content": "{}"},
)


def test_every_body_is_the_history_and_a_new_numbered_turn() -> None:
    """Two turns give two different bodies, each the whole history plus its own message."""
    payload = Payload("history", HISTORY, per_round=1)
    first, second = orjson.loads(payload.body(1)), orjson.loads(payload.body(2))
    assert first["messages"][:-1] == list(HISTORY) == second["messages"][:-1]
    assert first["messages"][-1] != second["messages"][-1]
    assert first["stream"] is False


def test_a_request_without_history_is_one_message() -> None:
    """The small request carries only its new message, streamed when asked."""
    body = orjson.loads(Payload("small", (), per_round=1, stream=True).body(3))
    assert body["stream"] is True
    assert body["messages"] == [{"role": "user", "content": "And what about request 3?"}]


def test_forwarded_bodies_are_told_apart() -> None:
    """Unchanged, null fields dropped, and rewritten messages read differently."""
    counter = TokenCounter()
    sent = {"model": "m", "messages": list(HISTORY)}
    assert compare(sent, {**sent, "prompt_cache_key": "k"}, counter) == (
        "messages unchanged; added prompt_cache_key"
    )
    dropped = [{k: v for k, v in m.items() if v is not None} for m in HISTORY]
    assert "null" in compare(sent, {"model": "m", "messages": dropped}, counter)
    shorter = {"model": "m", "messages": list(HISTORY[:1])}
    assert compare(sent, shorter, counter).startswith("messages changed: 3 -> 1 messages")


def test_shares_name_the_verdict_and_the_bare_stacks_floor() -> None:
    """Each request kind's line gives contextgate's share of each peer's added p50, whether
    it meets its target, and the bare stack's share: the least possible on that stack."""
    figures = Figures(5, 16, 3.0, 3, [Sent("1 message", 100, 60, False, 1)])

    def added(ms: float) -> dict[str, float]:
        return {"p50": ms + 0.5, "p99": ms + 1, "added_p50": ms, "added_p99": ms + 0.5}

    figures.latency["1 message"] = {
        "contextgate": added(1.5),
        BARE: added(1.2),
        "LiteLLM": added(6.0),
        "Headroom": added(30.0),
    }
    assert ratios(figures) == [
        "- 1 message: 0.25 of LiteLLM's (target 0.2: not met, bare stack 0.20);"
        " 0.05 of Headroom's (target 0.1: met, bare stack 0.04)"
    ]
