"""``POST /v1/messages``: the official anthropic SDK as the client, the mock upstream
speaking the Messages API for ``claude-*`` models (Anthropic's own bytes come back) and
OpenAI chat for the others (answers translated), the pipeline in between."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import orjson
import pytest

from bench.compaction import requests_of
from gateway.codecs.chat_anthropic import to_messages
from gateway.codecs.messages_openai import message_of
from gateway.config import AnthropicSettings, Settings, UpstreamSettings
from gateway.context.restore import RESTORE_TOOL_NAME
from pipelines import TokenCounter
from pipelines.cache_break import without_markers
from tests.gateway.codecs.chat_anthropic.samples import STREAMS, TRACES, events_of
from tests.gateway.codecs.messages.samples import CLAUDE_CODE_TOOLS
from tests.harness import GatewayServer
from tests.in_process import in_process
from tests.mock_upstream import (
    JSONReply,
    MockUpstream,
    Received,
    Reply,
    SSEReply,
    chat_completion,
    recorded_stream,
    recorded_streams,
)
from tests.mock_upstream import events_of as events_of_chunks

WEATHER = {
    "name": "get_weather",
    "description": "The weather now.",
    "input_schema": {"type": "object", "properties": {"location": {"type": "string"}}},
}
MESSAGES: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
ANSWER: dict[str, Any] = {
    "id": "msg_01",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-6",
    "content": [{"type": "text", "text": "Sunny, 24 degrees."}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 20, "output_tokens": 6},
}
PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5E"
    "rkJggg=="
)
REF = re.compile(r"ctx_[A-Za-z0-9_-]{22,}")


@pytest.fixture
def gateway(anthropic_gateway: GatewayServer) -> GatewayServer:
    return anthropic_gateway


@pytest.fixture
def client(gateway: GatewayServer) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=gateway.url, api_key="sk-ant-mine", max_retries=0) as sdk:
        yield sdk


@pytest.fixture
def http(gateway: GatewayServer) -> Iterator[httpx.Client]:
    """One HTTP client for a test's hundreds of requests, as a client in a session has: a
    client made per request loads the CA bundle each time (20-30 ms)."""
    with httpx.Client(base_url=gateway.url, timeout=30) as session:
        yield session


def direct(upstream: MockUpstream) -> anthropic.Anthropic:
    """The SDK pointed at the mock itself: what a client gets without the gateway."""
    return anthropic.Anthropic(
        base_url=upstream.base_url.removesuffix("/v1"), api_key="sk-ant-mine", max_retries=0
    )


def test_a_claude_request_goes_to_anthropic_as_the_client_wrote_it(
    client: anthropic.Anthropic, upstream: MockUpstream
) -> None:
    """Tools, an image, thinking settings and fields the gateway does not know reach
    Anthropic unchanged, and Anthropic's answer reaches the client unchanged."""
    upstream.push(JSONReply(ANSWER))
    messages: list[Any] = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in this picture?"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": PNG},
                },
            ],
        }
    ]
    message = client.messages.create(
        model="claude-sonnet-4-6",
        max_tokens=2_000,
        system="You describe pictures.",
        messages=messages,
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
        thinking={"type": "enabled", "budget_tokens": 1_024},
        metadata={"user_id": "u-42"},
        extra_body={"service_tier": "auto", "top_k": 5},
    )
    assert message.model_dump(
        mode="json", exclude_none=True
    ) == anthropic.types.Message.model_validate(ANSWER).model_dump(mode="json", exclude_none=True)
    (sent,) = upstream.received
    assert sent.path == "/v1/messages"
    body = sent.json()
    assert without_markers(body["messages"][0]["content"][1]) == messages[0]["content"][1]
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 1_024}
    assert body["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    assert (body["metadata"], body["top_k"], body["service_tier"]) == (
        {"user_id": "u-42"},
        5,
        "auto",
    )
    assert body["tools"][0]["input_schema"] == WEATHER["input_schema"]
    assert body["max_tokens"] == 2_000


