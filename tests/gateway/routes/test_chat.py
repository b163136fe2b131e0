"""POST /v1/chat/completions through the gateway, driven by the official openai SDK."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import httpx
import httpx2
import openai
import orjson
import pytest

from gateway.context.restore import RESTORE_TOOL
from pipelines import TokenCounter
from tests.conftest import settings_for
from tests.harness import GatewayServer
from tests.in_process import in_process
from tests.mock_upstream import (
    Drop,
    Hang,
    JSONReply,
    MockUpstream,
    SSEReply,
    chat_completion,
    events_of,
    recorded_stream,
    recorded_streams,
)

MESSAGES: list[Any] = [{"role": "user", "content": "Say hello."}]


def sync_client(base_url: str, **kwargs: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="sk-test-key", max_retries=0, **kwargs)


def async_client(base_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key="sk-test-key", max_retries=0)


def chunk(content: str, id: str = "c") -> dict[str, Any]:
    """One streamed chat-completion chunk carrying ``content``."""
    return {
        "id": id,
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-4o",
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}],
    }


def raw_stream(gateway: GatewayServer) -> Any:
    """A streamed chat request to the gateway, read with plain httpx (bytes as sent)."""
    return httpx.stream(
        "POST",
        f"{gateway.base_url}/chat/completions",
        json={"model": "gpt-4o", "messages": MESSAGES, "stream": True},
    )


def assert_upstream_closed_soon(upstream: MockUpstream, left_at: float) -> None:
    """The upstream saw the gateway hang up within a second of the client leaving."""
    closed_at = upstream.wait_for_disconnect(3.0)
    assert closed_at is not None
    assert closed_at - left_at < 1.0


def assert_still_serving(gateway: GatewayServer) -> None:
    """The gateway answers an ordinary request."""
    with sync_client(gateway.base_url) as client:
        assert client.chat.completions.create(model="gpt-4o", messages=MESSAGES).choices


def test_completion_equals_direct(gateway: GatewayServer, upstream: MockUpstream) -> None:
    """A non-streamed completion through the gateway equals the same one taken directly."""
    reply = chat_completion("Hello there!")
    upstream.push(JSONReply(reply), JSONReply(reply))
    with sync_client(upstream.base_url) as direct, sync_client(gateway.base_url) as via:
        expected = direct.chat.completions.with_raw_response.create(
            model="gpt-4o", messages=MESSAGES
        )
        got = via.chat.completions.with_raw_response.create(model="gpt-4o", messages=MESSAGES)
    assert got.parse().model_dump() == expected.parse().model_dump()
    assert got.parse()._request_id == "req_mock"
    assert got.headers["x-contextgate-request-id"].startswith("cg-")
    tokens = TokenCounter("o200k_base").count_messages(MESSAGES)
    assert got.headers["x-contextgate-tokens"] == f"before={tokens}, after={tokens}"
    assert got.headers["x-contextgate-actions"] == ""
    assert float(got.headers["x-contextgate-overhead-ms"]) >= 0
    assert upstream.received[1].body == upstream.received[0].body


@pytest.mark.parametrize("name", recorded_streams())
def test_recorded_stream_equals_direct(
    gateway: GatewayServer, upstream: MockUpstream, name: str
) -> None:
    """Every recorded OpenAI stream arrives through the gateway byte for byte, and the SDK
    assembles the same chunks from it as it does directly."""
    events = recorded_stream(name)
    upstream.push(SSEReply(events), SSEReply(events))
    with sync_client(upstream.base_url) as direct, sync_client(gateway.base_url) as via:
        expected = [
            c.model_dump()
            for c in direct.chat.completions.create(model="gpt-4o", messages=MESSAGES, stream=True)
        ]
        got = [
            c.model_dump()
            for c in via.chat.completions.create(model="gpt-4o", messages=MESSAGES, stream=True)
        ]
    assert got == expected
    upstream.push(SSEReply(events))
    with raw_stream(gateway) as raw:
        assert raw.status_code == 200
        assert raw.read() == b"".join(events)


async def test_async_client_streams_and_completes(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """The async SDK gets the same completion and stream through the gateway as directly."""
    events = recorded_stream(recorded_streams()[0])
    upstream.push(
        JSONReply(chat_completion("async")),
        SSEReply(events),
        JSONReply(chat_completion("async")),
        SSEReply(events),
    )
    results = []
    for base in (upstream.base_url, gateway.base_url):
        async with async_client(base) as client:
            completion = await client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
            stream = await client.chat.completions.create(
                model="gpt-4o",
                messages=MESSAGES,
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [c.model_dump() async for c in stream]
        results.append((completion.model_dump(), chunks))
    assert results[0] == results[1]
    assert results[1][1][-1]["usage"]["total_tokens"] == 90
    forwarded = upstream.received[-1].json()
    assert forwarded["stream_options"] == {"include_usage": True}


def test_stream_is_relayed_event_by_event(gateway: GatewayServer, upstream: MockUpstream) -> None:
    """Each event reaches the client as the upstream sends it, not when the stream ends."""
    upstream.push(SSEReply(events_of([chunk(f"part{i}") for i in range(4)]), interval=0.3))
    arrivals = []
    with sync_client(gateway.base_url) as client:
        started = time.monotonic()
        for _chunk in client.chat.completions.create(
            model="gpt-4o", messages=MESSAGES, stream=True
        ):
            arrivals.append(time.monotonic() - started)
    assert len(arrivals) == 4
    assert arrivals[0] < 0.25
    assert arrivals[-1] - arrivals[0] > 0.6


def test_tools_images_and_unknown_fields_forwarded_untouched(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """Tools, tool calls, image parts and fields the gateway does not know reach the
    upstream exactly as sent, the gateway's restore tool after the client's tools (an
    agent's conversation has it from its first request)."""
    body = {
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "content": "You are helpful."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is in these?"},
                    {
                        "type": "image_url",
                        "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="},
                    },
                    {
                        "type": "image_url",
                        "image_url": {"url": "https://example.com/cat.png", "detail": "low"},
                    },
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": '{"q": "cat"}'},
                    }
                ],
            },
            # Compact already: a JSON output with spaces would go compact (compact-json).
            {"role": "tool", "tool_call_id": "call_1", "content": '{"animal":"cat"}'},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "lookup",
                    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
                },
            }
        ],
        "tool_choice": "auto",
        "temperature": 0.123456789,
        "vendor_extension": {"nested": [1, 2.5, None, "x"]},
        "seed": 18446744073709551615,
        # The client's own key: without one, cache_markers adds the conversation's.
        "prompt_cache_key": "client-chosen",
    }
    raw = orjson.dumps(body)
    response = httpx.post(
        f"{gateway.base_url}/chat/completions",
        content=raw,
        headers={"content-type": "application/json", "authorization": "Bearer sk-caller"},
    )
    assert response.status_code == 200
    forwarded = upstream.received[0]
    assert forwarded.body == orjson.dumps({**body, "tools": [*body["tools"], RESTORE_TOOL]})
    assert forwarded.headers["authorization"] == "Bearer sk-caller"
    assert forwarded.path == "/v1/chat/completions"


