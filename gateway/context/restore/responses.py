"""The restore loop on the OpenAI Responses API (``chat`` for chat completions, ``messages``
for the Anthropic Messages API).

``complete`` answers the restore calls of a whole response and asks again until the model
answers without one; ``stream`` does the same on a stream. Either way the client sees one
response: the restore rounds' calls are never shown, and what the model wrote besides
them (its reasoning, its text) is, in order.

A round goes up as the request with the previous rounds' output items (reasoning and
restore calls, as the upstream wrote them) and a ``function_call_output`` for each call
appended, so that the model sees what it asked for; the client's next request does not
carry them (a stateless client resends what it was shown), as on the chat route. On a
stream the second round's events are spliced into the first's: its ``response.created``
and ``response.in_progress`` are not shown, every event is numbered on from the last one
relayed (``sequence_number``), every output index follows the items shown before it, the
reasoning before a restore call is never shown (it is held until the item after it says
whose it is: a client resending a reasoning item without its follower is refused), and
the one ``response.completed`` carries the first response's id (the SDK holds a stream to
one id), every item shown and the usage of every round added up. Buffered, the client gets
the last round's body with every round's usage. The tool is offered on ``store: false``
requests only (``gateway.routes.responses``): with the upstream storing responses, the id
the client is given would name a round it never saw.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson

from gateway.context.restore.restorer import Restorer
from gateway.context.restore.rounds import (
    EXHAUSTED,
    MAX_ROUNDS,
    Resend,
    ResendStream,
    add_usage,
    chain,
)
from gateway.context.restore.tool import RESTORE_TOOL_NAME
from gateway.http.sse import close, event_json

__all__ = ["complete", "stream"]

_ENDS = frozenset({"response.completed", "response.incomplete", "response.failed"})


def _is_restore(item: Any) -> bool:
    return (
        isinstance(item, dict)
        and item.get("type") == "function_call"
        and item.get("name") == RESTORE_TOOL_NAME
    )


def _is_call(item: Any) -> bool:
    """Whether ``item`` is a call the client must answer (any but a restore call)."""
    if not isinstance(item, dict) or _is_restore(item):
        return False
    kind = str(item.get("type", ""))
    return kind.endswith("_call") and isinstance(item.get("call_id"), str)


async def _answers(restorer: Restorer, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The items answering restore ``calls``: a ``function_call_output`` each, then, when a
    restored object was an image, one user message carrying it."""
    asked = [
        {
            "id": call.get("call_id"),
            "type": "function",
            "function": {"name": RESTORE_TOOL_NAME, "arguments": call.get("arguments", "")},
        }
        for call in calls
    ]
    items: list[dict[str, Any]] = []
    for message in await restorer.answer_all(asked):
        if message.get("role") == "tool":
            content = message.get("content")
            text = content if isinstance(content, str) else orjson.dumps(content).decode()
            call_id = message.get("tool_call_id")
            items.append({"type": "function_call_output", "call_id": call_id, "output": text})
        else:
            items.append({"type": "message", "role": "user", "content": _parts(message)})
    return items