def test_the_clients_headers_reach_anthropic(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """Claude Code's identifying headers (``x-app``, its session id, its user agent) and any
    other header of the client reach Anthropic; the key is the one the gateway chose, and
    the headers describing the HTTP client are those of the gateway's own SDK."""
    upstream.push(JSONReply(ANSWER))
    client_headers = {
        "x-app": "cli",
        "X-Claude-Code-Session-Id": "c99fefc7-60b6",
        "User-Agent": "claude-cli/2.1.332 (external, sdk-cli)",
        "anthropic-beta": "claude-code-20250219,context-management-2025-06-27",
        "x-stainless-retry-count": "5",
        "x-team": "blue",
    }
    with anthropic.Anthropic(
        base_url=gateway.url, api_key="sk-ant-mine", max_retries=0, default_headers=client_headers
    ) as sdk:
        sdk.messages.create(model="claude-sonnet-4-6", max_tokens=100, messages=MESSAGES)
    (sent,) = upstream.received
    assert sent.headers["x-app"] == "cli"
    assert sent.headers["x-claude-code-session-id"] == "c99fefc7-60b6"
    assert sent.headers["user-agent"] == "claude-cli/2.1.332 (external, sdk-cli)"
    assert sent.headers["anthropic-beta"] == client_headers["anthropic-beta"]
    assert sent.headers["x-team"] == "blue"
    assert sent.headers["x-stainless-retry-count"] == "0"
    assert sent.headers["authorization"] == "Bearer sk-ant-mine"
    assert "x-api-key" not in sent.headers


RECORDED = sorted(path.name for path in STREAMS.glob("*.txt"))


@pytest.mark.parametrize("name", RECORDED)
def test_a_recorded_stream_reaches_the_anthropic_client_as_anthropic_sent_it(
    client: anthropic.Anthropic, upstream: MockUpstream, name: str
) -> None:
    """Through the gateway the SDK ends with the same message, tool calls and usage as
    when it reads the recording straight from the mock."""
    upstream.push(SSEReply(events_of(name)))
    with direct(upstream).messages.stream(
        model="claude-sonnet-4-6", max_tokens=100, messages=MESSAGES
    ) as stream:
        expected = stream.get_final_message()
    upstream.push(SSEReply(events_of(name)))
    with client.messages.stream(
        model="claude-sonnet-4-6",
        max_tokens=100,
        messages=MESSAGES,
        tools=[WEATHER],  # type: ignore[list-item]
    ) as stream:
        got = stream.get_final_message()
    # Block types this SDK has no class for (compaction, fallback) are kept as they came;
    # pydantic warns when it dumps them.
    assert got.model_dump(mode="json", warnings=False) == expected.model_dump(
        mode="json", warnings=False
    )


def test_a_streamed_answer_is_relayed_byte_for_byte(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """With nothing to restore, the client gets exactly the events Anthropic sent."""
    events = events_of("tool_use_response.txt")
    upstream.push(SSEReply(events))
    response = httpx.post(
        f"{gateway.url}/v1/messages",
        json={"model": "claude-sonnet-4-6", "max_tokens": 50, "messages": MESSAGES, "stream": True},
        headers={"x-api-key": "sk-ant-mine", "anthropic-version": "2023-06-01"},
        timeout=30,
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.content == b"".join(events)
    assert "x-contextgate-tokens" in response.headers


def openai_answer(received: Received) -> Reply:
    completion = chat_completion("It is sunny in Paris.", model=received.json()["model"])
    completion["usage"] = {
        "prompt_tokens": 120,
        "completion_tokens": 7,
        "total_tokens": 127,
        "prompt_tokens_details": {"cached_tokens": 64},
    }
    return JSONReply(completion)


def test_another_model_is_answered_through_the_openai_upstream(
    client: anthropic.Anthropic, upstream: MockUpstream
) -> None:
    """A Messages client can use a non-Claude model: the request goes out as chat
    completions (nothing Anthropic-only in it) and the answer comes back as a message."""
    upstream.handler = openai_answer
    message = client.messages.create(
        model="gpt-4o",
        max_tokens=300,
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=MESSAGES,
        tools=[WEATHER],  # type: ignore[list-item]
    )
    assert message.content[0].type == "text"
    assert message.content[0].text == "It is sunny in Paris."
    assert message.stop_reason == "end_turn"
    assert (message.usage.input_tokens, message.usage.cache_read_input_tokens) == (56, 64)
    assert message.usage.output_tokens == 7
    (sent,) = upstream.received
    assert sent.path == "/v1/chat/completions"
    body = sent.json()
    assert b"cache_control" not in sent.body
    assert body["messages"][0] == {
        "role": "system",
        "content": [{"type": "text", "text": "Be brief."}],
    }
    assert body["tools"][0]["function"]["name"] == "get_weather"
    assert body["max_tokens"] == 300


@pytest.mark.parametrize("stream", [False, True])
def test_an_upstream_that_repeats_its_ids_still_gives_each_answer_its_own(
    gateway: GatewayServer, upstream: MockUpstream, stream: bool
) -> None:
    """An OpenAI-compatible upstream that gives every answer the same id (or none): each
    Messages answer of the conversation gets an id of its own (a client such as Claude
    Code keys its turns by it); an id seen the first time is kept."""
    ids = iter(["chatcmpl-same", "chatcmpl-same", "", "chatcmpl-new"])

    def answer(received: Received) -> Reply:
        completion = chat_completion("Sunny.", model="gpt-4o") | {"id": next(ids)}
        if received.json().get("stream"):
            chunk = {**completion, "object": "chat.completion.chunk", "usage": None}
            chunk["choices"] = [
                {"index": 0, "delta": {"content": "Sunny."}, "finish_reason": "stop"}
            ]
            usage = {**chunk, "choices": [], "usage": completion["usage"]}
            return SSEReply(events_of_chunks([chunk, usage]))
        return JSONReply(completion)

    upstream.handler = answer
    headers = {"x-contextgate-conversation": f"repeating-{stream}"}
    with anthropic.Anthropic(
        base_url=gateway.url, api_key="sk-mine", max_retries=0, default_headers=headers
    ) as sdk:
        got = []
        for _ in range(4):
            if stream:
                with sdk.messages.stream(model="gpt-4o", max_tokens=50, messages=MESSAGES) as s:
                    got.append(s.get_final_message().id)
            else:
                got.append(sdk.messages.create(model="gpt-4o", max_tokens=50, messages=MESSAGES).id)
    assert got[0] == "chatcmpl-same"
    assert got[3] == "chatcmpl-new"
    assert got[1].startswith("msg_")
    assert got[2].startswith("msg_")
    assert len(set(got)) == 4


@pytest.mark.parametrize("name", recorded_streams())
def test_an_openai_stream_reaches_the_anthropic_client_as_messages_events(
    client: anthropic.Anthropic, upstream: MockUpstream, name: str
) -> None:
    """Each recorded OpenAI stream, translated event by event, ends in the SDK as the
    message its whole completion translates to."""
    from openai.lib.streaming.chat import ChatCompletionStreamState
    from openai.types.chat import ChatCompletionChunk

    events = recorded_stream(name)
    state: ChatCompletionStreamState[None] = ChatCompletionStreamState()
    usage = None
    for event in events:
        data = event.removeprefix(b"data: ").strip()
        if data == b"[DONE]":
            continue
        chunk = ChatCompletionChunk.model_validate(orjson.loads(data))
        usage = chunk.usage or usage
        if chunk.choices:
            state.handle_chunk(chunk)
    completion = state.current_completion_snapshot.model_dump(mode="json", exclude_none=True)
    if usage is not None:
        completion["usage"] = usage.model_dump(mode="json", exclude_none=True)
    expected = message_of(completion)
    upstream.push(SSEReply(events))
    with client.messages.stream(model="gpt-4o", max_tokens=300, messages=MESSAGES) as stream:
        got = stream.get_final_message().model_dump(mode="json", exclude_none=True)
    assert got["content"] == expected["content"]
    assert got["stop_reason"] == expected["stop_reason"]
    if usage is not None:
        assert got["usage"]["output_tokens"] == expected["usage"]["output_tokens"]
    assert upstream.received[0].json()["stream_options"] == {"include_usage": True}


def test_gateway_errors_use_the_anthropic_envelope(gateway: GatewayServer) -> None:
    """Malformed JSON, a missing field and an oversized turn are 400s in Anthropic's
    envelope, which the SDK raises as BadRequestError."""
    url = f"{gateway.url}/v1/messages"
    bad = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"})
    assert bad.status_code == 400
    assert bad.json()["type"] == "error"
    assert bad.json()["error"]["type"] == "invalid_request_error"
    missing = httpx.post(url, json={"model": "claude-sonnet-4-6", "messages": MESSAGES})
    assert missing.status_code == 400
    assert "max_tokens" in missing.json()["error"]["message"]
    sdk = anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as caught:
        sdk.messages.create(
            model="claude-sonnet-4-6",
            max_tokens=10,
            messages=[{"role": "user", "content": "word " * 130_000}],
        )
    assert "120,000" in caught.value.message or "120000" in caught.value.message
    assert caught.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]


def test_an_oversized_body_is_a_413_in_the_anthropic_envelope(upstream: MockUpstream) -> None:
    settings = Settings(
        upstream=UpstreamSettings(base_url=upstream.base_url),
        anthropic=AnthropicSettings(base_url=upstream.base_url.removesuffix("/v1")),
        max_body_bytes=10_000,
        summaries=False,
    )
    with GatewayServer(settings) as server:
        response = httpx.post(
            f"{server.url}/v1/messages",
            json={
                "model": "claude-sonnet-4-6",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x" * 20_000}],
            },
        )
    assert response.status_code == 413
    assert response.json()["error"]["type"] == "request_too_large"
    assert upstream.received == []


def test_anthropic_errors_are_relayed_as_they_came(
    client: anthropic.Anthropic, upstream: MockUpstream
) -> None:
    """Status, body and retry-after of an Anthropic error reach the client untouched."""
    error = {"type": "error", "error": {"type": "rate_limit_error", "message": "Slow down."}}
    upstream.push(JSONReply(error, status=429, headers={"retry-after": "7"}))
    with pytest.raises(anthropic.RateLimitError) as caught:
        client.messages.create(model="claude-sonnet-4-6", max_tokens=5, messages=MESSAGES)
    assert caught.value.response.headers["retry-after"] == "7"
    assert caught.value.body == error
    assert len(upstream.received) == 1


def test_an_openai_upstream_error_is_rewrapped_with_its_status(
    client: anthropic.Anthropic, upstream: MockUpstream
) -> None:
    error = {"error": {"message": "Rate limit reached.", "type": "requests", "code": "rate_limit"}}
    upstream.push(JSONReply(error, status=429, headers={"retry-after": "3"}))
    with pytest.raises(anthropic.RateLimitError) as caught:
        client.messages.create(model="gpt-4o", max_tokens=5, messages=MESSAGES)
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "Rate limit reached."},
    }
    assert caught.value.response.headers["retry-after"] == "3"


