"""The restore loop on the Anthropic Messages wire (``gateway.context.restore`` for OpenAI chat).

When the model answers with ``tool_use`` blocks of the ``context_restore`` tool, the gateway
answers them from the store and asks again with the assistant turn (its blocks as they came:
thinking with its signature, text, the calls) and a user turn of ``tool_result`` blocks
appended, up to ``MAX_ROUNDS`` times. The client sees one message, streamed or not, with the
blocks of every round but the restore calls (so a thinking block that came before a restore
call still leads the turn, as the API requires of a turn that calls the client's tools when
thinking is on): streamed, the restore blocks are held back (their name is known at
``content_block_start``, so nothing else waits), the other blocks pass at once, renumbered
so the indices run on without a gap across rounds; a later round's ``message_start`` is
swallowed, and one ``message_delta`` with the usage of every round added up ends the
message. Answers that mix the client's tool calls with restore calls keep the client's and
drop the restore calls.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Final

import orjson

from gateway.codecs.anthropic import Accumulator, to_messages
from gateway.codecs.anthropic_answers import messages_event
from gateway.context.restore import (
    MAX_ROUNDS,
    RESTORE_TOOL_NAME,
    Resend,
    ResendStream,
    Restorer,
    add_usage,
    chain,
)
from gateway.http.sse import close, event_data

__all__ = ["complete", "stream"]

EXHAUSTED: Final = (
    "(The model asked to restore removed context more times than allowed for one request.)"
)


def _is_restore(block: Any) -> bool:
    return (
        isinstance(block, dict)
        and block.get("type") == "tool_use"
        and block.get("name") == RESTORE_TOOL_NAME
    )


def _calls(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Restore ``tool_use`` blocks as the OpenAI tool calls ``Restorer`` answers."""
    return [
        {
            "id": block.get("id"),
            "type": "function",
            "function": {
                "name": RESTORE_TOOL_NAME,
                "arguments": orjson.dumps(block.get("input") or {}).decode(),
            },
        }
        for block in blocks
    ]


async def _answers(restorer: Restorer, blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """The user turn answering restore ``blocks``: a ``tool_result`` each, then any media
    restored (images go in the turn after the results, as the codec places them)."""
    messages = await restorer.answer_all(_calls(blocks))
    turns = to_messages({"messages": messages})["messages"]
    content = [block for turn in turns for block in turn["content"]]
    return {"role": "user", "content": content}


async def complete(body: bytes, restorer: Restorer, resend: Resend) -> bytes:
    """A whole Messages answer with its restore calls answered: while the model asks only
    to restore, answer and ask again. Returns the body the client gets."""
    stats = restorer.stats
    extra: list[dict[str, Any]] = []
    usage: dict[str, Any] | None = None
    shown: list[Any] = []
    """The blocks of the rounds before, less their restore calls."""
    while True:
        try:
            answer = orjson.loads(body)
        except orjson.JSONDecodeError:
            return body
        if not isinstance(answer, dict) or not isinstance(answer.get("content"), list):
            return body
        usage = add_usage(usage, answer.get("usage"))
        content: list[Any] = answer["content"]
        restores = [b for b in content if _is_restore(b)]
        if not restores:
            break
        others = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]
        others = [b for b in others if not _is_restore(b)]
        if others or stats.rounds >= MAX_ROUNDS:
            stats.mixed += bool(others)
            stats.exhausted = stats.exhausted or not others
            answer["content"] = [b for b in content if not _is_restore(b)]
            if not others:
                answer["stop_reason"] = "end_turn"
                blocks = [*shown, *answer["content"]]
                if not any(isinstance(b, dict) and b.get("type") == "text" for b in blocks):
                    answer["content"].append({"type": "text", "text": EXHAUSTED})
            break
        stats.rounds += 1
        shown.extend(b for b in content if not _is_restore(b))
        extra.append({"role": "assistant", "content": content})
        extra.append(await _answers(restorer, restores))
        body = await resend(list(extra))
    answer["content"] = [*shown, *answer["content"]]
    if usage is not None:
        answer["usage"] = usage
    return orjson.dumps(answer)