def test_upstream_tool_call_reply_reaches_sdk(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """A tool-call answer from the upstream is parsed by the SDK as one."""
    reply = chat_completion()
    reply["choices"][0]["message"] = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_9",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
            }
        ],
    }
    reply["choices"][0]["finish_reason"] = "tool_calls"
    upstream.push(JSONReply(reply))
    with sync_client(gateway.base_url) as client:
        completion = client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    call = completion.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert call.function.arguments == '{"city":"Paris"}'  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("status", "error_cls"),
    [
        (400, openai.BadRequestError),
        (401, openai.AuthenticationError),
        (429, openai.RateLimitError),
        (500, openai.InternalServerError),
        (503, openai.InternalServerError),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_upstream_error_relayed(
    gateway: GatewayServer,
    upstream: MockUpstream,
    status: int,
    error_cls: type[Exception],
    stream: bool,
) -> None:
    """An upstream error reaches the client with its status, body and retry-after, streamed
    or not: never as a 200 with an empty stream."""
    body = {
        "error": {
            "message": f"upstream says {status}",
            "type": "some_error",
            "param": None,
            "code": f"code_{status}",
        }
    }
    upstream.push(JSONReply(body, status=status, headers={"retry-after": "7"}))
    with sync_client(gateway.base_url) as client, pytest.raises(error_cls) as caught:
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES, stream=stream)
    error = caught.value
    assert isinstance(error, openai.APIStatusError)
    assert error.status_code == status
    assert error.body == body["error"]
    assert error.response.headers["retry-after"] == "7"
    assert error.response.headers["x-contextgate-request-id"].startswith("cg-")