def test_an_error_event_before_any_content_gets_its_real_status(
    client: anthropic.Anthropic, upstream: MockUpstream
) -> None:
    """An overloaded Anthropic that opens a stream with an error event is a 529 for the
    client, not a 200 stream (so its SDK can retry)."""
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    upstream.push(SSEReply([b"event: error\ndata: " + orjson.dumps(overloaded) + b"\n\n"]))
    stream = client.messages.stream(model="claude-sonnet-4-6", max_tokens=5, messages=MESSAGES)
    with pytest.raises(anthropic.APIStatusError) as caught, stream as events:
        events.get_final_message()
    assert caught.value.status_code == 529
    assert caught.value.body == overloaded


def test_a_stream_broken_off_ends_with_one_anthropic_error_event(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    upstream.push(SSEReply(events_of("tool_use_response.txt")[:6], ending="drop"))
    response = httpx.post(
        f"{gateway.url}/v1/messages",
        json={"model": "claude-sonnet-4-6", "max_tokens": 50, "messages": MESSAGES, "stream": True},
        timeout=30,
    )
    events = [e for e in response.text.split("\n\n") if e.strip()]
    assert events[:-1] == [e.decode().strip() for e in events_of("tool_use_response.txt")[:6]]
    assert events[-1].startswith("event: error\ndata: ")
    error = orjson.loads(events[-1].split("data: ", 1)[1])
    assert error["type"] == "error"
    assert error["error"]["type"] == "api_error"


def big_tool_history() -> list[Any]:
    """A conversation whose tool output is far over the filter limit (5,000 tokens)."""
    rows = "\n".join(
        orjson.dumps({"flight": f"HAT{n:03d}", "seats": n % 7, "price": 100 + n}).decode()
        for n in range(900)
    )
    return [
        {"role": "user", "content": "Which flights have seats?"},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {"q": "seats"}}
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": rows},
                {"type": "text", "text": "What does HAT042 cost?"},
            ],
        },
    ]