async def stream(
    first: bytes,
    events: AsyncIterator[bytes],
    restorer: Restorer,
    resend: ResendStream,
) -> AsyncIterator[bytes]:
    """A Messages stream relayed with its restore calls answered in place; ``resend``
    opens the next round's stream (its first event and the rest)."""
    stats = restorer.stats
    extra: list[dict[str, Any]] = []
    usage: dict[str, Any] | None = None
    shown = 0
    """Blocks the client has been shown so far, over every round."""
    text_sent = False
    round_events: AsyncIterator[bytes] = chain(first, events)
    while True:
        accumulator = Accumulator()
        held: set[int] = set()
        numbers: dict[int, int] = {}
        client_calls = 0
        stop: dict[str, Any] | None = None
        ending: list[bytes] = []
        round_usage: dict[str, Any] = {}
        try:
            async for event in round_events:
                try:
                    data = orjson.loads(event_data(event))
                except orjson.JSONDecodeError:
                    yield event
                    continue
                if not isinstance(data, dict):
                    yield event
                    continue
                kind = data.get("type")
                accumulator.add(data)
                if kind == "message_start":
                    message = data.get("message") or {}
                    round_usage.update(message.get("usage") or {})
                    if stats.rounds == 0:
                        yield event
                    continue
                if kind in ("content_block_start", "content_block_delta", "content_block_stop"):
                    index = int(data.get("index", 0))
                    if kind == "content_block_start":
                        block = data.get("content_block") or {}
                        if _is_restore(block):
                            held.add(index)
                            continue
                        numbers[index] = shown
                        shown += 1
                        client_calls += block.get("type") == "tool_use"
                        text_sent = text_sent or block.get("type") == "text"
                    if index in held:
                        continue
                    if index not in numbers:
                        yield event
                        continue
                    number = numbers[index]
                    yield (
                        event
                        if number == index
                        else messages_event(str(kind), {**data, "index": number})
                    )
                    continue
                if kind == "message_delta":
                    stop = data
                    ending.append(event)
                    round_usage.update(
                        {k: v for k, v in (data.get("usage") or {}).items() if v is not None}
                    )
                    continue
                if kind == "message_stop":
                    ending.append(event)
                    continue
                yield event  # ping, error, anything newer
        finally:
            await close(round_events)
        usage = add_usage(usage, round_usage)
        accumulator.finish()
        content = accumulator.message.get("content") or []
        restores = [content[i] for i in sorted(held) if i < len(content)]
        if restores and not client_calls and stats.rounds < MAX_ROUNDS:
            stats.rounds += 1
            extra.append({"role": "assistant", "content": content})
            extra.append(await _answers(restorer, restores))
            next_first, next_events = await resend(list(extra))
            round_events = chain(next_first, next_events)
            continue
        if restores:
            stats.mixed += bool(client_calls)
            stats.exhausted = stats.exhausted or not client_calls
        if stop is None or (not stats.rounds and not restores):
            for event in ending:  # the upstream's own ending, untouched
                yield event
            return
        delta = dict(stop.get("delta") or {})
        if restores and not client_calls:
            delta["stop_reason"] = "end_turn"
            if not text_sent:
                start = {"type": "text", "text": ""}
                yield messages_event(
                    "content_block_start",
                    {"type": "content_block_start", "index": shown, "content_block": start},
                )
                text = {"type": "text_delta", "text": EXHAUSTED}
                yield messages_event(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": shown, "delta": text},
                )
                yield messages_event(
                    "content_block_stop", {"type": "content_block_stop", "index": shown}
                )
        yield messages_event("message_delta", {**stop, "delta": delta, "usage": usage or {}})
        yield messages_event("message_stop", {"type": "message_stop"})
        return
