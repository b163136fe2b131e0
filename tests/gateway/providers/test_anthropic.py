"""The built-in Anthropic provider: ``claude-*`` models for the OpenAI SDK as the client,
the mock upstream speaking the Messages API (the recorded streams of the Anthropic SDK's
own tests), the official ``anthropic`` SDK in between; then the SDK call itself, in
process."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import httpx2
import openai
import orjson
import pytest
from anthropic import APIStatusError

from gateway.codecs.chat_anthropic import from_message
from gateway.config import AnthropicSettings, Settings, UpstreamSettings
from tests.gateway.codecs.chat_anthropic.samples import ANSWER, STREAMS, events_of, recorded
from tests.harness import GatewayServer
from tests.in_process import in_process
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


def ask(
    base_url: str, model: str = "claude-sonnet-4", key: str = "sk-ant-mine", **fields: Any
) -> httpx.Response:
    """A chat request for ``model`` with ``key`` (and ``fields``), as a plain HTTP client
    sends it."""
    return httpx.post(
        f"{base_url}/chat/completions",
        json={"model": model, "messages": MESSAGES, **fields},
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )


@pytest.fixture
def gateway(anthropic_gateway: GatewayServer) -> GatewayServer:
    return anthropic_gateway


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


@pytest.mark.parametrize("name", sorted(path.name for path in STREAMS.glob("*.txt")))
def test_a_recorded_stream_reaches_the_openai_client_as_chunks(
    client: openai.OpenAI, upstream: MockUpstream, name: str
) -> None:
    """Each recorded Anthropic stream ends in the OpenAI SDK as the completion the whole
    recorded answer translates to: text, tool calls, finish reason and usage."""
    from openai.lib.streaming.chat import ChatCompletionStreamState

    upstream.push(SSEReply(events_of(name)))
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
    answer = from_message(recorded(name))
    expected = answer["choices"][0]
    assert final.finish_reason == expected["finish_reason"]
    assert (final.message.content or None) == expected["message"]["content"]
    calls = [(c.id, c.function.name, c.function.arguments) for c in final.message.tool_calls or []]
    wanted = [
        (c["id"], c["function"]["name"], c["function"]["arguments"])
        for c in expected["message"].get("tool_calls") or []
    ]
    assert [(i, n) for i, n, _ in calls] == [(i, n) for i, n, _ in wanted]
    for (_, _, got), (_, _, want) in zip(calls, wanted, strict=True):
        assert got == want or orjson.loads(got) == orjson.loads(want)
    assert usage is not None
    assert usage.model_dump(exclude_none=True) == answer["usage"]
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


def test_a_stream_broken_off_ends_with_one_error_event(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    upstream.push(SSEReply(events_of("tool_use_response.txt")[:6], ending="drop"))
    response = ask(gateway.base_url, stream=True)
    assert response.status_code == 200
    events = [e for e in response.text.split("\n\n") if e.startswith("data: ")]
    *chunks, last = events
    assert chunks  # what arrived before the break was relayed
    assert orjson.loads(last[len("data: ") :])["error"]["code"] == "upstream_stream_error"
    assert "[DONE]" not in response.text


def test_the_openai_key_is_never_sent_to_anthropic(upstream: MockUpstream) -> None:
    """A gateway holding the OpenAI key sends the caller's own key to Anthropic (or the
    configured Anthropic key), never the OpenAI one."""
    base = upstream.base_url.removesuffix("/v1")
    for anthropic_key, expected in ((None, "sk-ant-callers"), ("sk-ant-configured", None)):
        settings = Settings(
            upstream=UpstreamSettings(base_url=upstream.base_url, api_key="sk-openai-SECRET"),
            anthropic=AnthropicSettings(base_url=base, api_key=anthropic_key),
            summaries=False,
        )
        upstream.reset()
        upstream.push(JSONReply(ANSWER))
        with GatewayServer(settings) as server:
            ask(server.base_url, key="sk-ant-callers")
        (sent,) = upstream.received
        assert "sk-openai-SECRET" not in str(sent.headers)
        assert (expected or anthropic_key or "") in str(sent.headers)


def test_with_tenants_and_no_anthropic_key_claude_is_refused(upstream: MockUpstream) -> None:
    from gateway.config import TenantSettings
    from gateway.tenancy.tenants import hash_key

    settings = Settings(
        upstream=UpstreamSettings(base_url=upstream.base_url, api_key="sk-openai-SECRET"),
        anthropic=AnthropicSettings(base_url=upstream.base_url.removesuffix("/v1")),
        tenants=(TenantSettings("alpha", (hash_key("cg-alpha-key"),)),),
        summaries=False,
    )
    with GatewayServer(settings) as server:
        response = ask(server.base_url, key="cg-alpha-key")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "provider_not_configured"
    assert upstream.received == []


def test_an_anthropic_rate_limit_keeps_its_retry_after(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    error = {"type": "error", "error": {"type": "rate_limit_error", "message": "Slow down."}}
    upstream.push(JSONReply(error, status=429, headers={"retry-after": "7"}))
    response = ask(gateway.base_url)
    assert response.status_code == 429
    assert response.headers["retry-after"] == "7"
    assert response.json()["error"]["type"] == "rate_limit_error"


def test_router_names_and_a_disabled_provider_go_to_the_openai_upstream(
    upstream: MockUpstream,
) -> None:
    base = upstream.base_url.removesuffix("/v1")
    cases = (
        (AnthropicSettings(base_url=base), "anthropic/claude-3.5-sonnet"),
        (AnthropicSettings(base_url=base, enabled=False), "claude-sonnet-4"),
    )
    for anthropic, model in cases:
        upstream.reset()
        settings = Settings(
            upstream=UpstreamSettings(base_url=upstream.base_url),
            anthropic=anthropic,
            summaries=False,
        )
        with GatewayServer(settings) as server:
            ask(server.base_url, model, key="sk-x")
        assert [r.path for r in upstream.received] == ["/v1/chat/completions"]


def test_max_tokens_defaults_to_the_models_output_limit(
    client: openai.OpenAI, upstream: MockUpstream
) -> None:
    upstream.push(JSONReply(ANSWER), JSONReply(ANSWER))
    client.chat.completions.create(model="claude-3-haiku-20240307", messages=MESSAGES)
    client.chat.completions.create(model="claude-sonnet-4", messages=MESSAGES)
    assert [r.json()["max_tokens"] for r in upstream.received] == [4_096, 8_192]


@pytest.mark.parametrize("body", [b"<html>Bad gateway</html>", b"[1, 2]", b'{"content": 5}'])
def test_an_anthropic_success_that_is_not_a_message_is_a_502(
    client: openai.OpenAI, upstream: MockUpstream, body: bytes
) -> None:
    """A 200 from Anthropic whose body is not a message cannot be translated: a 502 in the
    OpenAI envelope that quotes it, not the gateway's 500."""
    upstream.push(JSONReply(body))
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="claude-sonnet-4", messages=MESSAGES)
    assert caught.value.status_code == 502
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["code"] == "upstream_invalid_answer"
    assert body.decode() in error["message"]