def restoring(received: Received) -> Reply:
    """The model: first asks to restore the ref it sees, then answers from what came back."""
    body = received.json()
    last = body["messages"][-1]
    results = [b for b in last["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]
    if results and results[-1]["tool_use_id"] == "toolu_r1":
        restored = results[-1]["content"]
        text = restored if isinstance(restored, str) else restored[0]["text"]
        found = "142" if '"HAT042","seats":0,"price":142' in text else "unknown"
        return JSONReply({**ANSWER, "content": [{"type": "text", "text": f"It costs {found}."}]})
    ref = REF.search(received.body.decode())
    assert ref is not None
    call = {
        "type": "tool_use",
        "id": "toolu_r1",
        "name": "context_restore",
        "input": {"ref": ref.group()},
    }
    return JSONReply(
        {
            **ANSWER,
            "content": [{"type": "text", "text": "Let me look."}, call],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 900, "output_tokens": 20},
        }
    )


def test_a_restore_call_is_answered_by_the_gateway(
    client: anthropic.Anthropic, upstream: MockUpstream
) -> None:
    """The big tool output goes out as a preview with a ref and the restore tool; the
    model's restore call is answered with the stored content and the client only sees the
    answer (the text of both rounds, as streamed), with the usage of both rounds."""
    upstream.handler = restoring
    message = client.messages.create(
        model="claude-sonnet-4-6", max_tokens=100, messages=big_tool_history()
    )
    assert [b.type for b in message.content] == ["text", "text"]
    assert "".join(b.text for b in message.content) == "Let me look.It costs 142."  # type: ignore[union-attr]
    assert message.usage.input_tokens == 920
    first, second = upstream.received
    sent = first.json()
    assert any(t.get("name") == "context_restore" for t in sent["tools"])
    assert len(first.body) < 20_000  # the 900 rows stayed in the store
    assert b'"HAT042"' not in first.body
    assert second.json()["messages"][-2]["content"][-1]["name"] == "context_restore"


def test_a_streamed_restore_call_is_answered_in_place(
    client: anthropic.Anthropic, upstream: MockUpstream
) -> None:
    """Streamed, the restore round is invisible: one message, block indices without a gap,
    the model's text before the call kept."""

    def as_stream(received: Received) -> Reply:
        reply = restoring(received)
        assert isinstance(reply, JSONReply)
        return SSEReply(message_events(reply.body))

    upstream.handler = as_stream
    with client.messages.stream(
        model="claude-sonnet-4-6", max_tokens=100, messages=big_tool_history()
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["text", "text"]
    assert "".join(b.text for b in final.content) == "Let me look.It costs 142."  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn"
    assert kinds.count("message_start") == 1
    assert final.usage.input_tokens == 920
    assert len(upstream.received) == 2


def message_events(message: dict[str, Any]) -> list[bytes]:
    """A whole Messages answer as the stream Anthropic would send for it."""

    def event(data: dict[str, Any]) -> bytes:
        return f"event: {data['type']}\ndata: ".encode() + orjson.dumps(data) + b"\n\n"

    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    out = [event({"type": "message_start", "message": start})]
    for index, block in enumerate(message["content"]):
        if block["type"] == "thinking":
            empty = {"type": "thinking", "thinking": "", "signature": ""}
            out.append(
                event({"type": "content_block_start", "index": index, "content_block": empty})
            )
            for delta in (
                {"type": "thinking_delta", "thinking": block["thinking"]},
                {"type": "signature_delta", "signature": block["signature"]},
            ):
                out.append(event({"type": "content_block_delta", "index": index, "delta": delta}))
        elif block["type"] == "text":
            out.append(
                event(
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {"type": "text", "text": ""},
                    }
                )
            )
            out.append(
                event(
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "text_delta", "text": block["text"]},
                    }
                )
            )
        else:
            empty = {**block, "input": {}}
            out.append(
                event({"type": "content_block_start", "index": index, "content_block": empty})
            )
            arguments = orjson.dumps(block["input"]).decode()
            out.append(
                event(
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": arguments},
                    }
                )
            )
        out.append(event({"type": "content_block_stop", "index": index}))
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    out.append(
        event(
            {
                "type": "message_delta",
                "delta": delta,
                "usage": {"output_tokens": usage["output_tokens"]},
            }
        )
    )
    out.append(event({"type": "message_stop"}))
    return out


