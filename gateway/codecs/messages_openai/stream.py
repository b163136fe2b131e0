"""OpenAI chat completion chunks -> Anthropic Messages server-sent events, for the inbound
``/v1/messages`` route when the upstream speaks OpenAI and the client streams. No I/O.

``EventTranslator`` turns the completion's chunks into Messages events as they arrive, such
that what the anthropic SDK accumulates from the events is ``message_of`` of the
completion the chunks add up to (the mapping is ``messages_openai.answers``'s); an error
chunk becomes one ``error`` event of the nearest Anthropic type.
"""

from __future__ import annotations

import secrets
from collections.abc import Collection, Mapping
from typing import Any, Final

from gateway.codecs.anthropic_envelopes import error_status, messages_event
from gateway.codecs.messages_openai.answers import (
    REASONING,
    STOP_REASONS,
    answer_id,
    anthropic_usage,
    first_text,
    whole_thinking,
)

__all__ = ["EventTranslator"]

_STREAM_ERRORS: Final = {
    "upstream_timeout": "timeout_error",
    "rate_limit_exceeded": "rate_limit_error",
}
"""OpenAI error types and codes (the gateway's own among them) met in a stream."""


class EventTranslator:
    """OpenAI ``chat.completion.chunk`` objects -> Messages server-sent events, as they
    arrive, each ``event: <type>\\ndata: <json>\\n\\n``.

    ``add(chunk)`` returns the events a chunk makes: ``message_start`` first; text and
    refusal deltas stream into a text block, reasoning deltas into a thinking block that a
    ``thinking_blocks`` delta signs and closes (a block that comes whole, such as
    ``redacted_thinking``, is sent whole); each tool call opens a ``tool_use`` block its
    argument pieces stream into. The usage chunk (no choices) gives ``message_delta`` with
    the stop reason and usage. ``close()``, at ``[DONE]`` or when the upstream stops, ends
    the open block and the message (with a ``message_delta`` if none came). An error chunk
    gives one ``error`` event, and nothing comes after it."""

    __slots__ = (
        "_blocks",
        "_calls",
        "_ended",
        "_finished",
        "_id",
        "_model",
        "_open",
        "_seen",
        "_stop",
        "_usage",
    )

    def __init__(self, seen: Collection[str] = ()) -> None:
        self._seen = seen
        """Ids of the conversation's earlier answers (``answer_id``)."""
        self._id: str | None = None
        """The message id; ``None`` until ``message_start`` is sent."""
        self._model = ""
        self._blocks = 0
        self._open: tuple[int, str] | None = None
        """The open block's index and type."""
        self._calls: dict[int, int] = {}
        """Tool call index -> block index."""
        self._stop: str | None = None
        self._usage: dict[str, int] | None = None
        """The usage, once a chunk gave it."""
        self._finished = False
        """``message_delta`` sent: the chunks after it have nothing to add."""
        self._ended = False

    def add(self, chunk: Mapping[str, Any]) -> list[bytes]:
        if self._ended:
            return []
        if chunk.get("error") is not None:
            self._ended = True
            return [
                messages_event("error", {"type": "error", "error": _stream_error(chunk["error"])})
            ]
        usage = chunk.get("usage")
        if isinstance(usage, Mapping):
            self._usage = anthropic_usage(usage)
        out = self._start(chunk)
        choices = chunk.get("choices")
        if self._finished:
            return out
        for choice in choices if isinstance(choices, list) else ():
            if isinstance(choice, Mapping) and choice.get("index", 0) == 0:
                out.extend(self._delta(choice.get("delta") or {}))
                if choice.get("finish_reason"):
                    self._stop = STOP_REASONS.get(str(choice["finish_reason"]), "end_turn")
        if not choices and isinstance(usage, Mapping):
            out.extend(self._finish())
        return out

    def close(self) -> list[bytes]:
        if self._ended:
            return []
        self._ended = True
        out = self._start({})
        if not self._finished:
            out.extend(self._finish())
        out.append(messages_event("message_stop", {"type": "message_stop"}))
        return out

    def _start(self, chunk: Mapping[str, Any]) -> list[bytes]:
        if self._id is not None:
            return []
        self._id, self._model = (
            answer_id(chunk.get("id"), self._seen),
            str(chunk.get("model") or ""),
        )
        usage = {**(self._usage or anthropic_usage({})), "output_tokens": 0}
        message: dict[str, Any] = {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage,
        }
        return [messages_event("message_start", {"type": "message_start", "message": message})]

    def _finish(self) -> list[bytes]:
        self._finished = True
        delta = {"stop_reason": self._stop or "end_turn", "stop_sequence": None}
        usage = self._usage or {"output_tokens": 0}
        return [
            *self._close_block(),
            messages_event(
                "message_delta", {"type": "message_delta", "delta": delta, "usage": usage}
            ),
        ]

    def _delta(self, delta: Mapping[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        reasoning = first_text(delta, REASONING)
        if reasoning:
            out.extend(self._block("thinking"))
            out.append(self._block_delta({"type": "thinking_delta", "thinking": reasoning}))
        blocks = delta.get("thinking_blocks")
        for block in blocks if isinstance(blocks, list) else ():
            if isinstance(block, Mapping):
                out.extend(self._thinking_block(block))
        for name in ("content", "refusal"):
            text = delta.get(name)
            if isinstance(text, str) and text:
                out.extend(self._block("text"))
                out.append(self._block_delta({"type": "text_delta", "text": text}))
        calls = delta.get("tool_calls")
        for call in calls if isinstance(calls, list) else ():
            if isinstance(call, Mapping):
                out.extend(self._tool_call(call))
        return out

    def _thinking_block(self, block: Mapping[str, Any]) -> list[bytes]:
        if block.get("type") == "thinking" and self._open and self._open[1] == "thinking":
            signature = block.get("signature")
            out = []
            if isinstance(signature, str) and signature:
                delta = {"type": "signature_delta", "signature": signature}
                out.append(self._block_delta(delta))
            return out + self._close_block()
        out = self._close_block()
        index = self._new_block(whole_thinking(block), out)
        self._open = None
        out.append(
            messages_event("content_block_stop", {"type": "content_block_stop", "index": index})
        )
        return out

    def _tool_call(self, call: Mapping[str, Any]) -> list[bytes]:
        number = call.get("index", 0)
        number = number if isinstance(number, int) else 0
        function = call.get("function")
        function = function if isinstance(function, Mapping) else {}
        out: list[bytes] = []
        if number not in self._calls:
            out.extend(self._close_block())
            block = {
                "type": "tool_use",
                "id": str(call.get("id") or "") or "toolu_" + secrets.token_hex(12),
                "name": str(function.get("name") or ""),
                "input": {},
            }
            self._calls[number] = self._new_block(block, out)
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            delta = {"type": "input_json_delta", "partial_json": arguments}
            out.append(self._block_delta(delta, self._calls[number]))
        return out

    def _block(self, kind: str) -> list[bytes]:
        """Events that make a block of ``kind`` the open one (none if it already is)."""
        if self._open is not None and self._open[1] == kind:
            return []
        out = self._close_block()
        empty = {"text": {"text": ""}, "thinking": {"thinking": "", "signature": ""}}[kind]
        self._new_block({"type": kind, **empty}, out)
        return out

    def _new_block(self, block: dict[str, Any], out: list[bytes]) -> int:
        index = self._blocks
        self._blocks += 1
        self._open = (index, str(block.get("type")))
        start = {"type": "content_block_start", "index": index, "content_block": block}
        out.append(messages_event("content_block_start", start))
        return index

    def _close_block(self) -> list[bytes]:
        if self._open is None:
            return []
        index, self._open = self._open[0], None
        return [
            messages_event("content_block_stop", {"type": "content_block_stop", "index": index})
        ]

    def _block_delta(self, delta: dict[str, Any], index: int | None = None) -> bytes:
        if index is None:
            index = self._open[0] if self._open else 0
        data = {"type": "content_block_delta", "index": index, "delta": delta}
        return messages_event("content_block_delta", data)


def _stream_error(error: Any) -> dict[str, str]:
    """The Anthropic error for the error object of an error chunk (OpenAI's shape, the
    gateway's, or already Anthropic's)."""
    if not isinstance(error, Mapping):
        return {"type": "api_error", "message": str(error)}
    kind = error.get("type")
    if not isinstance(kind, str) or error_status(kind) is None:
        kind = _STREAM_ERRORS.get(str(error.get("code")), _STREAM_ERRORS.get(str(kind)))
    message = error.get("message")
    return {
        "type": kind or "api_error",
        "message": message if isinstance(message, str) else "The upstream stream failed.",
    }