def test_reasoning_effort_turns_thinking_on_with_room_for_the_answer(
    client: openai.OpenAI, upstream: MockUpstream
) -> None:
    """An OpenAI client's reasoning_effort becomes Claude's thinking budget (LiteLLM's
    figures), max_tokens grows past the budget when it would not leave room for the
    answer, and a `thinking` field of the client's own is sent as it is."""
    upstream.push(JSONReply(ANSWER), JSONReply(ANSWER), JSONReply(ANSWER))
    client.chat.completions.create(
        model="claude-sonnet-4", messages=MESSAGES, reasoning_effort="medium", max_tokens=8_000
    )
    client.chat.completions.create(
        model="claude-sonnet-4", messages=MESSAGES, reasoning_effort="high", max_tokens=500
    )
    own = {"type": "enabled", "budget_tokens": 3_000}
    client.chat.completions.create(
        model="claude-sonnet-4", messages=MESSAGES, extra_body={"thinking": own}
    )
    sent = [r.json() for r in upstream.received]
    assert sent[0]["thinking"] == {"type": "enabled", "budget_tokens": 2_048}
    assert sent[0]["max_tokens"] == 8_000
    assert sent[1]["thinking"] == {"type": "enabled", "budget_tokens": 4_096}
    assert sent[1]["max_tokens"] == 4_596
    assert sent[2]["thinking"] == own
    assert "reasoning_effort" not in sent[0]


def test_thinking_over_two_restore_rounds_reaches_the_openai_client_whole(
    client: openai.OpenAI, upstream: MockUpstream
) -> None:
    """Streamed with thinking on, an answer that took a restore round keeps both rounds'
    thinking blocks, with their signatures, as two blocks the OpenAI SDK can add up."""
    from openai.lib.streaming.chat import ChatCompletionStreamState

    from tests.gateway.routes.test_messages import REF, message_events

    rows = "\n".join(f'{{"flight": "HAT{n:03d}", "price": {100 + n}}}' for n in range(900))
    call = {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}}
    history: list[Any] = [
        {"role": "user", "content": "Which flights?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": rows},
        {"role": "user", "content": "What does HAT042 cost?"},
    ]

    def rounds(received: Any) -> Any:
        body = received.json()
        first = body["messages"][-1]["content"][0].get("tool_use_id") != "toolu_r"
        if first:
            ref = REF.search(received.body.decode())
            assert ref is not None
            content = [
                {"type": "thinking", "thinking": "I need the rows.", "signature": "c2ln"},
                {
                    "type": "tool_use",
                    "id": "toolu_r",
                    "name": "context_restore",
                    "input": {"ref": ref.group()},
                },
            ]
        else:
            content = [
                {"type": "thinking", "thinking": "Row 43 says 142.", "signature": "c2lnMg"},
                {"type": "text", "text": "It costs 142."},
            ]
        message = {
            **ANSWER,
            "content": content,
            "stop_reason": "tool_use" if first else "end_turn",
            "usage": {"input_tokens": 100, "output_tokens": 10},
        }
        return SSEReply(message_events(message))

    upstream.handler = rounds
    state: ChatCompletionStreamState[None] = ChatCompletionStreamState()
    for chunk in client.chat.completions.create(
        model="claude-sonnet-4", messages=history, reasoning_effort="low", stream=True
    ):
        state.handle_chunk(chunk)
    message = state.current_completion_snapshot.choices[0].message
    assert message.content == "It costs 142."
    blocks = message.model_dump()["thinking_blocks"]
    assert [(b["thinking"], b["signature"], b["index"]) for b in blocks] == [
        ("I need the rows.", "c2ln", 0),
        ("Row 43 says 142.", "c2lnMg", 1),
    ]
    assert len(upstream.received) == 2