def test_count_tokens_counts_what_the_gateway_would_send(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """For Claude, Anthropic counts the compacted request (no max_tokens, no big tool
    output); for other models the gateway counts it itself."""
    upstream.push(JSONReply({"input_tokens": 2_345}))
    with anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0) as sdk:
        counted = sdk.messages.count_tokens(model="claude-sonnet-4-6", messages=big_tool_history())
        assert counted.input_tokens == 2_345
        (sent,) = upstream.received
        assert sent.path == "/v1/messages/count_tokens"
        assert "max_tokens" not in sent.json()
        assert len(sent.body) < 20_000
        ours = sdk.messages.count_tokens(model="gpt-4o", messages=big_tool_history())
    assert 500 < ours.input_tokens < 5_000
    assert len(upstream.received) == 1


def client_marked(history: list[dict[str, Any]]) -> dict[str, Any]:
    """The Messages request a client with markers of its own sends for an OpenAI-form
    ``history``: a 1-hour marker on its system prompt and 5-minute ones on its first two
    user turns (three of the four the API allows)."""
    request = to_messages(
        {"model": "claude-sonnet-4-6", "messages": history}, default_max_tokens=1_024
    )
    request["system"][-1]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    users = [turn for turn in request["messages"] if turn["role"] == "user"]
    for turn in users[:2]:
        turn["content"][-1]["cache_control"] = {"type": "ephemeral"}
    return request


def marked_blocks(request: dict[str, Any]) -> list[tuple[str, Any]]:
    """Every block of a Messages request that carries a marker, with the marker."""
    blocks = [*request.get("tools", ()), *request.get("system", ())]
    blocks += [block for turn in request["messages"] for block in turn["content"]]
    return [
        (
            orjson.dumps({k: v for k, v in b.items() if k != "cache_control"}).decode(),
            b["cache_control"],
        )
        for b in blocks
        if "cache_control" in b
    ]


def test_replayed_sessions_read_their_prompt_from_the_cache(
    http: httpx.Client, upstream: MockUpstream
) -> None:
    """tau-bench sessions through /v1/messages to a mock that bills like Anthropic's prompt
    cache: with the gateway's markers most of the prompt is read from the cache, with
    ``cache-markers=?0`` none of it; no request ever carries more than 4 markers."""
    from bench.prompt_cache import PrefixCache

    cache = PrefixCache(TokenCounter("o200k_base"))
    clock = [1_000.0]

    def bill(received: Received) -> Reply:
        request = received.json()
        assert len(marked_blocks(request)) <= 4
        usage = cache.usage(request, clock[0])
        return JSONReply({**ANSWER, "usage": {**usage, "output_tokens": 2}})

    upstream.handler = bill
    shares = {}
    for policy in ("", "cache-markers=?0"):
        read = total = 0
        for number, trajectory in enumerate(tau_bench()[:12]):
            for history in requests_of(trajectory):
                clock[0] += 5
                request = to_messages({"model": "claude-sonnet-4-6", "messages": history})
                response = http.post(
                    "/v1/messages",
                    json=request,
                    headers={
                        "x-contextgate-policy": policy,
                        "x-contextgate-conversation": f"replay-{policy[:5]}-{number}",
                    },
                )
                usage = response.json()["usage"]
                read += usage["cache_read_input_tokens"]
                total += read_total(usage)
        shares[policy] = read / total
    assert shares[""] > 0.8
    assert shares["cache-markers=?0"] == 0


def read_total(usage: dict[str, int]) -> int:
    return (
        usage["input_tokens"]
        + usage["cache_read_input_tokens"]
        + usage["cache_creation_input_tokens"]
    )


def tau_bench() -> list[list[dict[str, Any]]]:
    return [t["traj"] for t in orjson.loads(TRACES.read_bytes())]


def test_a_clients_own_markers_stay_and_the_total_stays_within_four(
    http: httpx.Client, upstream: MockUpstream
) -> None:
    """A client that marks its system prompt (1 hour) and its first two user turns keeps
    exactly those markers on exactly those blocks; the gateway adds at most one more, on
    the newest message (the rolling one), and never one before the 1-hour marker."""
    upstream.handler = lambda received: JSONReply(ANSWER)
    added = 0
    for trajectory in tau_bench()[:15]:
        for history in requests_of(trajectory):
            upstream.received.clear()
            request = client_marked(history)
            response = http.post("/v1/messages", json=request)
            assert response.status_code == 200
            sent = upstream.received[0].json()
            ours, theirs = marked_blocks(request), marked_blocks(sent)
            assert len(theirs) <= 4
            assert all(marker in theirs for marker in ours)
            assert theirs[0] == ours[0]  # nothing before the client's 1-hour marker
            extra = [m for m in theirs if m not in ours]
            added += len(extra)
            assert len(extra) <= 1
            last = sent["messages"][-1]["content"][-1]
            assert all(
                m[0] == marked_blocks({"messages": [{"content": [last]}]})[0][0] for m in extra
            )
    assert added > 20


