"""The restore loop on OpenAI chat completions (``messages`` for the Anthropic Messages API).

``complete`` answers the restore calls of a whole answer and asks again until the model
answers without one; ``stream`` does the same on a stream, relaying it as it comes: text
deltas at once, a tool call's deltas once its name says whose it is (``_Calls``), restore
calls held and answered, and every round's stream shown to the client as one answer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

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


def _is_restore(call: Any) -> bool:
    function = call.get("function") if isinstance(call, dict) else None
    return isinstance(function, dict) and function.get("name") == RESTORE_TOOL_NAME


async def complete(body: bytes, restorer: Restorer, resend: Resend) -> bytes:
    """A non-streamed answer with its restore calls answered: while the model asks only to
    restore, answer and ask again (``resend`` returns the next answer's body, or raises
    ``GatewayError``). Returns the body the client gets."""
    stats = restorer.stats
    extra: list[dict[str, Any]] = []
    usage: dict[str, Any] | None = None
    while True:
        try:
            answer = orjson.loads(body)
        except orjson.JSONDecodeError:
            return body
        if not isinstance(answer, dict):
            return body
        usage = add_usage(usage, answer.get("usage"))
        choices = answer.get("choices")
        choice = choices[0] if isinstance(choices, list) and len(choices) == 1 else None
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict) or not isinstance(choice, dict):
            break
        calls = message.get("tool_calls") or []
        restores = [c for c in calls if _is_restore(c)]
        if not restores:
            break
        others = [c for c in calls if not _is_restore(c)]
        if others or stats.rounds >= MAX_ROUNDS:
            stats.mixed += bool(others)
            stats.exhausted = stats.exhausted or not others
            if others:
                message["tool_calls"] = others
            else:
                del message["tool_calls"]
                choice["finish_reason"] = "stop"
                message["content"] = message.get("content") or EXHAUSTED
            break
        stats.rounds += 1
        extra.append(
            {"role": "assistant", "content": message.get("content"), "tool_calls": restores}
        )
        extra.extend(await restorer.answer_all(restores))
        body = await resend(list(extra))
    if usage is not None:
        answer["usage"] = usage
    return orjson.dumps(answer)


async def stream(
    first: bytes,
    events: AsyncIterator[bytes],
    restorer: Restorer,
    resend: ResendStream,
) -> AsyncIterator[bytes]:
    """A streamed answer relayed with its restore calls answered in place: text deltas at
    once, the client's tool-call deltas once their name is known (renumbered to leave no
    gap), restore calls held and answered, the next round's stream continuing the same
    stream for the client (same id), the usage totals where the upstream put its usage (a
    chunk of their own, or the final chunk) and one ``[DONE]`` at the end. ``resend``
    opens the next round's stream (its first event and the rest).
    Only for single-choice requests (``with_restore_tool`` refuses ``n > 1``)."""
    stats = restorer.stats
    extra: list[dict[str, Any]] = []
    relay = _Relay()
    round_events: AsyncIterator[bytes] = chain(first, events)
    while True:
        try:
            async for event in round_events:
                relayed = relay.relay(event)
                if relayed is not None:
                    yield relayed
        finally:
            await close(round_events)
        for event in relay.end_round():
            yield event
        calls = relay.now.calls
        restores = calls.restores()
        if restores and not calls.client and stats.rounds < MAX_ROUNDS:
            stats.rounds += 1
            text = "".join(relay.now.text) or None
            extra.append({"role": "assistant", "content": text, "tool_calls": restores})
            extra.extend(await restorer.answer_all(restores))
            next_first, next_events = await resend(list(extra))
            round_events = chain(next_first, next_events)
            relay.start_round()
            continue
        for event in relay.ending(stats, restores):
            yield event
        return


@dataclass(slots=True)
class _Round:
    """What one upstream stream of the answer holds back until it ends."""

    calls: _Calls = field(default_factory=lambda: _Calls())
    text: list[str] = field(default_factory=list)
    finish: dict[str, Any] | None = None
    """The chunk with the finish reason, held until the round's outcome is known."""
    done: bytes | None = None
    usage: Any = None


