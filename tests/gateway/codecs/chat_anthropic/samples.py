"""What the chat <-> Claude tests send and get, shared with the tests that go through the
gateway: the recorded Messages streams of the Anthropic SDK's test suite (as events, and
as the answer each adds up to), a Messages answer, a stream of thinking blocks, the
tau-bench histories, a user message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from gateway.codecs.chat_anthropic import Accumulator

ROOT = Path(__file__).resolve().parents[4]
TRACES = ROOT / "bench" / "data" / "tau-bench-gpt-4o-airline.json"
STREAMS = ROOT / "tests" / "fixtures" / "anthropic-sse"


def recorded(name: str) -> dict[str, Any]:
    """The answer a recorded stream adds up to."""
    accumulator = Accumulator()
    for line in (STREAMS / name).read_text().splitlines():
        if line.startswith("data: "):
            accumulator.add(orjson.loads(line[6:]))
    return accumulator.message


ANSWERS = (
    "basic_response.txt",
    "tool_use_response.txt",
    "refusal_response.txt",
    "incomplete_partial_json_response.txt",
)
"""The recorded streams that are one answer each (text, a tool call, a refusal, a call
cut off by the token limit)."""


def events_of(name: str) -> list[bytes]:
    data = (STREAMS / name).read_bytes()
    return [part + b"\n\n" for part in data.split(b"\n\n") if part.strip()]


THOUGHT = {"type": "thinking", "thinking": "Paris in May.", "signature": "c2ln"}

REDACTED = {"type": "redacted_thinking", "data": "EmwK"}


def thinking_events(last: dict[str, Any], *deltas: dict[str, Any]) -> list[dict[str, Any]]:
    """A Messages stream of a thinking block, a redacted thinking block, then ``last``
    (streamed with ``deltas``), ending as ``last`` would end the answer."""
    reasoning = {"type": "thinking_delta", "thinking": THOUGHT["thinking"]}
    stop = "tool_use" if last["type"] == "tool_use" else "end_turn"
    return [
        {"type": "message_start", "message": {"id": "msg_t", "model": "claude", "usage": {}}},
        {"type": "content_block_start", "index": 0, "content_block": {**THOUGHT, "thinking": ""}},
        {"type": "content_block_delta", "index": 0, "delta": reasoning},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": REDACTED},
        {"type": "content_block_stop", "index": 1},
        {"type": "content_block_start", "index": 2, "content_block": last},
        *({"type": "content_block_delta", "index": 2, "delta": d} for d in deltas),
        {"type": "content_block_stop", "index": 2},
        {"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {}},
    ]


ANSWER: dict[str, Any] = {
    "id": "msg_02",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-20250514",
    "content": [{"type": "text", "text": "Sunny."}],
    "stop_reason": "end_turn",
    "usage": {"input_tokens": 20, "output_tokens": 2},
}


HI = {"role": "user", "content": "Hi"}
