"""The summary model's calls (``gateway.summaries.model.chat_post``): a chat request in, a
chat completion out, whichever provider serves the model (scripted with MockTransports)."""

from __future__ import annotations

from typing import Any

import httpx
import httpx2
import orjson

from gateway.config import AnthropicSettings, UpstreamSettings
from gateway.providers.anthropic import AnthropicUpstream
from gateway.providers.openai import Upstream
from gateway.summaries.model import chat_post
from tests.gateway.codecs.chat_anthropic.samples import ANSWER
from tests.mock_upstream import chat_completion

ASKED: dict[str, Any] = {
    "model": "claude-opus-4-6",
    "messages": [{"role": "user", "content": "Summarise."}],
}
HEADERS = {"authorization": "Bearer sk-summary-0001"}


def claude(answer: httpx2.Response, sent: list[httpx2.Request]) -> AnthropicUpstream:
    def handler(request: httpx2.Request) -> httpx2.Response:
        sent.append(request)
        return answer

    return AnthropicUpstream(
        AnthropicSettings(base_url="http://anthropic.test"),
        UpstreamSettings(),
        transport=httpx2.MockTransport(handler),
    )


async def test_claudes_max_tokens_are_those_of_the_model_the_call_names() -> None:
    """The summarizer may call the request's own model rather than the summary model (when
    the span fits only the larger window): its output room is that model's."""
    sent: list[httpx2.Request] = []
    provider = claude(httpx2.Response(200, json=ANSWER), sent)
    rooms = {"claude-opus-4-6": 128_000}
    post = chat_post(provider, HEADERS, lambda model: rooms.get(model, 4_096))
    status, body = await post(ASKED)
    await provider.aclose()
    assert orjson.loads(sent[0].content)["max_tokens"] == 128_000
    assert status == 200
    completion = orjson.loads(body)
    assert completion["object"] == "chat.completion"
    assert completion["choices"][0]["message"]["content"] == "Sunny."


async def test_claudes_refusal_comes_back_in_openais_envelope() -> None:
    refusal = {"type": "error", "error": {"type": "rate_limit_error", "message": "Slow down."}}
    provider = claude(httpx2.Response(429, json=refusal), [])
    status, body = await chat_post(provider, HEADERS, lambda model: 4_096)(ASKED)
    await provider.aclose()
    assert status == 429
    assert orjson.loads(body)["error"]["message"] == "Slow down."


async def test_an_openai_compatible_model_gets_the_request_as_it_is() -> None:
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json=chat_completion("A summary."))

    provider = Upstream(
        UpstreamSettings(base_url="http://upstream.test/v1"), transport=httpx.MockTransport(handler)
    )
    asked = {**ASKED, "model": "gpt-4o-mini"}
    status, body = await chat_post(provider, HEADERS, lambda model: 4_096)(asked)
    await provider.aclose()
    assert status == 200
    assert orjson.loads(body)["choices"][0]["message"]["content"] == "A summary."
    assert orjson.loads(sent[0].content) == asked
    assert sent[0].headers["authorization"] == HEADERS["authorization"]
    assert sent[0].headers["content-type"] == "application/json"