def test_several_choices_are_refused_rather_than_silently_one(
    client: openai.OpenAI, upstream: MockUpstream
) -> None:
    """Claude has no `n`: asking for 3 choices is a clear 400, not one answer."""
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="claude-sonnet-4", messages=MESSAGES, n=3)
    assert caught.value.code == "unsupported_parameter"
    assert upstream.received == []


# In process (``tests/in_process.py``, ``create_app(anthropic_transport=MockTransport)``):
# the SDK call itself, driven by the anthropic SDK on the Messages route.

KEY = "sk-ant-caller-0001"
ASKED = [{"role": "user", "content": "Weather in Paris?"}]


async def test_a_messages_request_is_the_sdks_call_with_the_callers_key_and_headers() -> None:
    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, json=ANSWER, headers={"request-id": "req_01"})

    async with in_process(anthropic=answer) as gateway:
        raw = await gateway.anthropic(KEY).messages.with_raw_response.create(
            model="claude-sonnet-4",
            max_tokens=64,
            messages=ASKED,  # type: ignore[arg-type]
            extra_headers={"anthropic-beta": "context-1m-2025-08-07", "x-app": "cli"},
        )
    assert (await raw.parse()).content[0].text == "Sunny."  # type: ignore[union-attr]
    assert raw.headers["request-id"] == "req_01"
    (sent,) = gateway.anthropic_received
    assert str(sent.url) == "http://anthropic.test/v1/messages"
    # The caller's key, in the one header this SDK sends an API key in.
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    assert "x-api-key" not in sent.headers
    assert sent.headers["anthropic-beta"] == "context-1m-2025-08-07"
    assert sent.headers["x-app"] == "cli"
    assert sent.headers["anthropic-version"]  # the client's, sent on
    (message,) = orjson.loads(sent.content)["messages"]
    assert message["content"] == [{"type": "text", "text": "Weather in Paris?"}]
    assert gateway.received == []  # nothing went to the OpenAI-compatible upstream


async def test_an_anthropic_refusal_comes_back_as_given_but_for_the_key() -> None:
    def overloaded(request: httpx2.Request) -> httpx2.Response:
        error = {"type": "error", "error": {"type": "overloaded_error", "message": f"busy {KEY}"}}
        return httpx2.Response(529, json=error, headers={"retry-after": "3"})

    async with in_process(anthropic=overloaded) as gateway:
        with pytest.raises(APIStatusError) as raised:
            await gateway.anthropic(KEY).messages.create(
                model="claude-sonnet-4",
                max_tokens=64,
                messages=ASKED,  # type: ignore[arg-type]
            )
    response = raised.value.response
    assert response.status_code == 529
    assert response.headers["retry-after"] == "3"
    assert response.json()["error"] == {"type": "overloaded_error", "message": "busy [redacted]"}


@pytest.mark.parametrize(
    ("failure", "status", "kind"),
    [
        (httpx2.ConnectError("refused"), 502, "api_error"),
        (httpx2.ReadTimeout("slow"), 504, "timeout_error"),
    ],
)
async def test_a_transport_failure_is_the_gateways_error_in_anthropics_envelope(
    failure: httpx2.HTTPError, status: int, kind: str
) -> None:
    def fail(request: httpx2.Request) -> httpx2.Response:
        raise failure

    async with in_process(anthropic=fail) as gateway:
        response = await gateway.client.post(
            "/v1/messages",
            json={"model": "claude-sonnet-4", "max_tokens": 64, "messages": ASKED},
            headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"},
        )
    assert response.status_code == status
    body = response.json()
    assert body["type"] == "error"
    assert body["error"]["type"] == kind


async def test_a_stream_broken_off_ends_with_an_error_event() -> None:
    events = events_of("basic_response.txt")

    class Broken(httpx2.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            yield b"".join(events[:3])
            raise httpx2.ReadError("connection reset")

    def stream(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=Broken())

    async with in_process(anthropic=stream) as gateway:
        response = await gateway.client.post(
            "/v1/messages",
            json={
                "model": "claude-sonnet-4",
                "max_tokens": 64,
                "messages": ASKED,
                "stream": True,
            },
            headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"},
        )
    received = [e for e in response.content.split(b"\n\n") if e.strip()]
    assert received[:3] == [e.strip(b"\n") for e in events[:3]]
    assert received[-1].startswith(b"event: error\n")
    error = orjson.loads(received[-1].split(b"data: ", 1)[1])
    assert error["type"] == "error"
