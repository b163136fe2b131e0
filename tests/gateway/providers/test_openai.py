"""The OpenAI-compatible provider in process (``create_app(transport=MockTransport)``):
where a request goes and with what, and how the upstream's failures reach the client."""

from __future__ import annotations

import gzip
from collections.abc import AsyncIterator

import httpx
import openai
import orjson
import pytest

from gateway.config import UpstreamSettings
from tests.in_process import in_process
from tests.mock_upstream import chat_completion, events_of, recorded_stream, recorded_streams

MESSAGES = [{"role": "user", "content": "Say hello."}]
KEY = "sk-caller-key-0001"


def answer(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json=chat_completion("Hello."), headers={"x-request-id": "up-1"})


@pytest.mark.parametrize("base", ["http://upstream.test/v1", "http://upstream.test/v1/"])
async def test_a_chat_request_goes_under_the_base_path_with_the_callers_key(base: str) -> None:
    async with in_process(answer, upstream=UpstreamSettings(base_url=base)) as gateway:
        raw = await gateway.openai(KEY).chat.completions.with_raw_response.create(
            model="gpt-4o",
            messages=MESSAGES,  # type: ignore[arg-type]
            extra_headers={"x-contextgate-policy": "cache-markers=?0", "x-team": "blue"},
        )
    completion = raw.parse()
    assert completion.choices[0].message.content == "Hello."
    assert raw.headers["x-request-id"] == "up-1"  # the upstream's own headers come back
    (sent,) = gateway.received
    assert sent.method == "POST"
    assert str(sent.url) == "http://upstream.test/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    assert sent.headers["x-team"] == "blue"
    assert "x-contextgate-policy" not in sent.headers  # the gateway's own stay here
    assert orjson.loads(sent.content)["messages"] == MESSAGES


async def test_a_request_goes_up_as_httpx_would_send_it() -> None:
    """The request's headers are those httpx gives a body sent whole, in its order: Host
    first, the forwarded ones and httpx's defaults, Content-Length last."""
    async with in_process(answer) as gateway:
        await gateway.openai(KEY).chat.completions.create(model="gpt-4o", messages=MESSAGES)  # type: ignore[arg-type]
    (sent,) = gateway.received
    ours = [(k, v) for k, v in sent.headers.raw if k.lower() not in (b"host", b"content-length")]
    expected = httpx.Request("POST", sent.url, headers=ours, content=sent.content)
    assert sent.headers.raw == expected.headers.raw
    assert sent.headers.raw[0] == (b"Host", b"upstream.test")
    assert sent.headers.raw[-1] == (b"Content-Length", str(len(sent.content)).encode())


async def test_a_configured_key_replaces_the_callers() -> None:
    settings = UpstreamSettings(base_url="http://upstream.test/v1", api_key="sk-configured-0001")
    async with in_process(answer, upstream=settings) as gateway:
        await gateway.openai(KEY).chat.completions.create(model="gpt-4o", messages=MESSAGES)  # type: ignore[arg-type]
    assert gateway.received[0].headers["authorization"] == "Bearer sk-configured-0001"


async def test_an_error_answer_is_relayed_as_given_but_for_the_key_it_echoes() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        error = {"error": {"message": f"Rate limited for key {KEY}.", "code": "rate_limit"}}
        return httpx.Response(429, json=error, headers={"retry-after": "7"})

    async with in_process(refuse) as gateway:
        with pytest.raises(openai.RateLimitError) as raised:
            await gateway.openai(KEY).chat.completions.create(model="gpt-4o", messages=MESSAGES)  # type: ignore[arg-type]
    response = raised.value.response
    assert response.status_code == 429
    assert response.headers["retry-after"] == "7"
    assert response.json()["error"] == {
        "message": "Rate limited for key [redacted].",
        "code": "rate_limit",
    }
    assert len(gateway.received) == 1  # a refusal other than an overflow is not retried


@pytest.mark.parametrize(
    ("failure", "status", "code"),
    [
        (httpx.ConnectError("refused"), 502, "upstream_unreachable"),
        (httpx.ConnectTimeout("slow"), 504, "upstream_timeout"),
        (httpx.ReadTimeout("slow"), 504, "upstream_timeout"),
    ],
)
async def test_a_transport_failure_is_the_gateways_own_error(
    failure: httpx.HTTPError, status: int, code: str
) -> None:
    def fail(request: httpx.Request) -> httpx.Response:
        raise failure

    async with in_process(fail) as gateway:
        response = await gateway.client.post(
            "/v1/chat/completions", json={"model": "gpt-4o", "messages": MESSAGES}
        )
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == code
    assert error["type"] == "upstream_error"
    assert response.headers["x-contextgate-request-id"].startswith("cg-")


async def test_a_stream_is_relayed_event_for_event() -> None:
    events = recorded_stream(recorded_streams()[0])

    def stream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, headers={"content-type": "text/event-stream"}, content=b"".join(events)
        )

    async with in_process(stream) as gateway:
        response = await gateway.client.post(
            "/v1/chat/completions", json={"model": "gpt-4o", "messages": MESSAGES, "stream": True}
        )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert [e for e in response.content.split(b"\n\n") if e.strip()] == [
        e.strip(b"\n") for e in events
    ]


async def test_a_compressed_stream_is_relayed_decoded() -> None:
    """A stream with a content encoding is read through httpx's decoding (one without is
    read raw, ``ResponseReading.events``)."""
    events = recorded_stream(recorded_streams()[0])

    def stream(request: httpx.Request) -> httpx.Response:
        headers = {"content-type": "text/event-stream", "content-encoding": "gzip"}
        return httpx.Response(200, headers=headers, content=gzip.compress(b"".join(events)))

    async with in_process(stream) as gateway:
        response = await gateway.client.post(
            "/v1/chat/completions", json={"model": "gpt-4o", "messages": MESSAGES, "stream": True}
        )
    assert response.status_code == 200
    assert "content-encoding" not in response.headers
    assert [e for e in response.content.split(b"\n\n") if e.strip()] == [
        e.strip(b"\n") for e in events
    ]


async def test_a_stream_broken_off_ends_with_an_error_event() -> None:
    class Broken(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            yield b"".join(events_of([chat_completion_chunk("Hel")], done=False))
            raise httpx.ReadError("connection reset")

    def stream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Broken())

    async with in_process(stream) as gateway:
        response = await gateway.client.post(
            "/v1/chat/completions", json={"model": "gpt-4o", "messages": MESSAGES, "stream": True}
        )
    events = [e for e in response.content.split(b"\n\n") if e.strip()]
    assert orjson.loads(events[0][len(b"data: ") :])["choices"][0]["delta"]["content"] == "Hel"
    error = orjson.loads(events[-1][len(b"data: ") :])["error"]
    assert error["code"] == "upstream_stream_error"
    assert "ReadError" in error["message"]


def chat_completion_chunk(content: str) -> dict[str, object]:
    return {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-4o",
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}],
    }
