"""Chat completions and chunks as an OpenAI-compatible upstream writes them, for the tests
of their translation into Messages answers and events."""

from __future__ import annotations

from typing import Any


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "qwen3-coder",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def usage_chunk(prompt: int, completion: int, cached: int = 0) -> dict[str, Any]:
    usage = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    return {**chunk({}), "choices": [], "usage": usage}


def completion_of(message: dict[str, Any], finish: str, usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "qwen3-coder",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage,
    }
