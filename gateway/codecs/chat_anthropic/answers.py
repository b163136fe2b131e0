"""Anthropic Messages answers -> OpenAI chat completions, for a chat client's request that
Claude answered. No I/O.

``from_message`` turns a Messages API answer into a chat completion; ``Accumulator`` builds
that answer from the Messages stream's events, and ``ChunkTranslator`` turns the same
events into OpenAI stream chunks as they arrive; ``openai_error`` puts an Anthropic error
in OpenAI's envelope.

Answers: text blocks joined into ``content``; ``tool_use`` -> ``tool_calls`` (arguments
as JSON; a call cut off by the token limit keeps the partial text it got); thinking
blocks -> ``thinking_blocks`` (lossless, so they can be sent back) and their text as
``reasoning_content``; stop reasons end_turn/stop_sequence/pause_turn -> stop,
max_tokens -> length, tool_use -> tool_calls, refusal -> content_filter; usage with the
cache reads and writes folded into ``prompt_tokens`` and the reads reported as
``prompt_tokens_details.cached_tokens``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson

from gateway.codecs.anthropic_envelopes import error_type

__all__ = ["Accumulator", "ChunkTranslator", "from_message", "openai_error", "usage_of"]

STOP_REASONS: Final = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}


def from_message(message: Mapping[str, Any], *, created: int = 0) -> dict[str, Any]:
    """The chat completion for Messages API answer ``message``."""
    text: list[str] = []
    thinking: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for block in message.get("content") or ():
        kind = block.get("type")
        if kind == "text":
            text.append(block.get("text", ""))
        elif kind in ("thinking", "redacted_thinking"):
            thinking.append(dict(block))
        elif kind == "tool_use":
            calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {
                        "name": block.get("name"),
                        "arguments": block["partial_json"]
                        if isinstance(block.get("partial_json"), str)
                        else orjson.dumps(block.get("input") or {}).decode(),
                    },
                }
            )
    reply: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
    if calls:
        reply["tool_calls"] = calls
    if thinking:
        reply["thinking_blocks"] = thinking
        reasoning = "".join(b.get("thinking", "") for b in thinking if b["type"] == "thinking")
        if reasoning:
            reply["reasoning_content"] = reasoning
    return {
        "id": message.get("id"),
        "object": "chat.completion",
        "created": created,
        "model": message.get("model"),
        "choices": [
            {
                "index": 0,
                "message": reply,
                "logprobs": None,
                "finish_reason": STOP_REASONS.get(str(message.get("stop_reason")), "stop"),
            }
        ],
        "usage": usage_of(message.get("usage") or {}),
    }


def openai_error(status: int, body: bytes) -> bytes:
    """An Anthropic error body in OpenAI's envelope (``type`` and ``code`` are Anthropic's
    error type)."""
    try:
        found = orjson.loads(body)
    except orjson.JSONDecodeError:
        found = None
    error = found.get("error") if isinstance(found, dict) else None
    error = error if isinstance(error, dict) else {}
    message = str(error.get("message") or body[:300].decode("utf-8", "replace") or status)
    kind = str(error.get("type") or error_type(status))
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": kind}})


def usage_of(usage: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI usage for Anthropic ``usage``: cache reads and writes are input tokens too."""
    read = int(usage.get("cache_read_input_tokens") or 0)
    written = int(usage.get("cache_creation_input_tokens") or 0)
    prompt = int(usage.get("input_tokens") or 0) + read + written
    completion = int(usage.get("output_tokens") or 0)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": read},
    }


