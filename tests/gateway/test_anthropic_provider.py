"""``claude-*`` models through the built-in Anthropic provider: the OpenAI SDK as the
client, the mock upstream speaking the Messages API (the recorded streams of the
Anthropic SDK's own tests), the official ``anthropic`` SDK in between."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import orjson
import pytest

from gateway.codecs.anthropic import from_message
from gateway.settings import AnthropicSettings, Settings, UpstreamSettings
from tests.gateway.codecs.test_anthropic import events_of, recorded
from tests.harness import GatewayServer
from tests.mock_upstream import JSONReply, MockUpstream, SSEReply

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather now.",
        "parameters": {"type": "object", "properties": {"location": {"type": "string"}}},
    },
}
PARIS = {"location": "Paris"}
MESSAGES: list[Any] = [
    {"role": "system", "content": "You are a weather assistant."},
    {"role": "user", "content": "What is the weather in Paris?"},
]


@pytest.fixture
def gateway(upstream: MockUpstream) -> Iterator[GatewayServer]:
    settings = Settings(
        upstream=UpstreamSettings(base_url=upstream.base_url),
        anthropic=AnthropicSettings(base_url=upstream.base_url.removesuffix("/v1")),
        summaries=False,
    )
    with GatewayServer(settings) as server:
        yield server


@pytest.fixture
def client(gateway: GatewayServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.base_url, api_key="sk-ant-mine", max_retries=0) as sdk:
        yield sdk


def test_a_claude_model_is_answered_through_the_messages_api(
    client: openai.OpenAI, upstream: MockUpstream
) -> None:
    answer = {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-20250514",
        "content": [
            {"type": "text", "text": "Let me check."},
            {
                "type": "tool_use",
                "id": "toolu_9",
                "name": "get_weather",
                "input": {"location": "Paris"},
            },
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 50, "cache_read_input_tokens": 300, "output_tokens": 12},
    }
    upstream.push(JSONReply(answer))
    completion = client.chat.completions.create(
        model="claude-sonnet-4", messages=MESSAGES, tools=[WEATHER], max_tokens=200
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    (call,) = choice.message.tool_calls or []
    assert (call.id, call.function.name) == ("toolu_9", "get_weather")
    assert orjson.loads(call.function.arguments) == {"location": "Paris"}
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == 350
    assert completion.usage.prompt_tokens_details is not None
    assert completion.usage.prompt_tokens_details.cached_tokens == 300
    (sent,) = upstream.received
    assert sent.path == "/v1/messages"
    # The caller's key, as the SDK sends it.
    key = sent.headers.get("x-api-key") or sent.headers["authorization"].removeprefix("Bearer ")
    assert key == "sk-ant-mine"
    assert "anthropic-version" in sent.headers
    body = sent.json()
    assert body["system"] == [{"type": "text", "text": "You are a weather assistant."}]
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": MESSAGES[1]["content"]}]}
    ]
    assert body["max_tokens"] == 200
    assert body["tools"][0]["input_schema"] == WEATHER["function"]["parameters"]


def test_a_recorded_stream_reaches_the_openai_client_as_chunks(
    client: openai.OpenAI, upstream: MockUpstream
) -> None:
    from openai.lib.streaming.chat import ChatCompletionStreamState

    upstream.push(SSEReply(events_of("tool_use_response.txt")))
    state: ChatCompletionStreamState[None] = ChatCompletionStreamState()
    usage = None
    for chunk in client.chat.completions.create(
        model="claude-sonnet-4",
        messages=MESSAGES,
        tools=[WEATHER],
        stream=True,
        stream_options={"include_usage": True},
    ):
        usage = chunk.usage or usage
        state.handle_chunk(chunk)
    final = state.current_completion_snapshot.choices[0]
    expected = from_message(recorded("tool_use_response.txt"))["choices"][0]
    assert final.finish_reason == expected["finish_reason"]
    assert final.message.content == expected["message"]["content"]
    (call,) = final.message.tool_calls or []
    (wanted,) = expected["message"]["tool_calls"]
    assert call.id == wanted["id"]
    assert orjson.loads(call.function.arguments) == orjson.loads(wanted["function"]["arguments"])
    assert usage is not None
    assert usage.prompt_tokens == 377
    assert upstream.received[0].json()["stream"] is True


def test_an_anthropic_error_keeps_its_status_in_an_openai_envelope(
    client: openai.OpenAI, upstream: MockUpstream
) -> None:
    upstream.push(
        JSONReply(
            {"type": "error", "error": {"type": "rate_limit_error", "message": "Slow down."}},
            status=429,
        )
    )
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model="claude-sonnet-4", messages=MESSAGES)
    assert caught.value.status_code == 429
    assert "Slow down." in str(caught.value)
    assert len(upstream.received) == 1  # neither the SDK nor the gateway retried