class _Relay:
    """One streamed chat answer as the client sees it, relayed round by round."""

    __slots__ = (
        "later",
        "now",
        "stream_id",
        "template",
        "thinking_before",
        "thinking_seen",
        "usage",
        "usage_apart",
    )

    def __init__(self) -> None:
        self.now = _Round()
        self.later = False
        """Whether this round is a later one (the same answer to the client)."""
        self.stream_id: Any = None
        self.template: dict[str, Any] = {"object": "chat.completion.chunk"}
        self.usage: dict[str, Any] | None = None
        # Whether the upstream sent its usage in a chunk of its own (no choices): the totals
        # go so too; else on the final chunk, where it put them (a chunk without choices
        # would surprise a client that did not ask for one).
        self.usage_apart = False
        self.thinking_before = self.thinking_seen = 0
        """Thinking blocks of the rounds before this one; seen so far in all."""

    def start_round(self) -> None:
        """Ready for the next round's stream."""
        self.now = _Round()
        self.later = True
        self.thinking_before = self.thinking_seen

    def relay(self, event: bytes) -> bytes | None:
        """What the client gets now of one upstream event, if anything."""
        data = event_data(event)
        if data.strip() == b"[DONE]":
            self.now.done = event
            return None
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            return event
        if not isinstance(chunk, dict):
            return event
        if self.stream_id is None:
            self.stream_id = chunk.get("id")
            self.template = {
                k: chunk[k] for k in ("id", "object", "created", "model") if k in chunk
            }
        elif "id" in chunk:
            chunk["id"] = self.stream_id
        if "usage" in chunk:
            # Some providers repeat a running total in every chunk: the last counts.
            self.now.usage = chunk.pop("usage") or self.now.usage
            if not chunk.get("choices"):
                self.usage_apart = True
                return None
        choices = chunk.get("choices")
        if not isinstance(choices, list) or len(choices) != 1:
            return _event(chunk)
        return self._choice(chunk, choices[0])

    def _choice(self, chunk: dict[str, Any], choice: Any) -> bytes | None:
        delta = choice.get("delta") or {}
        if self.later:
            # A later round is the same answer to the client: its role chunk would make an
            # SDK's accumulated role "assistantassistant".
            delta.pop("role", None)
        if isinstance(delta.get("content"), str):
            self.now.text.append(delta["content"])
        for block in delta.get("thinking_blocks") or ():
            # Numbered per round upstream; the client's one answer numbers on.
            if isinstance(block, dict) and isinstance(block.get("index"), int):
                block["index"] += self.thinking_before
                self.thinking_seen = max(self.thinking_seen, block["index"] + 1)
        deltas = delta.pop("tool_calls", None)
        if isinstance(deltas, list):
            passed = self.now.calls.take(deltas)
            if passed:
                delta["tool_calls"] = passed
        if choice.get("finish_reason") is not None:
            # Held until the round's outcome is known; what else it carries goes now.
            self.now.finish = {**chunk, "choices": [{**choice, "delta": {}}]}
            choice["finish_reason"] = None
        if delta or choice.get("logprobs"):
            return _event(chunk)
        return None

    def end_round(self) -> list[bytes]:
        """At the end of a round's stream: its usage counted, and the events of the
        client's tool-call deltas still held (no name ever came)."""
        self.usage = add_usage(self.usage, self.now.usage)
        leftover = self.now.calls.flush()
        if not leftover:
            return []
        return [
            _event({**self.template, "choices": [{"index": 0, "delta": {"tool_calls": leftover}}]})
        ]

    def ending(self, stats: RestoreStats, restores: list[dict[str, Any]]) -> list[bytes]:
        """The answer's last events: the finish chunk (``stop`` when the restore calls
        were dropped for running out of rounds), the usage totals and ``[DONE]``."""
        client = self.now.calls.client
        if restores:
            stats.mixed += bool(client)
            stats.exhausted = stats.exhausted or not client
        events: list[bytes] = []
        finish = self.now.finish
        if finish is not None:
            choice = finish["choices"][0]
            if restores and not client:
                choice["finish_reason"] = "stop"
                if not self.now.text:
                    choice["delta"] = {"content": EXHAUSTED}
            if self.usage is not None and not self.usage_apart:
                finish["usage"], self.usage = self.usage, None
            events.append(_event(finish))
        if self.usage is not None:
            events.append(_event({**self.template, "choices": [], "usage": self.usage}))
        if self.now.done is not None:
            events.append(self.now.done)
        return events


class _Calls:
    """The tool calls of one streamed round: whose each is, decided by its name."""

    __slots__ = ("_held", "_order", "_restore", "client")

    def __init__(self) -> None:
        self._restore: dict[Any, dict[str, Any]] = {}
        self.client: dict[Any, int] = {}
        """Client calls by their upstream key, with the index the client sees."""
        self._held: dict[Any, list[dict[str, Any]]] = {}
        self._order: list[Any] = []

    def take(self, deltas: list[Any]) -> list[dict[str, Any]]:
        """The deltas the client gets now (renumbered); restore deltas are kept."""
        passed: list[dict[str, Any]] = []
        for position, part in enumerate(deltas):
            if not isinstance(part, dict):
                continue
            key = _call_key(part, position, self._order)
            if key in self._restore:
                _accumulate(self._restore[key], part)
            elif key in self.client:
                passed.append({**part, "index": self.client[key]})
            else:
                held = self._held.setdefault(key, [])
                held.append(part)
                name = next((_name(p) for p in held if _name(p)), None)
                if name is None:
                    continue  # not known yet whose it is
                del self._held[key]
                if name == RESTORE_TOOL_NAME:
                    call = {k: v for k, v in held[0].items() if k != "index"}
                    call["type"] = "function"
                    call["function"] = {"name": RESTORE_TOOL_NAME, "arguments": ""}
                    for piece in held:
                        _accumulate(call, piece)
                    self._restore[key] = call
                else:
                    self.client[key] = len(self.client)
                    passed.extend({**p, "index": self.client[key]} for p in held)
        return passed

    def flush(self) -> list[dict[str, Any]]:
        """Deltas still held at the end of the round (no name ever came): the client's."""
        passed: list[dict[str, Any]] = []
        for key, held in self._held.items():
            self.client[key] = len(self.client)
            passed.extend({**p, "index": self.client[key]} for p in held)
        self._held.clear()
        return passed

    def restores(self) -> list[dict[str, Any]]:
        return [self._restore[key] for key in self._order if key in self._restore]


def _call_key(part: dict[str, Any], position: int, order: list[Any]) -> Any:
    """Which call a delta belongs to: its ``index``, else its id, else its position."""
    index = part.get("index")
    key = index if isinstance(index, int) else part.get("id") or f"position {position}"
    if key not in order:
        order.append(key)
    return key


def _name(part: dict[str, Any]) -> str | None:
    function = part.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) and name else None


def _accumulate(call: dict[str, Any], part: Mapping[str, Any]) -> dict[str, Any]:
    function = part.get("function")
    if isinstance(function, Mapping) and isinstance(function.get("arguments"), str):
        call["function"]["arguments"] += function["arguments"]
    return call


def _event(chunk: Mapping[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"