def test_error_after_stream_began_ends_with_one_error_event(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """An upstream connection that breaks mid-stream ends the client's stream with one
    terminal error event and no [DONE]; the SDK raises after the chunks it had."""
    events = recorded_stream(recorded_streams()[0])[:3]
    upstream.push(SSEReply(events, ending="drop"))
    with raw_stream(gateway) as raw:
        assert raw.status_code == 200
        received = raw.read()
    assert received.startswith(b"".join(events))
    tail = received[len(b"".join(events)) :]
    assert tail.count(b"data: ") == 1
    assert orjson.loads(tail[len(b"data: ") :])["error"]["code"] == "upstream_stream_error"
    assert b"[DONE]" not in received
    upstream.push(SSEReply(events, ending="drop"))
    seen = []
    with sync_client(gateway.base_url) as client, pytest.raises(openai.APIError):
        for received_chunk in client.chat.completions.create(
            model="gpt-4o", messages=MESSAGES, stream=True
        ):
            seen.append(received_chunk)
    assert len(seen) == 3


def test_client_disconnect_closes_upstream_stream(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """A client that hangs up mid-stream has its upstream stream closed within a second."""
    upstream.push(SSEReply(events_of([chunk("tick")] * 100), interval=0.2))
    with raw_stream(gateway) as raw:
        iterator = raw.iter_raw()
        next(iterator)
        left_at = time.monotonic()
    assert_upstream_closed_soon(upstream, left_at)


def test_client_disconnect_while_upstream_silent(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """A client that hangs up while the upstream is silent mid-stream also frees the
    upstream connection within a second."""
    events = recorded_stream(recorded_streams()[0])[:2]
    upstream.push(SSEReply(events, ending="hang"))
    with raw_stream(gateway) as raw:
        next(raw.iter_raw())
        left_at = time.monotonic()
    assert_upstream_closed_soon(upstream, left_at)


def test_upstream_unreachable_is_502(upstream: MockUpstream) -> None:
    """An upstream nobody listens on gives 502 upstream_unreachable in the OpenAI envelope."""
    from tests.harness import free_port

    settings = settings_for(upstream)
    dead = settings.upstream.__class__(base_url=f"http://127.0.0.1:{free_port()}/v1")
    with GatewayServer(settings.__class__(upstream=dead)) as server:
        response = httpx.post(
            f"{server.base_url}/chat/completions", json={"model": "gpt-4o", "messages": MESSAGES}
        )
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_unreachable"
    assert response.json()["error"]["type"] == "upstream_error"


@pytest.mark.parametrize("stream", [False, True])
def test_upstream_timeout_is_504(upstream: MockUpstream, stream: bool) -> None:
    """An upstream that never answers gives 504 upstream_timeout after the read timeout."""
    upstream.push(Hang())
    with GatewayServer(settings_for(upstream, read_timeout=0.5)) as server:
        response = httpx.post(
            f"{server.base_url}/chat/completions",
            timeout=10,
            json={"model": "gpt-4o", "messages": MESSAGES, "stream": stream},
        )
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "upstream_timeout"


def test_upstream_dropping_connection_is_502(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """An upstream that closes the connection without answering gives 502."""
    upstream.push(Drop())
    response = httpx.post(
        f"{gateway.base_url}/chat/completions", json={"model": "gpt-4o", "messages": MESSAGES}
    )
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_unreachable"


def test_slow_first_byte_is_waited_for(gateway: GatewayServer, upstream: MockUpstream) -> None:
    """A stream whose first byte takes a while still arrives whole."""
    events = recorded_stream(recorded_streams()[1])
    upstream.push(SSEReply(events, first_byte_delay=1.0))
    with sync_client(gateway.base_url) as client:
        chunks = list(
            client.chat.completions.create(model="gpt-4o", messages=MESSAGES, stream=True)
        )
    assert len(chunks) == len(events) - 1


def test_many_concurrent_streams_are_not_capped(upstream: MockUpstream) -> None:
    """150 streams at once all reach the upstream together: the gateway's connection pool
    does not make any of them wait for another to finish."""
    # Load shedding is off: 150 arrivals at once on a busy machine lag the event loop past
    # max_queue_delay, and a shed request would leave the mock's gate forever unmet.
    settings = settings_for(upstream, read_timeout=30.0, max_queue_delay=None)
    count = 150
    upstream.push(*[SSEReply(events_of([chunk("x")] * 2), gate=count) for _ in range(count)])
    results: list[int] = []
    lock = threading.Lock()
    limits = httpx.Limits(max_connections=count + 10)
    with GatewayServer(settings) as gateway, httpx.Client(limits=limits, timeout=60) as client:

        def one() -> None:
            with client.stream(
                "POST",
                f"{gateway.base_url}/chat/completions",
                json={"model": "gpt-4o", "messages": MESSAGES, "stream": True},
            ) as response:
                body = response.read()
            with lock:
                results.append(body.count(b"data: "))

        threads = [threading.Thread(target=one) for _ in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert results == [3] * count
    assert upstream.max_in_flight == count


DEEP = b"[" * 300 + b"]" * 300

BAD_BODIES = [
    (
        b'{"model": "gpt-4o", "messages": [{"role": "user", "content": [{"type": "x", "d": '
        + DEEP
        + b"}]}]}",
        "nesting_too_deep",
        "messages[0]",
    ),
    (
        b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}], "tools": ['
        b'{"type": "function", "f": ' + DEEP + b"}]}",
        "nesting_too_deep",
        None,
    ),
    (b"{not json", "invalid_json", None),
    (b"", "invalid_json", None),
    (b"[1, 2, 3]", "invalid_body", None),
    (b'"just a string"', "invalid_body", None),
    (b'{"model": "gpt-4o"}', "missing_required_parameter", "messages"),
    (b'{"model": "gpt-4o", "messages": []}', "invalid_type", "messages"),
    (b'{"model": "gpt-4o", "messages": "hello"}', "invalid_type", "messages"),
    (b'{"messages": [{"role": "user", "content": "x"}]}', "missing_required_parameter", "model"),
    (b'{"model": 42, "messages": [{"role": "user", "content": "x"}]}', "invalid_type", "model"),
    (b'{"model": "gpt-4o", "messages": [42]}', "invalid_type", "messages[0]"),
    (
        b'{"model": "gpt-4o", "messages": [{"role": "wizard", "content": "x"}]}',
        "invalid_value",
        "messages[0].role",
    ),
    (
        b'{"model": "gpt-4o", "messages": [{"role": "user", "content": 7}]}',
        "invalid_type",
        "messages[0].content",
    ),
    (
        b'{"model": "gpt-4o", "messages": [{"role": "user", "content": [1]}]}',
        "invalid_type",
        "messages[0].content[0]",
    ),
    (
        b'{"model": "gpt-4o", "stream": "yes", "messages": [{"role": "user", "content": "x"}]}',
        "invalid_type",
        "stream",
    ),
    (
        b'{"model": "gpt-4o", "tools": {}, "messages": [{"role": "user", "content": "x"}]}',
        "invalid_type",
        "tools",
    ),
    (
        b'{"model": "gpt-4o", "messages": [{"role": "assistant", "tool_calls": "x"}]}',
        "invalid_type",
        "messages[0].tool_calls",
    ),
    (
        b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "\\ud800"}]}',
        "invalid_json",
        None,
    ),
    (
        b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}], "n": 1e999}',
        "invalid_json",
        None,
    ),
]


