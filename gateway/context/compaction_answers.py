"""The answers of a request the gateway compacted for (``context.compaction_block``), in
the Messages API's shapes, as Anthropic gives them: the ``compaction`` block first in a
message (``with_block``) or a stream (``block_events``: a ``compaction`` block started
empty, one ``compaction_delta`` with its content, stopped; the stream's own blocks one
index further), and the answer of a request paused after its compaction or asking one on
demand (``paused``, ``paused_events``): the block alone, ``stop_reason: "compaction"``.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import orjson

from gateway.codecs.json_body import json_dict
from gateway.http.sse import event_json

__all__ = ["block_events", "paused", "paused_events", "with_block"]


def with_block(body: bytes, compaction: Mapping[str, Any]) -> bytes:
    """A Messages answer's JSON with ``compaction`` as its first content block."""
    message = json_dict(body)
    if message is None or not isinstance(message.get("content"), list):
        return body
    message["content"] = [dict(compaction), *message["content"]]
    return orjson.dumps(message)


async def block_events(
    events: AsyncIterator[bytes], compaction: Mapping[str, Any]
) -> AsyncIterator[bytes]:
    """A Messages stream with ``compaction`` as its first content block, as Anthropic
    streams one (a ``compaction`` block started empty, one ``compaction_delta`` with its
    content, stopped), the stream's own blocks one index further."""
    started = False
    async for event in events:
        data = event_json(event)
        if data is None:
            yield event
            continue
        kind = data.get("type")
        if kind == "message_start" and not started:
            started = True
            yield event
            for made in _block_events(compaction, 0):
                yield made
            continue
        if started and isinstance(data.get("index"), int):
            data["index"] += 1
            yield _event(str(kind), data)
            continue
        yield event


def paused(
    model: str,
    compaction: Mapping[str, Any],
    input_tokens: int,
    edits: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The answer to a request paused after its compaction (``pause_after_compaction``,
    or an on-demand compaction): the compaction block alone, ``stop_reason:
    "compaction"``, with the other ``edits`` applied; no model was asked."""
    message: dict[str, Any] = {
        "id": "msg_" + secrets.token_urlsafe(18),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [dict(compaction)],
        "stop_reason": "compaction",
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 0},
    }
    if edits:
        message["context_management"] = {"applied_edits": list(edits)}
    return message


def paused_events(message: Mapping[str, Any]) -> list[bytes]:
    """``paused``'s answer as a Messages stream."""
    start = {k: v for k, v in message.items() if k != "context_management"}
    start.update(content=[], stop_reason=None)
    usage = message["usage"]
    delta: dict[str, Any] = {
        "type": "message_delta",
        "delta": {"stop_reason": "compaction", "stop_sequence": None},
        "usage": {"output_tokens": usage["output_tokens"]},
    }
    if "context_management" in message:
        delta["context_management"] = message["context_management"]
    return [
        _event("message_start", {"type": "message_start", "message": start}),
        *_block_events(message["content"][0], 0),
        _event("message_delta", delta),
        _event("message_stop", {"type": "message_stop"}),
    ]


def _block_events(compaction: Mapping[str, Any], index: int) -> list[bytes]:
    delta = {
        "type": "compaction_delta",
        "content": compaction.get("content"),
        "encrypted_content": compaction.get("encrypted_content"),
    }
    return [
        _event(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": index,
                "content_block": {"type": "compaction", "content": None},
            },
        ),
        _event(
            "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        ),
        _event("content_block_stop", {"type": "content_block_stop", "index": index}),
    ]


def _event(kind: str, data: Mapping[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"