@pytest.mark.parametrize(
    ("model", "older_kept"), [("claude-haiku-4-5", False), ("claude-sonnet-4-6", True)]
)
def test_thinking_blocks_go_back_to_anthropic_with_their_signatures(
    client: anthropic.Anthropic, upstream: MockUpstream, model: str, older_kept: bool
) -> None:
    """In a tool loop the current turn's thinking blocks reach Anthropic exactly as the
    client sent them (signature and redacted data included); an older turn's are dropped
    for a model that would ignore them, and kept for one that keeps earlier thinking
    (Claude 4.6)."""
    thinking = {"type": "thinking", "thinking": "Paris first.", "signature": "c2lnbmF0dXJl"}
    redacted = {"type": "redacted_thinking", "data": "ZW5jcnlwdGVk"}
    call = {
        "type": "tool_use",
        "id": "toolu_2",
        "name": "get_weather",
        "input": {"location": "Paris"},
    }
    old = {"type": "thinking", "thinking": "Greet.", "signature": "b2xk"}
    messages: list[Any] = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [old, {"type": "text", "text": "Hello."}]},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [thinking, redacted, call]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_2", "content": "Sunny"}],
        },
    ]
    upstream.push(JSONReply(ANSWER))
    client.messages.create(
        model=model,
        max_tokens=2_000,
        messages=messages,
        tools=[WEATHER],  # type: ignore[list-item]
        thinking={"type": "enabled", "budget_tokens": 1_024},
    )
    sent = upstream.received[0].json()["messages"]
    assert [{k: v for k, v in b.items() if k != "cache_control"} for b in sent[3]["content"]] == [
        thinking,
        redacted,
        call,
    ]
    older = [old] if older_kept else []
    assert sent[1]["content"] == [*older, {"type": "text", "text": "Hello."}]
    assert sent[4]["content"][0]["tool_use_id"] == "toolu_2"