def _parts(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A restore round's user message (restored media) as Responses input parts."""
    parts: list[dict[str, Any]] = []
    content = message.get("content")
    for part in content if isinstance(content, list) else []:
        if not isinstance(part, dict):
            continue
        if part.get("type") == "text":
            parts.append({"type": "input_text", "text": str(part.get("text", ""))})
        elif part.get("type") == "image_url":
            found = part.get("image_url")
            url = found.get("url") if isinstance(found, dict) else found
            parts.append({"type": "input_image", "image_url": url, "detail": "auto"})
        else:
            parts.append(part)
    return parts


def _exhausted() -> dict[str, Any]:
    """The answer shown when the model still asks to restore after the last round."""
    text = {"type": "output_text", "text": EXHAUSTED, "annotations": []}
    return {
        "type": "message",
        "id": "msg_contextgate_exhausted",
        "role": "assistant",
        "status": "completed",
        "content": [text],
    }


async def complete(body: bytes, restorer: Restorer, resend: Resend) -> bytes:
    """A whole response with its restore calls answered: while the model asks only to
    restore, answer and ask again. Returns the body the client gets."""
    stats = restorer.stats
    extra: list[dict[str, Any]] = []
    usage: dict[str, Any] | None = None
    while True:
        try:
            response = orjson.loads(body)
        except orjson.JSONDecodeError:
            return body
        if not isinstance(response, dict) or not isinstance(response.get("output"), list):
            return body
        usage = add_usage(usage, response.get("usage"))
        output: list[Any] = response["output"]
        restores = [item for item in output if _is_restore(item)]
        if not restores:
            break
        others = any(_is_call(item) for item in output)
        if response.get("status") != "completed" or any(
            item.get("status", "completed") != "completed" for item in restores
        ):
            response["output"] = [item for item in output if not _is_restore(item)]
            break  # cut off (max_output_tokens): its calls are not whole, nothing to answer
        if others or stats.rounds >= MAX_ROUNDS:
            stats.mixed += others
            stats.exhausted = stats.exhausted or not others
            shown = [item for item in output if not _is_restore(item)]
            said = others or any(_said(item) for item in shown)
            response["output"] = shown if said else [*shown, _exhausted()]
            break
        stats.rounds += 1
        extra.extend(_resendable(output))
        extra.extend(await _answers(restorer, restores))
        body = await resend(list(extra))
    if usage is not None:
        response["usage"] = usage
    return orjson.dumps(response)


class _Splice:
    """The client's one response across the rounds' streams: its events' numbers, the
    output indexes of the items shown, and the items themselves."""

    def __init__(self) -> None:
        self.sequence = 0
        self.response_id: Any = None
        self.shown: list[Any] = []
        self.indexes: dict[int, int] = {}
        """This round's output index -> the client's."""

    def event(self, data: dict[str, Any]) -> bytes:
        """``data`` as the client's next event, numbered on and indexed."""
        data["sequence_number"] = self.sequence
        self.sequence += 1
        index = data.get("output_index")
        if isinstance(index, int):
            data["output_index"] = self.indexes.setdefault(index, len(self.indexes) + self.base)
        kind = data.get("type", "")
        return f"event: {kind}\ndata: ".encode() + orjson.dumps(data) + b"\n\n"

    base = 0
    """The client's index of this round's first item: the items shown in earlier rounds."""

    def next_round(self) -> None:
        self.base = len(self.shown)
        self.indexes = {}


async def stream(
    first: bytes, events: AsyncIterator[bytes], restorer: Restorer, resend: ResendStream
) -> AsyncIterator[bytes]:
    """A stream with its restore calls answered in place: the events of the model's
    output relayed as they come, each numbered and indexed as the client's one response;
    a restore call's events held, and those of the reasoning before it (a reasoning item
    is held until the item after it shows whose it is); when the round ends with restore
    calls only, they are answered, the next round is streamed on, and so on; the last
    round's end is the client's, with every item it was shown and every round's usage."""
    stats = restorer.stats
    splice = _Splice()
    extra: list[dict[str, Any]] = []
    usage: dict[str, Any] | None = None
    current = chain(first, events)
    try:
        while True:
            held: set[int] = set()
            reasoning: list[dict[str, Any]] = []  # events of reasoning not yet shown
            restores: list[dict[str, Any]] = []
            round_items: list[Any] = []
            others = False
            ended: dict[str, Any] | None = None
            async for event in current:
                data = event_json(event)
                if data is None:
                    yield event  # a comment, a keep-alive: as it came
                    continue
                kind = data.get("type")
                index = data.get("output_index")
                if kind in ("response.created", "response.in_progress"):
                    response = data.get("response")
                    if splice.response_id is None and isinstance(response, dict):
                        splice.response_id = response.get("id")
                    if not extra:  # the first round's: the client's response begins
                        yield splice.event(data)
                    continue
                if kind == "response.output_item.added":
                    item = data.get("item")
                    if _is_restore(item):
                        held.add(index if isinstance(index, int) else -1)
                        # Reasons for a call never shown: sent back up, never shown.
                        round_items.extend(
                            hidden.get("item")
                            for hidden in reasoning
                            if hidden.get("type") == "response.output_item.done"
                        )
                        reasoning = []
                        continue
                    if not (isinstance(item, dict) and item.get("type") == "reasoning"):
                        for shown in _released(reasoning, splice, round_items):
                            yield shown
                        reasoning = []
                if isinstance(index, int) and index in held:
                    if kind == "response.output_item.done" and isinstance(data.get("item"), dict):
                        restores.append(data["item"])
                        round_items.append(data["item"])
                    continue
                if kind in _ENDS:
                    ended = data
                    break
                if reasoning or _is_reasoning_event(data):
                    reasoning.append(data)
                    continue
                if kind == "response.output_item.done":
                    item = data.get("item")
                    round_items.append(item)
                    splice.shown.append(item)
                    others = others or _is_call(item)
                yield splice.event(data)
            if ended is None:
                return  # the stream ended without its last event: as the upstream left it
            for shown in _released(reasoning, splice, round_items):
                yield shown
            response = ended.get("response")
            response = response if isinstance(response, dict) else {}
            usage = add_usage(usage, response.get("usage"))
            complete_round = ended.get("type") == "response.completed"
            if restores and not others and complete_round and stats.rounds < MAX_ROUNDS:
                stats.rounds += 1
                extra.extend(_resendable(round_items))
                extra.extend(await _answers(restorer, restores))
                await close(current)
                first_event, rest = await resend(list(extra))
                current = chain(first_event, rest)
                splice.next_round()
                continue
            if restores and complete_round:
                stats.mixed += others
                stats.exhausted = stats.exhausted or not others
                if not others and not any(_said(item) for item in splice.shown):
                    for event in _shown_exhausted(splice):
                        yield event
            yield splice.event(_ending(ended, response, splice, usage))
            return
    finally:
        await close(current)


def _is_reasoning_event(data: Mapping[str, Any]) -> bool:
    """Whether a stream event opens a reasoning item (its events are held from there)."""
    item = data.get("item")
    return (
        data.get("type") == "response.output_item.added"
        and isinstance(item, dict)
        and item.get("type") == "reasoning"
    )


def _released(held: list[dict[str, Any]], splice: _Splice, round_items: list[Any]) -> list[bytes]:
    """Held reasoning events, now known to reason for something shown: the client's."""
    out = []
    for data in held:
        if data.get("type") == "response.output_item.done":
            round_items.append(data.get("item"))
            splice.shown.append(data.get("item"))
        out.append(splice.event(data))
    return out


def _said(item: Any) -> bool:
    """Whether a shown item says something to the client: a message, or a call."""
    return isinstance(item, dict) and (item.get("type") == "message" or _is_call(item))


def _resendable(items: list[Any]) -> list[Any]:
    """A round's output items to send back up: all of them but reasoning without its
    ``encrypted_content``, which the upstream could find only by an id it did not store
    (the tool is offered on ``store: false`` requests only)."""
    return [
        item
        for item in items
        if not (
            isinstance(item, dict)
            and item.get("type") == "reasoning"
            and not isinstance(item.get("encrypted_content"), str)
        )
    ]


def _shown_exhausted(splice: _Splice) -> list[bytes]:
    """The events of the answer shown when only restore calls came back to the last."""
    item = _exhausted()
    splice.shown.append(item)
    index = len(splice.indexes) + splice.base
    splice.indexes[-2] = index
    added = {"type": "response.output_item.added", "output_index": -2, "item": item}
    done = {"type": "response.output_item.done", "output_index": -2, "item": item}
    return [splice.event(added), splice.event(done)]


def _ending(
    ended: dict[str, Any],
    response: dict[str, Any],
    splice: _Splice,
    usage: dict[str, Any] | None,
) -> dict[str, Any]:
    """The last round's end as the client's: the id its ``response.created`` gave (the SDK
    holds a stream to one id), every item shown, every round's usage."""
    whole = {**response, "output": list(splice.shown)}
    if splice.response_id is not None:
        whole["id"] = splice.response_id
    if usage is not None:
        whole["usage"] = usage
    return {**ended, "response": whole}