@pytest.mark.parametrize(("raw", "code", "param"), BAD_BODIES)
def test_bad_body_is_400_with_envelope(
    gateway: GatewayServer, upstream: MockUpstream, raw: bytes, code: str, param: str | None
) -> None:
    """A body that is not a usable chat request gets a 400 in the OpenAI envelope naming
    the problem, nothing is sent upstream, and the gateway keeps serving."""
    response = httpx.post(
        f"{gateway.base_url}/chat/completions",
        content=raw,
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == code
    assert error["param"] == param
    assert error["message"]
    assert upstream.received == []
    assert_still_serving(gateway)


def test_sdk_sees_bad_request_as_bad_request(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """The SDK raises BadRequestError with the gateway's message for a bad request."""
    with sync_client(gateway.base_url) as client, pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="gpt-4o", messages=[])
    assert caught.value.code == "invalid_type"
    assert "messages" in caught.value.message


def test_body_over_limit_is_413(upstream: MockUpstream) -> None:
    """A body over max_body_bytes gets 413 in the OpenAI envelope, whether it announces its
    length or streams it chunked, and nothing reaches the upstream."""
    with GatewayServer(settings_for(upstream, max_body_bytes=64 * 1024)) as server:
        huge = orjson.dumps(
            {"model": "gpt-4o", "messages": [{"role": "user", "content": "x" * 100_000}]}
        )
        announced = httpx.post(f"{server.base_url}/chat/completions", content=huge)

        def chunks() -> Any:
            for start in range(0, len(huge), 8192):
                yield huge[start : start + 8192]

        chunked = httpx.post(f"{server.base_url}/chat/completions", content=chunks())
        ok = httpx.post(
            f"{server.base_url}/chat/completions", json={"model": "gpt-4o", "messages": MESSAGES}
        )
    for response in (announced, chunked):
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "request_too_large"
    assert ok.status_code == 200
    assert len(upstream.received) == 1


def test_deeply_nested_body_is_answered(gateway: GatewayServer, upstream: MockUpstream) -> None:
    """A pathologically nested body gets a 4xx, not a crash."""
    raw = (
        b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}], "x": '
        + b"[" * 100_000
        + b"]" * 100_000
        + b"}"
    )
    response = httpx.post(f"{gateway.base_url}/chat/completions", content=raw)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_json"


