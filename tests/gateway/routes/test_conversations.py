"""The conversation record through the gateway: rewrites that depend on later messages
(here the media window) wait while the provider's cache is warm, so the upstream sees a
stable prefix; a new conversation, or a provider reporting cache misses, moves at once."""

from __future__ import annotations

from typing import Any

import openai
import orjson
import pytest

from tests.harness import GatewayServer
from tests.mock_upstream import JSONReply, MockUpstream, SSEReply, chat_completion
from tests.openai_schema import assert_valid_request
from tests.pipelines.stages.test_media import screenshots


def without_tool_images(body: dict[str, Any]) -> dict[str, Any]:
    messages = [
        {**m, "content": "(image)"} if m["role"] == "tool" and isinstance(m["content"], list) else m
        for m in body["messages"]
    ]
    return {**body, "messages": messages}


def images_sent(upstream: MockUpstream) -> int:
    body = upstream.received[-1].json()
    # screenshots in tool results are not OpenAI input; every other part must be
    assert_valid_request(without_tool_images(body))
    return orjson.dumps(body["messages"]).count(b'"type":"image_url"')


def send(gateway: GatewayServer, count: int, conversation: str, **extra: Any) -> Any:
    with openai.OpenAI(base_url=gateway.base_url, api_key="sk-test", max_retries=0) as client:
        return client.chat.completions.create(
            model="gpt-4o",
            messages=screenshots(count),
            extra_headers={"x-contextgate-conversation": conversation},
            **extra,
        )


def test_warm_cache_defers_the_media_window_and_keeps_the_prefix(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    upstream.push(JSONReply(chat_completion()), JSONReply(chat_completion()))
    send(gateway, 4, "deploy-watch-1")
    assert images_sent(upstream) == 2  # new conversation: the window moves at once
    first = upstream.received[-1].json()["messages"]
    send(gateway, 5, "deploy-watch-1")
    assert images_sent(upstream) == 3  # warm: the third-newest waits for a batch
    assert upstream.received[-1].json()["messages"][: len(first)] == first

    upstream.push(JSONReply(chat_completion()))
    send(gateway, 5, "deploy-watch-2")  # another conversation is new, so cold
    assert images_sent(upstream) == 2


def test_reported_cache_misses_count_as_cold(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """A warm request whose streamed usage says nothing was read from the cache (on a
    large prompt) makes the next request cold, so the window moves. (The misses of a
    request that went out cold say nothing and are not counted.)"""
    usage = {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-4o",
        "choices": [],
        "usage": {
            "prompt_tokens": 9_000,
            "completion_tokens": 3,
            "total_tokens": 9_003,
            "prompt_tokens_details": {"cached_tokens": 0},
        },
    }
    text = dict(usage, choices=[{"index": 0, "delta": {"content": "ok"}, "finish_reason": None}])
    del text["usage"]
    events = [b"data: " + orjson.dumps(e) + b"\n\n" for e in (text, usage)] + [b"data: [DONE]\n\n"]
    upstream.push(JSONReply(chat_completion()), SSEReply(events), JSONReply(chat_completion()))
    send(gateway, 4, "deploy-watch-3")  # new: cold
    with openai.OpenAI(base_url=gateway.base_url, api_key="sk-test", max_retries=0) as client:
        stream = client.chat.completions.create(
            model="gpt-4o",
            messages=screenshots(5),  # type: ignore[arg-type]
            extra_headers={"x-contextgate-conversation": "deploy-watch-3"},
            stream=True,
            stream_options={"include_usage": True},
        )
        assert [c.usage.prompt_tokens for c in stream if c.usage] == [9_000]
    assert images_sent(upstream) == 3  # warm: deferred
    send(gateway, 6, "deploy-watch-3")
    assert images_sent(upstream) == 2  # the provider said it cached nothing: cold


def test_a_malformed_conversation_id_is_400(gateway: GatewayServer, upstream: MockUpstream) -> None:
    client = openai.OpenAI(base_url=gateway.base_url, api_key="sk-test", max_retries=0)
    with client, pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="gpt-4o",
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"x-contextgate-conversation": "two words"},
        )
    assert caught.value.code == "invalid_conversation_id"
    assert "x-contextgate-conversation" in caught.value.message
    assert upstream.received == []
