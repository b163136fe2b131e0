"""OpenAI chat answers -> Anthropic Messages answers, stream events and errors, for the
inbound ``/v1/messages`` route when the upstream speaks OpenAI. No I/O.

``message_of`` turns a chat completion into a Messages answer; ``EventTranslator`` turns
the completion's chunks into Messages server-sent events as they arrive, such that what
the anthropic SDK accumulates from the events is ``message_of`` of the completion the
chunks add up to; ``error_body`` and ``error_from_openai`` write errors in the Anthropic
shape, ``{"type": "error", "error": {"type", "message"}}``.

The mapping (only the first choice is read):

- content: the reasoning first (``thinking_blocks`` as they are, else
  ``reasoning_content`` or ``reasoning`` as one thinking block with an empty signature),
  then the text (a refusal is text too), then each tool call as a ``tool_use`` block whose
  ``input`` is the parsed arguments: arguments cut off by the token limit are parsed as
  far as they go (as the SDK parses a stream's), ``{}`` when they are not an object.
- ``stop_reason``: stop -> end_turn, length -> max_tokens, tool_calls and function_call
  -> tool_use, content_filter -> refusal; ``stop_sequence`` is never known.
- usage: ``input_tokens`` are the prompt tokens not read from the cache, the cached ones
  are ``cache_read_input_tokens``; nothing is reported as written to the cache.
"""

from __future__ import annotations

import secrets
from collections.abc import Collection, Mapping
from typing import Any, Final

import jiter
import orjson

__all__ = [
    "EventTranslator",
    "answer_id",
    "error_body",
    "error_from_openai",
    "error_status",
    "error_type",
    "message_of",
    "messages_event",
]

_STOP_REASONS: Final = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}
_REASONING: Final = ("reasoning_content", "reasoning")
"""Where OpenAI-compatible servers put reasoning text (DeepSeek and vLLM, OpenRouter)."""
_ERROR_TYPES: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_STATUSES: Final = {kind: status for status, kind in _ERROR_TYPES.items()} | {"api_error": 500}
_KNOWN_ERRORS: Final = frozenset(_STATUSES)
_STREAM_ERRORS: Final = {
    "upstream_timeout": "timeout_error",
    "rate_limit_exceeded": "rate_limit_error",
}
"""OpenAI error types and codes (the gateway's own among them) met in a stream."""


def answer_id(upstream: Any, seen: Collection[str] = ()) -> str:
    """The id of a Messages answer translated from the upstream's answer with id
    ``upstream``: that id, unless it is empty or one of the conversation's earlier answers
    had it (``seen``), when a ``msg_`` id of the gateway's own: a client keys its turns by
    it (Claude Code merges answers with one id into one turn)."""
    if isinstance(upstream, str) and upstream and upstream not in seen:
        return upstream
    return "msg_" + secrets.token_hex(12)


def message_of(completion: Mapping[str, Any], seen: Collection[str] = ()) -> dict[str, Any]:
    """The Messages answer (``"type": "message"``) for chat completion ``completion``; its
    id as ``answer_id`` gives it."""
    choices = completion.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else None
    choice = choice if isinstance(choice, Mapping) else {}
    message = choice.get("message")
    message = message if isinstance(message, Mapping) else {}
    content = _reasoning(message)
    text = _text(message.get("content")) + _text(message.get("refusal"))
    if text:
        content.append({"type": "text", "text": text})
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping):
            continue
        content.append(
            {
                "type": "tool_use",
                "id": str(call.get("id") or "") or "toolu_" + secrets.token_hex(12),
                "name": str(function.get("name") or ""),
                "input": _input(function.get("arguments")),
            }
        )
    return {
        "id": answer_id(completion.get("id"), seen),
        "type": "message",
        "role": "assistant",
        "model": str(completion.get("model") or ""),
        "content": content,
        "stop_reason": _STOP_REASONS.get(str(choice.get("finish_reason")), "end_turn"),
        "stop_sequence": None,
        "usage": _usage(completion.get("usage") or {}),
    }


