"""OpenAI chat answers -> Anthropic Messages answers and errors, for the inbound
``/v1/messages`` route when the upstream speaks OpenAI. No I/O.

``message_of`` turns a chat completion into a Messages answer (its id as ``answer_id``
gives it); ``error_from_openai`` writes an upstream's error in the Anthropic shape,
``{"type": "error", "error": {"type", "message"}}``. The stream's translation is
``messages_openai.stream``'s.

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

import orjson

from gateway.codecs.anthropic_envelopes import error_body

__all__ = [
    "REASONING",
    "STOP_REASONS",
    "answer_id",
    "anthropic_usage",
    "error_from_openai",
    "first_text",
    "message_of",
    "whole_thinking",
]

STOP_REASONS: Final = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}

REASONING: Final = ("reasoning_content", "reasoning")
"""Where OpenAI-compatible servers put reasoning text (DeepSeek and vLLM, OpenRouter)."""


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
        "stop_reason": STOP_REASONS.get(str(choice.get("finish_reason")), "end_turn"),
        "stop_sequence": None,
        "usage": anthropic_usage(completion.get("usage") or {}),
    }


def _reasoning(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    blocks = message.get("thinking_blocks")
    if isinstance(blocks, list) and blocks:
        return [whole_thinking(block) for block in blocks if isinstance(block, Mapping)]
    text = first_text(message, REASONING)
    return [{"type": "thinking", "thinking": text, "signature": ""}] if text else []


def whole_thinking(block: Mapping[str, Any]) -> dict[str, Any]:
    """A thinking block as it came, with the (empty) signature the type requires if it
    came without one, and without the ``index`` a streamed entry carries (the gateway's
    Anthropic provider numbers them for the OpenAI SDK)."""
    whole = {key: value for key, value in block.items() if key != "index"}
    return {"signature": "", **whole} if block.get("type") == "thinking" else whole


def first_text(fields: Mapping[str, Any], names: tuple[str, ...]) -> str:
    """The first non-empty string among ``fields``' ``names``, else ``""``."""
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
        import jiter  # arguments cut short: rare, and jiter's library is 0.5 MB to hold

        try:
            parsed = jiter.from_json(arguments.encode(), partial_mode=True)
        except ValueError:
            return {}
    return parsed if isinstance(parsed, dict) else {}


def anthropic_usage(usage: Mapping[str, Any]) -> dict[str, int]:
    """Anthropic usage for OpenAI ``usage``: the cached prompt tokens are cache reads."""
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
