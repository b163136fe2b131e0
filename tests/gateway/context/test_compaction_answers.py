"""The answers of a request the gateway compacted for, checked against the installed
anthropic SDK's beta types: what a Messages client parses."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
from anthropic.types.beta import BetaMessage, BetaRawMessageStreamEvent
from pydantic import TypeAdapter

from gateway.context.compaction_answers import block_events, paused, paused_events, with_block
from gateway.http.sse import event_data

BLOCK = {
    "type": "compaction",
    "content": "[contextgate compaction: 9,000 tokens ...]",
    "encrypted_content": "contextgate.compaction.v1:ctx_AAAAAAAAAAAAAAAAAAAAAAAA.sig",
}
EVENTS = TypeAdapter(BetaRawMessageStreamEvent)


def event(kind: str, data: dict[str, object]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def parsed(events: list[bytes]) -> list[dict[str, object]]:
    return [orjson.loads(event_data(e)) for e in events]


async def relayed(events: list[bytes]) -> list[bytes]:
    async def source() -> AsyncIterator[bytes]:
        for e in events:
            yield e

    return [e async for e in block_events(source(), BLOCK)]


async def test_a_stream_gets_the_block_first_and_its_blocks_one_index_further() -> None:
    """The compaction block streams as index 0 right after ``message_start``; every
    index-bearing event of the model's own blocks moves one further; each event parses
    as the SDK's beta stream event."""
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "gpt-4o",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 0},
    }
    upstream = [
        event("message_start", {"type": "message_start", "message": message}),
        event(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        event(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "hi"},
            },
        ),
        event("content_block_stop", {"type": "content_block_stop", "index": 0}),
        event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 1},
            },
        ),
        event("message_stop", {"type": "message_stop"}),
    ]
    out = parsed(await relayed(upstream))
    for data in out:
        EVENTS.validate_python(data)
    assert [d["type"] for d in out[1:4]] == [
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
    ]
    assert out[2]["delta"] == {  # type: ignore[comparison-overlap]
        "type": "compaction_delta",
        "content": BLOCK["content"],
        "encrypted_content": BLOCK["encrypted_content"],
    }
    assert [d.get("index") for d in out] == [None, 0, 0, 0, 1, 1, 1, None, None]


def test_a_message_gets_the_block_first_and_a_paused_one_is_the_block_alone() -> None:
    """``with_block`` puts the block before the model's content; ``paused`` is a message
    of the block alone (``stop_reason: "compaction"``) with the other edits applied, and
    its stream accumulates to the same message."""
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "gpt-4o",
        "content": [{"type": "text", "text": "hi"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 1},
    }
    both = BetaMessage.model_validate(orjson.loads(with_block(orjson.dumps(message), BLOCK)))
    assert [b.type for b in both.content] == ["compaction", "text"]
    edits = [
        {"type": "clear_tool_uses_20250919", "cleared_tool_uses": 2, "cleared_input_tokens": 900}
    ]
    alone = paused("gpt-4o", BLOCK, 1_234, edits)
    checked = BetaMessage.model_validate(alone)
    assert checked.stop_reason == "compaction"
    assert [b.type for b in checked.content] == ["compaction"]
    assert checked.context_management is not None
    streamed = parsed(paused_events(alone))
    for data in streamed:
        EVENTS.validate_python(data)
    assert streamed[-2]["context_management"] == {"applied_edits": edits}
    assert with_block(b"not json", BLOCK) == b"not json"