def test_thinking_sent_back_unchanged_is_no_action(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """A tool loop with the client's signed thinking, which goes up as it came: the answer
    reports no stage action (the thinking stage changes nothing on Claude's wire)."""
    thinking = {"type": "thinking", "thinking": "Check the weather.", "signature": "c2ln"}
    call = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"}
    upstream.push(JSONReply(ANSWER))
    response = httpx.post(
        f"{gateway.url}/v1/messages",
        json={
            "model": "claude-sonnet-4-6",
            "max_tokens": 2_000,
            "thinking": {"type": "enabled", "budget_tokens": 1_024},
            "messages": [
                *MESSAGES,
                {"role": "assistant", "content": [thinking, call]},
                {"role": "user", "content": [result]},
            ],
        },
        headers={"x-api-key": "sk-ant-mine", "anthropic-version": "2023-06-01"},
        timeout=30,
    )
    assert response.status_code == 200
    assert "thinking" not in response.headers["x-contextgate-actions"]
    sent = upstream.received[0].json()["messages"]
    assert sent[1]["content"][0] == thinking


def test_thinking_bound_to_its_prefix_is_dropped_not_refused_after_a_rewrite(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """To a model that binds thinking to its prefix (Claude Opus 5.5): a request that sends
    no thinking back goes as the client wrote it (no thinking setting added, even with
    forced tool use); one that sends thinking back after the gateway rewrote what precedes
    it (an offloaded tool output) asks the API to drop the blocks that no longer match,
    under the beta that allows it."""
    headers = {"x-api-key": "sk-ant-mine", "anthropic-version": "2023-06-01"}
    upstream.push(JSONReply(ANSWER), JSONReply(ANSWER))
    first = {
        "model": "claude-opus-5-5",
        "max_tokens": 1_000,
        "messages": MESSAGES,
        "tools": [WEATHER],
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "temperature": 0.2,
    }
    assert httpx.post(f"{gateway.url}/v1/messages", json=first, headers=headers).status_code == 200
    thinking = {"type": "thinking", "thinking": "", "signature": "c2ln"}
    call = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny " * 8_000}
    second = {
        "model": "claude-opus-5-5",
        "max_tokens": 1_000,
        "thinking": {"type": "adaptive", "display": "omitted"},
        "messages": [
            *MESSAGES,
            {"role": "assistant", "content": [thinking, call]},
            {"role": "user", "content": [result]},
        ],
        "tools": [WEATHER],
    }
    response = httpx.post(f"{gateway.url}/v1/messages", json=second, headers=headers)
    assert response.status_code == 200
    assert "filter" in response.headers["x-contextgate-actions"]
    plain, rewritten = upstream.received
    assert "thinking" not in plain.json()
    assert "anthropic-beta" not in plain.headers
    assert rewritten.json()["thinking"] == {
        "type": "adaptive",
        "display": "omitted",
        "block_binding": {"prefix_mismatch_behavior": "drop_block"},
    }
    assert rewritten.headers["anthropic-beta"] == "thinking-binding-controls-2026-08-01"


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("body", [b"<html>Bad gateway</html>", b"[1, 2]"])
def test_a_success_that_is_not_a_completion_is_a_502(
    client: anthropic.Anthropic, upstream: MockUpstream, body: bytes, stream: bool
) -> None:
    """An OpenAI-compatible upstream's 200 whose body is not a chat completion cannot be
    translated: the client gets a 502 in Anthropic's envelope that quotes it."""
    upstream.push(JSONReply(body))
    with pytest.raises(anthropic.APIStatusError) as caught:
        if stream:
            with client.messages.stream(model="gpt-4o", max_tokens=5, messages=MESSAGES) as events:
                events.get_final_message()
        else:
            client.messages.create(model="gpt-4o", max_tokens=5, messages=MESSAGES)
    assert caught.value.status_code == 502
    error = caught.value.body["error"]  # type: ignore[index]
    assert error["type"] == "api_error"
    assert body.decode() in error["message"]


def test_an_anthropic_clients_own_key_reaches_an_openai_compatible_upstream(
    upstream: MockUpstream,
) -> None:
    """Passthrough: the key a client presents as ``x-api-key`` (as Claude Code and
    Anthropic's SDKs do) goes to an OpenAI-compatible upstream as Authorization, on the
    client's request and on the summary calls made for its conversation."""
    from tests.scenarios.test_summaries import SummaryModel, turns

    model = SummaryModel()
    upstream.handler = model
    settings = Settings(upstream=UpstreamSettings(base_url=upstream.base_url), summaries=True)
    headers = {
        "x-api-key": "sk-callers-own",
        "anthropic-version": "2023-06-01",
        "x-contextgate-policy": "max-input=8000",
        "x-contextgate-conversation": "own-key",
    }
    with GatewayServer(settings) as gateway:
        for history in turns():
            request = to_messages({"model": "gpt-4o", "messages": history})
            response = httpx.post(
                f"{gateway.url}/v1/messages", json=request, headers=headers, timeout=30
            )
            assert response.status_code == 200
            if model.calls:
                break
    summaries = [r for r in upstream.received if b"response_format" in r.body]
    assert summaries
    assert upstream.received[0] not in summaries
    for received in upstream.received:
        assert received.headers["authorization"] == "Bearer sk-callers-own"
        assert "x-api-key" not in received.headers


@pytest.mark.parametrize("model", ["claude-sonnet-4-6", "gpt-4o"])
def test_count_tokens_counts_the_restore_tool(
    gateway: GatewayServer, upstream: MockUpstream, model: str
) -> None:
    """A conversation with offloaded content is sent with the restore tool, and
    count_tokens counts it too: Anthropic is asked about the very tools the request
    carries, and the gateway's own count is that of the request it sends, tool and all."""

    def answer(received: Any) -> JSONReply:
        if received.path.endswith("count_tokens"):
            return JSONReply({"input_tokens": 2_345})
        return JSONReply(ANSWER if model.startswith("claude") else chat_completion("Done."))

    upstream.handler = answer
    tool = {"name": "search", "input_schema": {"type": "object"}}
    headers = {"x-api-key": "k", "x-contextgate-conversation": f"counted-{model}"}
    request = {"model": model, "messages": big_tool_history(), "tools": [tool]}
    counted = httpx.post(
        f"{gateway.url}/v1/messages/count_tokens", json=request, headers=headers, timeout=30
    )
    assert counted.status_code == 200
    sent = httpx.post(
        f"{gateway.url}/v1/messages", json={**request, "max_tokens": 100}, headers=headers
    )
    assert sent.status_code == 200
    if model.startswith("claude"):
        asked, answered = (r.json() for r in upstream.received)
        assert [t["name"] for t in asked["tools"]] == ["search", "context_restore"]
        assert asked["tools"] == answered["tools"]
    else:  # counted by the gateway: only the request itself went upstream
        (answered,) = (r.json() for r in upstream.received)
        assert [t["function"]["name"] for t in answered["tools"]] == ["search", "context_restore"]
        counter = TokenCounter()
        carried = counter.count_messages(answered["messages"]) + counter.count_tools(
            answered["tools"]
        )
        assert counted.json()["input_tokens"] == carried


OVERFLOWS = {
    "claude-sonnet-4-6": (
        {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "input length and `max_tokens` exceed context limit: 178959 + 64000"
                " > 200000, decrease input length or `max_tokens` and try again",
            },
        },
        {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "prompt is too long: 210000 tokens > 200000 maximum",
            },
        },
    ),
    "gpt-4o": (
        {
            "error": {
                "message": "This model's maximum context length is 128000 tokens.",
                "type": "invalid_request_error",
                "code": "context_length_exceeded",
            }
        },
    ),
}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("model", "error"), [(model, error) for model, errors in OVERFLOWS.items() for error in errors]
)
def test_an_upstream_overflow_is_compacted_and_retried(
    client: anthropic.Anthropic,
    upstream: MockUpstream,
    model: str,
    error: dict[str, Any],
    stream: bool,
) -> None:
    """The window the upstream counts is smaller than the gateway thought: the request is
    compacted to half and sent again, and the client gets the answer."""
    if model.startswith("claude"):
        answer: Reply = SSEReply(message_events(ANSWER)) if stream else JSONReply(ANSWER)
    elif stream:
        chunk = {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": model,
            "choices": [{"index": 0, "delta": {"content": "Sunny, 24 degrees."}}],
        }
        answer = SSEReply([b"data: " + orjson.dumps(chunk) + b"\n\n", b"data: [DONE]\n\n"])
    else:
        answer = JSONReply(chat_completion("Sunny, 24 degrees."))
    upstream.push(JSONReply(error, status=400), answer)
    history: list[Any] = [
        {"role": "user", "content": f"Question {n}: " + "word " * 3_000} for n in range(12)
    ]
    history = [
        turn
        for n, question in enumerate(history)
        for turn in (question, {"role": "assistant", "content": f"Answer {n}."})
    ]
    history.append({"role": "user", "content": "And the weather?"})
    if stream:
        with client.messages.stream(model=model, max_tokens=100, messages=history) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(model=model, max_tokens=100, messages=history)
    assert message.content[0].text == "Sunny, 24 degrees."  # type: ignore[union-attr]
    first, second = upstream.received
    assert len(second.body) < len(first.body) * 0.6


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_a_tenants_gateway_key_never_goes_upstream(upstream: MockUpstream, path: str) -> None:
    """With tenants, a Messages client's gateway key (sent as x-api-key) goes nowhere:
    Anthropic gets the Anthropic key, the OpenAI-compatible upstream the OpenAI key, and
    neither gets the other's."""
    from gateway.config import TenantSettings
    from gateway.tenancy.tenants import hash_key

    settings = Settings(
        upstream=UpstreamSettings(base_url=upstream.base_url, api_key="sk-openai-SECRET"),
        anthropic=AnthropicSettings(
            base_url=upstream.base_url.removesuffix("/v1"), api_key="sk-ant-SECRET"
        ),
        tenants=(TenantSettings("alpha", (hash_key("cg-alpha-key"),)),),
        summaries=False,
    )
    upstream.handler = lambda received: JSONReply(
        {"input_tokens": 5}
        if received.path.endswith("count_tokens")
        else ANSWER
        if received.path.endswith("/messages")
        else chat_completion()
    )
    with GatewayServer(settings) as gateway:
        for model in ("claude-sonnet-4-6", "gpt-4o"):
            response = httpx.post(
                f"{gateway.url}{path}",
                json={"model": model, "max_tokens": 5, "messages": MESSAGES},
                headers={"x-api-key": "cg-alpha-key"},
                timeout=30,
            )
            assert response.status_code == 200
    credentials = {
        r.path: " ".join(v for k, v in r.headers.items() if k in ("authorization", "x-api-key"))
        for r in upstream.received
    }
    assert credentials.pop(path) in (
        "Bearer sk-ant-SECRET",
        "sk-ant-SECRET",
    )
    assert credentials == (
        {} if path.endswith("count_tokens") else {"/v1/chat/completions": "Bearer sk-openai-SECRET"}
    )
    assert len(upstream.received) == (1 if path.endswith("count_tokens") else 2)


