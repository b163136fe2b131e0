"""The overflow retry (``gateway.context.answer``), in process: the gateway's upstreams
scripted with ``MockTransport`` (``tests/in_process.py``)."""

from __future__ import annotations

import itertools
from typing import Any

import httpx
import httpx2
import orjson

from gateway.context.answer import MAX_ATTEMPTS
from pipelines import TokenCounter
from tests.gateway.codecs.chat_anthropic.samples import ANSWER
from tests.in_process import in_process
from tests.mock_upstream import chat_completion

OVERFLOW = {
    "error": {
        "message": "This model's maximum context length is 8192 tokens.",
        "type": "invalid_request_error",
        "code": "context_length_exceeded",
    }
}
CLAUDE_OVERFLOW = {
    "type": "error",
    "error": {"type": "invalid_request_error", "message": "prompt is too long: 210000 tokens"},
}
QUESTION = {"role": "user", "content": "What is my flight?"}


def long_history(turns: int = 40) -> list[dict[str, Any]]:
    return [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "content": f"turn {i}: " + "the booking for flight HAT170 on 2024-05-16 " * 25,
        }
        for i in range(turns)
    ] + [QUESTION]


def tokens(messages: list[Any]) -> int:
    return TokenCounter("o200k_base").count_messages(messages)


async def test_an_overflow_too_small_to_compact_again_is_relayed_after_one_attempt() -> None:
    """A request already under the budget floor cannot be halved: the upstream's refusal
    comes back as it was, after one attempt, not after three identical ones."""
    async with in_process(lambda request: httpx.Response(400, json=OVERFLOW)) as gateway:
        response = await gateway.client.post(
            "/v1/chat/completions", json={"model": "gpt-4o", "messages": [QUESTION]}
        )
    assert response.status_code == 400
    assert response.json() == OVERFLOW
    assert response.headers["x-contextgate-attempts"] == "1"
    assert len(gateway.received) == 1


async def test_each_retry_halves_what_was_refused_until_the_attempts_run_out() -> None:
    async with in_process(lambda request: httpx.Response(400, json=OVERFLOW)) as gateway:
        response = await gateway.client.post(
            "/v1/chat/completions", json={"model": "gpt-4o", "messages": long_history(160)}
        )
    assert response.status_code == 400
    assert response.headers["x-contextgate-attempts"] == str(MAX_ATTEMPTS)
    sizes = [tokens(orjson.loads(sent.content)["messages"]) for sent in gateway.received]
    assert len(sizes) == MAX_ATTEMPTS
    assert all(later <= earlier / 2 for earlier, later in itertools.pairwise(sizes))


async def test_a_claude_overflow_is_retried_compacted_for_a_chat_client() -> None:
    """Claude's refusal (Anthropic's envelope, over the Messages wire) is an overflow too:
    the chat client gets the answer of the compacted retry, translated."""
    answers = [
        httpx2.Response(400, json=CLAUDE_OVERFLOW),
        httpx2.Response(200, json=ANSWER),
    ]
    async with in_process(anthropic=lambda request: answers.pop(0)) as gateway:
        raw = await gateway.openai("sk-ant-caller-0001").chat.completions.with_raw_response.create(
            model="claude-sonnet-4",
            messages=long_history(),  # type: ignore[arg-type]
        )
    assert raw.parse().choices[0].message.content == "Sunny."
    assert raw.headers["x-contextgate-attempts"] == "2"
    first, second = (orjson.loads(sent.content) for sent in gateway.anthropic_received)
    assert len(second["messages"]) < len(first["messages"])
    assert second["messages"][-1]["content"][0]["text"] == QUESTION["content"]
    assert gateway.received == []


async def test_a_success_is_answered_after_one_attempt() -> None:
    async with in_process(lambda request: httpx.Response(200, json=chat_completion())) as gateway:
        response = await gateway.client.post(
            "/v1/chat/completions", json={"model": "gpt-4o", "messages": long_history()}
        )
    assert response.status_code == 200
    assert response.headers["x-contextgate-attempts"] == "1"
    assert len(gateway.received) == 1