def test_bad_policy_header_is_400(gateway: GatewayServer, upstream: MockUpstream) -> None:
    """An unknown, mistyped or out-of-range policy key is a 400 that names the key."""
    cases = {
        "colour=blue": "x-contextgate-policy.colour",
        "trigger=7.5": "x-contextgate-policy.trigger",
        "keep-images=lots": "x-contextgate-policy.keep-images",
        "this is not a dictionary": "x-contextgate-policy",
        "trigger=(1 2)": "x-contextgate-policy.trigger",
    }
    for header, param in cases.items():
        response = httpx.post(
            f"{gateway.base_url}/chat/completions",
            headers={"x-contextgate-policy": header},
            json={"model": "gpt-4o", "messages": MESSAGES},
        )
        assert response.status_code == 400, header
        assert response.json()["error"]["code"] == "invalid_policy"
        assert response.json()["error"]["param"] == param
    good = httpx.post(
        f"{gateway.base_url}/chat/completions",
        headers={"x-contextgate-policy": "mode=truncate, trigger=0.6, keep-images=1"},
        json={"model": "gpt-4o", "messages": MESSAGES},
    )
    assert good.status_code == 200
    assert len(upstream.received) == 1
    assert "x-contextgate-policy" not in upstream.received[0].headers


def test_wrong_method_and_unknown_route(gateway: GatewayServer) -> None:
    """A wrong method is 405 and an unknown route 404, both in the OpenAI envelope."""
    wrong = httpx.put(f"{gateway.base_url}/chat/completions", json={})
    missing = httpx.get(f"{gateway.url}/nothing/here")
    assert wrong.status_code == 405
    assert wrong.json()["error"]["code"] == "method_not_allowed"
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize("stream", [False, True])
def test_client_leaving_before_first_byte_frees_upstream(
    gateway: GatewayServer, upstream: MockUpstream, stream: bool
) -> None:
    """A client that gives up while the upstream has not answered yet (a long non-streamed
    completion, or a stream's slow first byte) has its upstream request closed within a
    second, so it stops costing tokens."""
    upstream.push(Hang())
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{gateway.base_url}/chat/completions",
            timeout=httpx.Timeout(5, read=0.5),
            json={"model": "gpt-4o", "messages": MESSAGES, "stream": stream},
        )
    left_at = time.monotonic()
    assert_upstream_closed_soon(upstream, left_at)
    assert_still_serving(gateway)


