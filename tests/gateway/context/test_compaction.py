"""A client's request compacted (``gateway.context.compaction``). The restore tool as part
of the compacted request: budgeted, and its arrival a predicted cache break. The
conversation record through the gateway: rewrites that depend on later messages (here the
media window) wait while the provider's cache is warm, so the upstream sees a stable
prefix; a new conversation, or a provider reporting cache misses, moves at once."""

from __future__ import annotations

import json
from typing import Any

import openai
import orjson
import pytest

from pipelines import TokenCounter
from tests.harness import GatewayServer
from tests.mock_upstream import JSONReply, MockUpstream, SSEReply, chat_completion
from tests.openai_schema import assert_valid_request
from tests.pipelines.stages.test_media import screenshots

RULES = " ".join(f"rule{i} applies to booking" for i in range(6_000))


def lookup(system_words: int) -> list[dict[str, Any]]:
    """A system prompt of ``system_words`` words and one tool call whose output the filter
    offloads (it is over ``filter-tokens=500``)."""
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_reservation", "arguments": '{"id": "ABC123"}'},
    }
    flights = [{"flight": f"HAT{i:03d}", "seat": f"{i}A", "price": i * 7} for i in range(300)]
    return [
        {"role": "system", "content": " ".join(RULES.split()[:system_words])},
        {"role": "user", "content": "Look up reservation ABC123 please."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": json.dumps(flights)},
    ]


def client(gateway: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key="sk-test-key", max_retries=0)


def ask_tight(
    sdk: openai.OpenAI, upstream: MockUpstream, words: int, conversation: str
) -> tuple[Any, dict[str, Any], int]:
    """``lookup(words)`` sent at max-input 8,000 with its tool output over filter-tokens:
    the answer, the body the upstream received and that body's tokens."""
    upstream.received.clear()
    answer = sdk.chat.completions.with_raw_response.create(
        model="gpt-4o",
        messages=lookup(words),  # type: ignore[arg-type]
        extra_headers={
            "x-contextgate-policy": "max-input=8000, filter-tokens=500",
            "x-contextgate-conversation": conversation,
        },
    )
    sent = upstream.received[-1].json()
    counter = TokenCounter()
    return (
        answer,
        sent,
        counter.count_messages(sent["messages"]) + counter.count_tools(sent.get("tools")),
    )


def test_the_restore_tool_is_within_the_budget(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """However close to max-input the compacted messages come, the request sent with the
    restore tool fits it: the tool's tokens are counted with the rest."""
    sdk = client(gateway)
    for words in range(5_420, 5_800, 30):
        answer, sent, carried = ask_tight(sdk, upstream, words, f"budget-{words}")
        assert [t["function"]["name"] for t in sent["tools"]] == ["context_restore"]
        assert carried <= 8_000, words
        assert f"after={carried}" in answer.headers["x-contextgate-tokens"]


def test_the_restore_tool_arriving_is_a_predicted_cache_break(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """The request on which the restore tool first joins the tools says that it breaks the
    cached prefix, and why; the next one, carrying the same tools, breaks nothing."""
    sdk = client(gateway)
    messages = lookup(50)
    small = [*messages[:3], {**messages[3], "content": '{"flight": "HAT001"}'}]
    big = [*small, {"role": "user", "content": "And the full list?"}, *messages[2:]]
    breaks = []
    for history in (small, big, [*big, {"role": "user", "content": "Thanks."}]):
        answer = sdk.chat.completions.with_raw_response.create(
            model="gpt-4o",
            messages=history,  # type: ignore[arg-type]
            extra_headers={
                "x-contextgate-policy": "filter-tokens=500",
                "x-contextgate-conversation": "tool-arrives",
            },
        )
        breaks.append(answer.headers.get("x-contextgate-cache-break"))
    sent = [r.json() for r in upstream.received]
    assert "tools" not in sent[0]
    assert [t["function"]["name"] for t in sent[1]["tools"]] == ["context_restore"]
    assert sent[2]["tools"] == sent[1]["tools"]
    assert breaks == [None, "tools", None]


def test_a_request_that_fits_only_without_the_restore_tool_goes_without_it(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """When the system prompt leaves room for the compacted messages but not for the
    restore tool too, the request is sent without the tool, within its budget, instead of
    being refused."""
    sdk = client(gateway)
    without = 0
    for words in range(5_820, 5_950, 40):
        answer, sent, carried = ask_tight(sdk, upstream, words, f"no-room-{words}")
        assert answer.http_response.status_code == 200
        assert carried <= 8_000, words
        without += "tools" not in sent
    assert without >= 3


WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
}


def test_a_conversation_with_tools_has_the_restore_tool_from_its_first_request(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """An agent's conversation (it brings tools) carries the restore tool from its first
    request on, before anything is offloaded, so the tools the provider caches first never
    change and offloading later breaks no cached prefix."""
    sdk = client(gateway)
    messages = lookup(50)
    small = [*messages[:3], {**messages[3], "content": '{"flight": "HAT001"}'}]
    big = [*small, {"role": "user", "content": "And the full list?"}, *messages[2:]]
    breaks = []
    for history in (small, big):
        answer = sdk.chat.completions.with_raw_response.create(
            model="gpt-4o",
            messages=history,  # type: ignore[arg-type]
            tools=[WEATHER],  # type: ignore[list-item]
            extra_headers={
                "x-contextgate-policy": "filter-tokens=500",
                "x-contextgate-conversation": "tools-from-start",
            },
        )
        breaks.append(answer.headers.get("x-contextgate-cache-break"))
    first, second = (r.json() for r in upstream.received)
    assert [t["function"]["name"] for t in first["tools"]] == ["get_weather", "context_restore"]
    assert second["tools"] == first["tools"]
    assert "ctx_" in json.dumps(second["messages"])
    assert breaks == [None, None]


def test_sessions_that_open_alike_are_told_apart_by_the_agents_session_id(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """Two Claude Code sessions opening with the same system prompt and first message are
    two conversations, told apart by the session id the agent sends (each gets its own
    prompt_cache_key, and its own record); one session's requests stay one conversation."""
    sdk = client(gateway)
    opening = lookup(2_000)[:2]
    for session in ("s-one", "s-two", "s-one"):
        sdk.chat.completions.create(
            model="gpt-4o",
            messages=opening,  # type: ignore[arg-type]
            extra_headers={"x-claude-code-session-id": session},
        )
    keys = [r.json()["prompt_cache_key"] for r in upstream.received]
    assert keys[0] == keys[2]
    assert keys[0] != keys[1]


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
