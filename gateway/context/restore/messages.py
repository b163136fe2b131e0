"""The restore loop on the Anthropic Messages wire (``chat`` for OpenAI chat completions).

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
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.codecs.anthropic_envelopes import messages_event
from gateway.codecs.chat_anthropic import Accumulator, to_messages
from gateway.context.restore.restorer import Restorer, RestoreStats
from gateway.context.restore.rounds import (
    EXHAUSTED,
    MAX_ROUNDS,
    Resend,
    ResendStream,
    add_usage,
    chain,
)
from gateway.context.restore.tool import RESTORE_TOOL_NAME
from gateway.http.sse import close, event_data

__all__ = ["complete", "stream"]


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
    message = _Message()
    round_events: AsyncIterator[bytes] = chain(first, events)
    while True:
        now = _Round(message, later=stats.rounds > 0)
        try:
            async for event in round_events:
                relayed = now.relay(event)
                if relayed is not None:
                    yield relayed
        finally:
            await close(round_events)
        message.usage = add_usage(message.usage, now.usage)
        content, restores = now.finish()
        if restores and not now.client_calls and stats.rounds < MAX_ROUNDS:
            stats.rounds += 1
            extra.append({"role": "assistant", "content": content})
            extra.append(await _answers(restorer, restores))
            next_first, next_events = await resend(list(extra))
            round_events = chain(next_first, next_events)
            continue
        for event in _ending(message, now, restores, stats):
            yield event
        return


@dataclass(slots=True)
class _Message:
    """The client's one streamed message, over every round."""

    shown: int = 0
    """Blocks the client has been shown so far, over every round."""
    text_sent: bool = False
    usage: dict[str, Any] | None = None


@dataclass(slots=True)
class _Round:
    """One upstream stream of the message, relayed: its restore blocks held back, the
    others renumbered, its ending kept until the round's outcome is known."""

    message: _Message
    later: bool
    """A later round: its ``message_start`` is swallowed."""
    accumulator: Accumulator = field(default_factory=Accumulator)
    held: set[int] = field(default_factory=set)
    numbers: dict[int, int] = field(default_factory=dict)
    client_calls: int = 0
    stop: dict[str, Any] | None = None
    ending: list[bytes] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)

    def relay(self, event: bytes) -> bytes | None:
        """What the client gets now of one upstream event, if anything."""
        try:
            data = orjson.loads(event_data(event))
        except orjson.JSONDecodeError:
            return event
        if not isinstance(data, dict):
            return event
        kind = data.get("type")
        self.accumulator.add(data)
        if kind == "message_start":
            message = data.get("message") or {}
            self.usage.update(message.get("usage") or {})
            return None if self.later else event
        if kind in ("content_block_start", "content_block_delta", "content_block_stop"):
            return self._block(event, data, str(kind))
        if kind == "message_delta":
            self.stop = data
            self.ending.append(event)
            self.usage.update({k: v for k, v in (data.get("usage") or {}).items() if v is not None})
            return None
        if kind == "message_stop":
            self.ending.append(event)
            return None
        return event  # ping, error, anything newer

    def _block(self, event: bytes, data: dict[str, Any], kind: str) -> bytes | None:
        index = int(data.get("index", 0))
        if kind == "content_block_start":
            block = data.get("content_block") or {}
            if _is_restore(block):
                self.held.add(index)
                return None
            self.numbers[index] = self.message.shown
            self.message.shown += 1
            self.client_calls += block.get("type") == "tool_use"
            self.message.text_sent = self.message.text_sent or block.get("type") == "text"
        if index in self.held:
            return None
        if index not in self.numbers:
            return event
        number = self.numbers[index]
        return event if number == index else messages_event(kind, {**data, "index": number})

    def finish(self) -> tuple[list[Any], list[Any]]:
        """The round's whole content, and its restore blocks."""
        self.accumulator.finish()
        content = self.accumulator.message.get("content") or []
        return content, [content[i] for i in sorted(self.held) if i < len(content)]


def _ending(
    message: _Message, now: _Round, restores: list[Any], stats: RestoreStats
) -> list[bytes]:
    """The message's last events: the upstream's own ending when no restore round
    happened, else one ``message_delta`` with the usage of every round (``end_turn`` and
    ``EXHAUSTED`` when the restore calls were dropped for running out of rounds)."""
    if restores:
        stats.mixed += bool(now.client_calls)
        stats.exhausted = stats.exhausted or not now.client_calls
    stop = now.stop
    if stop is None or (not stats.rounds and not restores):
        return now.ending  # the upstream's own ending, untouched
    delta = dict(stop.get("delta") or {})
    events: list[bytes] = []
    if restores and not now.client_calls:
        delta["stop_reason"] = "end_turn"
        if not message.text_sent:
            events.extend(_exhausted_block(message.shown))
    events.append(
        messages_event("message_delta", {**stop, "delta": delta, "usage": message.usage or {}})
    )
    events.append(messages_event("message_stop", {"type": "message_stop"}))
    return events


def _exhausted_block(index: int) -> list[bytes]:
    """A text block at ``index`` saying ``EXHAUSTED``."""
    start = {"type": "text", "text": ""}
    text = {"type": "text_delta", "text": EXHAUSTED}
    return [
        messages_event(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": start},
        ),
        messages_event(
            "content_block_delta", {"type": "content_block_delta", "index": index, "delta": text}
        ),
        messages_event("content_block_stop", {"type": "content_block_stop", "index": index}),
    ]