def _reasoning(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    blocks = message.get("thinking_blocks")
    if isinstance(blocks, list) and blocks:
        return [_whole(block) for block in blocks if isinstance(block, Mapping)]
    text = _first_text(message, _REASONING)
    return [{"type": "thinking", "thinking": text, "signature": ""}] if text else []


def _whole(block: Mapping[str, Any]) -> dict[str, Any]:
    """A thinking block as it came, with the (empty) signature the type requires if it
    came without one, and without the ``index`` a streamed entry carries (the gateway's
    Anthropic provider numbers them for the OpenAI SDK)."""
    whole = {key: value for key, value in block.items() if key != "index"}
    return {"signature": "", **whole} if block.get("type") == "thinking" else whole


def _first_text(fields: Mapping[str, Any], names: tuple[str, ...]) -> str:
    for name in names:
        value = fields.get(name)
        if isinstance(value, str) and value:
            return value
    return ""


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p["text"] for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str)
        )
    return ""


def _input(arguments: Any) -> dict[str, Any]:
    if not isinstance(arguments, str) or not arguments:
        return {}
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        try:
            parsed = jiter.from_json(arguments.encode(), partial_mode=True)
        except ValueError:
            return {}
    return parsed if isinstance(parsed, dict) else {}


def _usage(usage: Mapping[str, Any]) -> dict[str, int]:
    details = usage.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, Mapping) else 0
    return {
        "input_tokens": max(_count(usage.get("prompt_tokens")) - cached, 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": _count(usage.get("completion_tokens")),
    }


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


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
            self._usage = _usage(usage)
        out = self._start(chunk)
        choices = chunk.get("choices")
        if self._finished:
            return out
        for choice in choices if isinstance(choices, list) else ():
            if isinstance(choice, Mapping) and choice.get("index", 0) == 0:
                out.extend(self._delta(choice.get("delta") or {}))
                if choice.get("finish_reason"):
                    self._stop = _STOP_REASONS.get(str(choice["finish_reason"]), "end_turn")
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
        usage = {**(self._usage or _usage({})), "output_tokens": 0}
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
        reasoning = _first_text(delta, _REASONING)
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
        index = self._new_block(_whole(block), out)
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


def messages_event(kind: str, data: Mapping[str, Any]) -> bytes:
    """One server-sent event of a Messages stream."""
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _stream_error(error: Any) -> dict[str, str]:
    """The Anthropic error for the error object of an error chunk (OpenAI's shape, the
    gateway's, or already Anthropic's)."""
    if not isinstance(error, Mapping):
        return {"type": "api_error", "message": str(error)}
    kind = error.get("type")
    if not isinstance(kind, str) or kind not in _KNOWN_ERRORS:
        kind = _STREAM_ERRORS.get(str(error.get("code")), _STREAM_ERRORS.get(str(kind)))
    message = error.get("message")
    return {
        "type": kind or "api_error",
        "message": message if isinstance(message, str) else "The upstream stream failed.",
    }


def error_type(status: int) -> str:
    """The Anthropic error type for HTTP ``status``."""
    return _ERROR_TYPES.get(status) or (
        "invalid_request_error" if 400 <= status < 500 else "api_error"
    )


def error_status(kind: str) -> int | None:
    """The HTTP status an Anthropic error type stands for (an error event carries none)."""
    return _STATUSES.get(kind)


def error_body(status: int, message: str) -> bytes:
    """An error body in the Anthropic shape, its type the one for ``status``."""
    return orjson.dumps(
        {"type": "error", "error": {"type": error_type(status), "message": message}}
    )


def error_from_openai(status: int, body: bytes) -> bytes:
    """An OpenAI-compatible upstream's error ``body`` re-written in the Anthropic shape,
    its message kept (a body that is not an OpenAI error envelope is the message)."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    message = error.get("message") if isinstance(error, dict) else error
    if not isinstance(message, str) or not message:
        message = body.decode("utf-8", "replace").strip()
    return error_body(status, message or f"The upstream answered with status {status}.")