def test_non_ascii_header_is_forwarded_byte_for_byte(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """A header value with non-ASCII bytes (an app title, say) reaches the upstream as sent
    instead of failing the request."""
    response = httpx.post(
        f"{gateway.base_url}/chat/completions",
        json={"model": "gpt-4o", "messages": MESSAGES},
        headers=[(b"x-title", "Café ☕".encode()), (b"authorization", b"Bearer sk-\xe9")],
    )
    assert response.status_code == 200
    received = upstream.received[0].headers
    assert received["x-title"].encode("latin-1") == "Café ☕".encode()
    assert received["authorization"].encode("latin-1") == b"Bearer sk-\xe9"
    assert "expect" not in received


def test_upstream_cannot_spoof_gateway_headers(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """x-contextgate-* headers sent by the upstream are dropped; the client sees only the
    gateway's own."""
    upstream.push(
        JSONReply(
            chat_completion(),
            headers={"x-contextgate-request-id": "spoofed", "x-contextgate-actions": "summarize"},
        )
    )
    response = httpx.post(
        f"{gateway.base_url}/chat/completions", json={"model": "gpt-4o", "messages": MESSAGES}
    )
    assert response.headers.get_list("x-contextgate-request-id") != ["spoofed"]
    assert len(response.headers.get_list("x-contextgate-request-id")) == 1
    assert response.headers["x-contextgate-actions"] == ""


@pytest.mark.parametrize(
    ("ending", "code"), [("drop", "upstream_stream_error"), ("end", "upstream_empty_stream")]
)
def test_stream_failing_before_first_event_is_502(
    gateway: GatewayServer, upstream: MockUpstream, ending: str, code: str
) -> None:
    """An upstream that answers 200 event-stream and then fails (or ends) before its first
    event gets the client a 502, not a 200 stream."""
    upstream.push(SSEReply([], ending=ending))  # type: ignore[arg-type]
    with sync_client(gateway.base_url) as client, pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES, stream=True)
    assert caught.value.status_code == 502
    assert caught.value.code == code


def test_client_leaving_mid_body_is_quiet(
    gateway: GatewayServer, upstream: MockUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    """A client that hangs up halfway through sending its body is no error of the
    gateway's: nothing is logged as one, nothing goes upstream, and it keeps serving."""
    import socket

    with (
        caplog.at_level(logging.ERROR),
        socket.create_connection(("127.0.0.1", gateway.port)) as sock,
    ):
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            b'Content-Type: application/json\r\nContent-Length: 5000\r\n\r\n{"model": '
        )
        time.sleep(0.2)
    time.sleep(0.3)
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert upstream.received == []
    assert_still_serving(gateway)


def test_oversized_new_turn_is_refused_before_upstream(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """A new user turn over block-tokens is a 400 payload_too_large naming the numbers,
    and nothing reaches the upstream."""
    with sync_client(gateway.base_url) as client, pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="gpt-4o",
            messages=[{"role": "user", "content": "word " * 3000}],
            extra_headers={"x-contextgate-policy": "block-tokens=1000"},
        )
    assert caught.value.code == "payload_too_large"
    assert "1,000" in caught.value.message
    assert upstream.received == []


def test_actions_header_names_the_stages_that_acted(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """A request the pipeline changes is forwarded changed, and the actions header says
    which stages did it."""
    messages = [
        {"role": "user", "content": "look it up"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "thinking...",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "user", "content": "never mind"},
    ]
    response = httpx.post(
        f"{gateway.base_url}/chat/completions", json={"model": "gpt-4o", "messages": messages}
    )
    assert response.status_code == 200
    assert response.headers["x-contextgate-actions"] == "thinking, normalize"
    forwarded = upstream.received[0].json()["messages"]
    assert "reasoning_content" not in forwarded[1]
    assert forwarded[2]["role"] == "tool"
    assert forwarded[3] == messages[2]


OVERFLOW = {
    "error": {
        "message": "This model's maximum context length is 8192 tokens.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}


def long_history(turns: int = 40) -> list[dict[str, Any]]:
    return [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "content": f"turn {i}: " + "the booking for flight HAT170 on 2024-05-16 " * 25,
        }
        for i in range(turns)
    ] + [{"role": "user", "content": "What is my flight?"}]


@pytest.mark.parametrize("stream", [False, True])
def test_upstream_overflow_is_retried_compacted(
    gateway: GatewayServer, upstream: MockUpstream, stream: bool
) -> None:
    """When the upstream says the prompt is too long, the gateway compacts to half the
    budget and tries again; the client sees only the answer."""
    answer = (
        SSEReply(recorded_stream(recorded_streams()[0]))
        if stream
        else JSONReply(chat_completion("It is HAT170."))
    )
    upstream.push(JSONReply(OVERFLOW, status=400), answer)
    with sync_client(gateway.base_url) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o", messages=long_history(), stream=stream
        )
    assert raw.headers["x-contextgate-attempts"] == "2"
    assert "compress" in raw.headers["x-contextgate-actions"]
    first, second = upstream.received
    counter = TokenCounter("o200k_base")
    assert (
        counter.count_messages(second.json()["messages"])
        <= counter.count_messages(first.json()["messages"]) / 2
    )
    assert second.json()["messages"][-1] == {"role": "user", "content": "What is my flight?"}


def test_overflow_retries_are_bounded(gateway: GatewayServer, upstream: MockUpstream) -> None:
    """After three overflow answers the client gets the upstream's error, as sent."""
    upstream.push(*[JSONReply(OVERFLOW, status=400) for _ in range(3)])
    response = httpx.post(
        f"{gateway.base_url}/chat/completions",
        json={"model": "gpt-4o", "messages": long_history(160)},
        timeout=30,
    )
    assert response.status_code == 400
    assert response.json() == OVERFLOW
    assert response.headers["x-contextgate-attempts"] == "3"
    assert len(upstream.received) == 3


def test_other_errors_are_not_retried(gateway: GatewayServer, upstream: MockUpstream) -> None:
    """A 400 that is not about the context length is relayed after one attempt."""
    upstream.push(
        JSONReply(
            {"error": {"message": "Invalid tool schema", "type": "x", "param": None, "code": None}},
            status=400,
        )
    )
    response = httpx.post(
        f"{gateway.base_url}/chat/completions", json={"model": "gpt-4o", "messages": long_history()}
    )
    assert response.status_code == 400
    assert response.headers["x-contextgate-attempts"] == "1"
    assert len(upstream.received) == 1


# Claude for a chat client, in process (``tests/in_process.py``): the translated answer.

CLAUDE_USAGE = {
    "input_tokens": 30,
    "output_tokens": 5,
    "cache_read_input_tokens": 100,
    "cache_creation_input_tokens": 20,
}


def _claude_stream() -> bytes:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4",
        "content": [],
        "stop_reason": None,
        "usage": CLAUDE_USAGE,
    }
    events = [
        ("message_start", {"type": "message_start", "message": message}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "Hi."},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": 5},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return b"".join(
        b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"
        for kind, data in events
    )


def _metric(metrics: str, name: str, **labels: str) -> float:
    found = 0.0
    for line in metrics.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            found += float(line.rsplit(" ", 1)[1])
    return found


async def test_a_claude_stream_reaches_a_chat_client_as_an_event_stream_with_its_usage() -> None:
    """The translated stream is typed as one (SSE clients check), and Claude's usage is
    counted though the client did not ask for a usage chunk, cache writes included."""

    def stream(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(
            200, headers={"content-type": "text/event-stream"}, content=_claude_stream()
        )

    async with in_process(anthropic=stream) as gateway:
        response = await gateway.client.post(
            "/v1/chat/completions",
            json={"model": "claude-sonnet-4", "messages": MESSAGES, "stream": True},
            headers={"authorization": "Bearer sk-ant-caller-0001"},
        )
        metrics = (await gateway.client.get("/metrics")).text
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert b'"content":"Hi."' in response.content
    assert response.content.endswith(b"data: [DONE]\n\n")
    tokens = "contextgate_upstream_tokens_total"
    assert _metric(metrics, tokens, kind="input", model="claude-sonnet-4") == 150
    assert _metric(metrics, tokens, kind="cache_write", model="claude-sonnet-4") == 20


async def test_a_claude_success_that_is_not_a_message_is_a_502_and_not_a_success() -> None:
    def garbled(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=b"<html>not json</html>")

    async with in_process(anthropic=garbled) as gateway:
        response = await gateway.client.post(
            "/v1/chat/completions",
            json={"model": "claude-sonnet-4", "messages": MESSAGES},
            headers={"authorization": "Bearer sk-ant-caller-0001"},
        )
        metrics = (await gateway.client.get("/metrics")).text
    assert response.status_code == 502
    assert response.headers["content-type"] == "application/json"
    assert response.json()["error"]["code"] == "upstream_invalid_answer"
    duration = "contextgate_upstream_duration_seconds_count"
    assert _metric(metrics, duration, provider="anthropic", outcome="success") == 0


async def test_a_claude_answer_after_a_restore_round_holds_every_rounds_text_and_thinking() -> None:
    """Not streamed, a chat client gets what a stream shows: each round's text and the
    thinking that went with it; the round is resent with its thinking block first, as
    Claude with thinking on requires."""
    ref = "ctx_" + "A" * 24
    usage = {"input_tokens": 10, "output_tokens": 3}
    looked = {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4",
        "content": [
            {"type": "thinking", "thinking": "Look it up.", "signature": "sig1"},
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "context_restore", "input": {"ref": ref}},
        ],
        "stop_reason": "tool_use",
        "usage": usage,
    }
    done = {**looked, "id": "msg_02", "content": [{"type": "text", "text": " Done."}]}
    done["stop_reason"] = "end_turn"
    answers = [httpx2.Response(200, json=looked), httpx2.Response(200, json=done)]
    asked = [{"role": "user", "content": f"See {ref}."}]
    async with in_process(anthropic=lambda request: answers.pop(0)) as gateway:
        response = await gateway.client.post(
            "/v1/chat/completions",
            json={"model": "claude-sonnet-4", "messages": asked},
            headers={"authorization": "Bearer sk-ant-caller-0001"},
        )
    message = response.json()["choices"][0]["message"]
    assert message["content"] == "Let me look. Done."
    assert message["thinking_blocks"] == [
        {"type": "thinking", "thinking": "Look it up.", "signature": "sig1"}
    ]
    resent = orjson.loads(gateway.anthropic_received[1].content)["messages"]
    assert resent[-2]["role"] == "assistant"
    assert resent[-2]["content"][0] == looked["content"][0]
    assert resent[-1]["content"][0]["type"] == "tool_result"