class Accumulator:
    """The Messages API answer built from its stream's events, in order (``add`` each
    event's data); ``message`` is the answer so far. An ``error`` event is kept as
    ``error``."""

    __slots__ = ("_json", "error", "message")

    def __init__(self) -> None:
        self.message: dict[str, Any] = {}
        self.error: dict[str, Any] | None = None
        self._json: dict[int, str] = {}

    def add(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message_start":
            self.message = dict(event.get("message") or {})
            self.message["content"] = list(self.message.get("content") or [])
        elif kind == "content_block_start":
            block = dict(event.get("content_block") or {})
            if block.get("type") == "tool_use":
                self._json[int(event.get("index", 0))] = ""
            self._blocks().append(block)
        elif kind == "content_block_delta":
            self._delta(int(event.get("index", 0)), event.get("delta") or {})
        elif kind == "content_block_stop":
            index = int(event.get("index", 0))
            partial = self._json.get(index)
            if partial is not None:
                try:
                    self._blocks()[index]["input"] = orjson.loads(partial) if partial else {}
                except orjson.JSONDecodeError:
                    return  # left to ``finish``, which keeps the partial text
                del self._json[index]
        elif kind == "message_delta":
            delta = event.get("delta") or {}
            self.message.update({k: v for k, v in delta.items() if v is not None})
            usage = dict(self.message.get("usage") or {})
            usage.update({k: v for k, v in (event.get("usage") or {}).items() if v is not None})
            self.message["usage"] = usage
        elif kind == "message_stop":
            self.finish()
        elif kind == "error":
            self.error = dict(event.get("error") or {})

    def finish(self) -> None:
        """End the blocks the stream left open: a tool call whose input was cut off (the
        answer ran out of tokens) keeps the text it got as ``partial_json``."""
        for index, partial in sorted(self._json.items()):
            block = self._blocks()[index]
            try:
                block["input"] = orjson.loads(partial) if partial else {}
            except orjson.JSONDecodeError:
                block["input"] = {}
                block["partial_json"] = partial
        self._json.clear()

    def _blocks(self) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = self.message.setdefault("content", [])
        return blocks

    def _delta(self, index: int, delta: Mapping[str, Any]) -> None:
        block = self._blocks()[index]
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = block.get("text", "") + delta.get("text", "")
        elif kind == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
        elif kind == "signature_delta":
            block["signature"] = block.get("signature", "") + delta.get("signature", "")
        elif kind == "input_json_delta":
            self._json[index] = self._json.get(index, "") + delta.get("partial_json", "")


class ChunkTranslator:
    """Messages stream events -> OpenAI ``chat.completion.chunk`` objects, as they arrive.

    ``add(event)`` returns the chunks an event makes (often none); text, reasoning and
    tool-call argument deltas pass through at once, tool calls numbered in the order they
    start; each thinking block, once complete, comes as a ``thinking_blocks`` entry
    numbered (``index``) as tool calls are, so that the OpenAI SDK can add them up.
    ``message_delta`` gives the chunk with the finish reason and, when ``include_usage``,
    a last chunk with the usage and no choices. An ``error`` event gives
    ``{"error": ...}``, which the caller sends as the terminal event."""

    __slots__ = (
        "_arguments",
        "_calls",
        "_thinking",
        "_thoughts",
        "created",
        "id",
        "include_usage",
        "model",
        "usage",
    )

    def __init__(self, *, created: int = 0, include_usage: bool = False) -> None:
        self.created, self.include_usage = created, include_usage
        self.id, self.model = "", ""
        self.usage: dict[str, Any] = {}
        self._calls: dict[int, int] = {}
        """Block index -> tool call index."""
        self._thinking: dict[int, dict[str, Any]] = {}
        self._thoughts = 0
        """Thinking blocks sent so far: the ``index`` of the next one."""
        self._arguments: set[int] = set()
        """Tool-call blocks that streamed some arguments."""

    def add(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message") or {}
            self.id, self.model = str(message.get("id", "")), str(message.get("model", ""))
            self.usage = dict(message.get("usage") or {})
            return [self._chunk({"role": "assistant", "content": ""})]
        if kind == "content_block_start":
            return self._start(int(event.get("index", 0)), event.get("content_block") or {})
        if kind == "content_block_delta":
            return self._delta(int(event.get("index", 0)), event.get("delta") or {})
        if kind == "content_block_stop":
            index = int(event.get("index", 0))
            if index in self._calls and index not in self._arguments:
                # A call without arguments streams none; "{}" keeps it parseable.
                call = {"index": self._calls[index], "function": {"arguments": "{}"}}
                return [self._chunk({"tool_calls": [call]})]
            block = self._thinking.pop(index, None)
            if block is None:
                return []
            # Numbered as tool calls are, for the OpenAI SDK's accumulator, which cannot
            # add up list entries without an index.
            entry = {"index": self._thoughts, **block}
            self._thoughts += 1
            return [self._chunk({"thinking_blocks": [entry]})]
        if kind == "message_delta":
            self.usage.update(
                {k: v for k, v in (event.get("usage") or {}).items() if v is not None}
            )
            reason = (event.get("delta") or {}).get("stop_reason")
            chunks = [self._chunk({}, STOP_REASONS.get(str(reason), "stop"))]
            if self.include_usage:
                chunks.append({**self._chunk({}), "choices": [], "usage": usage_of(self.usage)})
            return chunks
        if kind == "error":
            return [{"error": dict(event.get("error") or {})}]
        return []

    def _start(self, index: int, block: Mapping[str, Any]) -> list[dict[str, Any]]:
        kind = block.get("type")
        if kind == "tool_use":
            number = self._calls[index] = len(self._calls)
            call = {
                "index": number,
                "id": block.get("id"),
                "type": "function",
                "function": {"name": block.get("name"), "arguments": ""},
            }
            return [self._chunk({"tool_calls": [call]})]
        if kind in ("thinking", "redacted_thinking"):
            self._thinking[index] = dict(block)
        if kind == "text" and block.get("text"):
            return [self._chunk({"content": block["text"]})]
        return []

    def _delta(self, index: int, delta: Mapping[str, Any]) -> list[dict[str, Any]]:
        kind = delta.get("type")
        if kind == "text_delta":
            return [self._chunk({"content": delta.get("text", "")})]
        if kind == "thinking_delta":
            block = self._thinking.setdefault(index, {"type": "thinking", "thinking": ""})
            block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
            return [self._chunk({"reasoning_content": delta.get("thinking", "")})]
        if kind == "signature_delta":
            block = self._thinking.setdefault(index, {"type": "thinking", "thinking": ""})
            block["signature"] = block.get("signature", "") + delta.get("signature", "")
            return []
        if kind == "input_json_delta" and index in self._calls:
            if not delta.get("partial_json"):
                return []
            self._arguments.add(index)
            call = {
                "index": self._calls[index],
                "function": {"arguments": delta.get("partial_json", "")},
            }
            return [self._chunk({"tool_calls": [call]})]
        return []

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