def test_a_thinking_block_before_a_restore_call_leads_the_answer(
    client: anthropic.Anthropic, upstream: MockUpstream
) -> None:
    """With thinking on, the model thinks, restores, then calls the client's tool (the
    round after a tool result has no thinking of its own): streamed or not, the client gets
    the thinking block first, so the turn it sends back with its tool result starts with it,
    as Anthropic requires."""
    thinking = {"type": "thinking", "thinking": "I need the row.", "signature": "c2lnbmF0dXJl"}
    search = {"type": "tool_use", "id": "toolu_c", "name": "search", "input": {"q": "HAT042"}}

    def model(received: Received) -> Reply:
        last = received.json()["messages"][-1]["content"]
        if any(b.get("tool_use_id") == "toolu_r1" for b in last):
            content = [search]
        else:
            ref = REF.search(received.body.decode())
            assert ref is not None
            restore = {"type": "tool_use", "id": "toolu_r1", "name": "context_restore"}
            content = [thinking, {**restore, "input": {"ref": ref.group()}}]
        answer = {**ANSWER, "content": content, "stop_reason": "tool_use"}
        return (
            SSEReply(message_events(answer))
            if b'"stream":true' in received.body
            else (JSONReply(answer))
        )

    upstream.handler = model
    request: dict[str, Any] = {
        "model": "claude-sonnet-4-6",
        "max_tokens": 2_000,
        "messages": big_tool_history(),
        "thinking": {"type": "enabled", "budget_tokens": 1_024},
        "tools": [{"name": "search", "input_schema": {"type": "object"}}],
    }
    created = client.messages.create(**request)
    with client.messages.stream(**request) as stream:
        streamed = stream.get_final_message()
    assert created.model_dump(exclude_none=True) == streamed.model_dump(exclude_none=True)
    assert [b.model_dump(exclude_none=True) for b in created.content] == [thinking, search]
    assert created.stop_reason == "tool_use"


def test_claude_codes_tools_reach_anthropic_in_the_clients_bytes(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """A Claude-Code-like tool list reaches Anthropic tool for tool in the client's bytes,
    every key in the client's order (the prompt cache compares them), and the gateway's
    restore tool after them."""
    upstream.push(JSONReply(ANSWER))
    request = {
        "model": "claude-sonnet-4-6",
        "max_tokens": 32_000,
        "messages": MESSAGES,
        "tools": CLAUDE_CODE_TOOLS,
    }
    response = httpx.post(f"{gateway.url}/v1/messages", content=orjson.dumps(request))
    assert response.status_code == 200
    (sent,) = upstream.received
    tools = sent.json()["tools"]
    assert [tool["name"] for tool in tools] == [
        *(tool["name"] for tool in CLAUDE_CODE_TOOLS),
        RESTORE_TOOL_NAME,
    ]
    assert [list(tool.items()) for tool in tools[:-1]] == [
        list(tool.items()) for tool in CLAUDE_CODE_TOOLS
    ]
    assert orjson.dumps(CLAUDE_CODE_TOOLS)[:-1] in sent.body


@pytest.mark.parametrize(
    ("status", "content_type", "body"),
    [
        (502, "text/html", b"<html>Bad gateway</html>"),
        (200, "application/json; charset=utf-8", orjson.dumps(chat_completion("Hi."))),
    ],
)
async def test_an_openai_models_answer_is_json_for_a_messages_client_whatever_it_was(
    status: int, content_type: str, body: bytes
) -> None:
    """In process: the answer a Messages client gets from an OpenAI-compatible model is the
    gateway's translation, typed as JSON, whatever type the upstream's body had."""

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers={"content-type": content_type}, content=body)

    async with in_process(answer) as gateway:
        response = await gateway.client.post(
            "/v1/messages",
            json={
                "model": "gpt-4o",
                "max_tokens": 64,
                "messages": [{"role": "user", "content": "Hi"}],
            },
            headers={"anthropic-version": "2023-06-01", "x-api-key": "sk-caller-0001"},
        )
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    assert response.json()["type"] == ("error" if status >= 400 else "message")
