"""Admission: the route decides whether a key is needed, never Host or X-Forwarded-*; no
request chooses its upstream; bodies and headers are bounded in size and time."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from gateway.config import AnthropicSettings, Settings, TenantSettings, UpstreamSettings
from gateway.tenancy.tenants import hash_key
from tests.harness import GatewayServer
from tests.mock_upstream import JSONReply, MockUpstream, chat_completion

KEY = "cg-admission-key-0123456789abcdef"
CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Hi"}]}
CLAUDE = {
    "model": "claude-sonnet-4-6",
    "max_tokens": 20,
    "messages": [{"role": "user", "content": "Hi"}],
}


@pytest.fixture(scope="module")
def gateway(mock_upstream: MockUpstream) -> Iterator[GatewayServer]:
    settings = Settings(
        upstream=UpstreamSettings(base_url=mock_upstream.base_url, api_key="sk-upstream-key"),
        anthropic=AnthropicSettings(base_url=mock_upstream.base_url.removesuffix("/v1")),
        tenants=(TenantSettings("alpha", (hash_key(KEY),)),),
        summaries=False,
        body_timeout=0.5,
        max_header_bytes=8_192,
    )
    with GatewayServer(settings) as server:
        yield server


ROUTES = [
    ("POST", "/v1/chat/completions", CHAT, "openai"),
    ("POST", "/v1/context/compact", CHAT, "openai"),
    ("GET", "/v1/models", None, "openai"),
    ("GET", "/v1/context/objects/ctx_" + "A" * 24, None, "openai"),
    ("POST", "/v1/messages", CLAUDE, "anthropic"),
    ("POST", "/v1/messages/count_tokens", CLAUDE, "anthropic"),
]


@pytest.mark.parametrize(("method", "path", "body", "envelope"), ROUTES)
@pytest.mark.parametrize("key", [None, "cg-wrong-key-0123456789abcdef", "Basic YWxpY2U6c2VjcmV0"])
def test_missing_or_wrong_key_is_401_in_the_route_envelope(
    gateway: GatewayServer,
    upstream: MockUpstream,
    method: str,
    path: str,
    body: object,
    envelope: str,
    key: str | None,
) -> None:
    """Every route that reaches a model or the store refuses a missing or unknown key with
    a 401 in its own API's error shape, before anything goes upstream."""
    headers = {} if key is None else {"authorization": key if " " in key else f"Bearer {key}"}
    response = httpx.request(method, gateway.url + path, json=body, headers=headers)
    assert response.status_code == 401
    error = response.json()
    if envelope == "openai":
        assert error["error"]["code"] == "invalid_api_key"
    else:
        assert error["type"] == "error"
        assert error["error"]["type"] == "authentication_error"
    assert upstream.received == []


def test_both_sdks_are_admitted_with_either_header(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """The key works as Authorization: Bearer (openai SDK) and as x-api-key (anthropic
    SDK); neither reaches the upstream, the configured upstream key does."""
    upstream.push(JSONReply(chat_completion()), JSONReply(chat_completion()))
    with openai.OpenAI(base_url=gateway.base_url, api_key=KEY) as client:
        client.chat.completions.create(**CHAT)  # type: ignore[call-overload]
    with anthropic.Anthropic(base_url=gateway.url, api_key=KEY) as claude:
        answer = claude.messages.create(
            model="gpt-4o", max_tokens=20, messages=[{"role": "user", "content": "Hi"}]
        )
    assert answer.content[0].type == "text"
    for received in upstream.received:
        assert received.headers["authorization"] == "Bearer sk-upstream-key"
        assert KEY not in str(received.headers)


def test_public_routes_need_no_key(gateway: GatewayServer) -> None:
    """Health checks and metrics answer without a key (they hold no tenant's data)."""
    for path in ("/healthz", "/readyz", "/metrics"):
        assert httpx.get(gateway.url + path).status_code == 200


HOST_GAMES = [
    {"host": "localhost"},
    {"host": "127.0.0.1:8080"},
    {"x-forwarded-host": "localhost"},
    {"x-forwarded-for": "127.0.0.1", "x-real-ip": "127.0.0.1"},
    {"x-forwarded-proto": "https", "forwarded": "for=127.0.0.1;host=localhost;proto=https"},
    {"x-original-url": "/healthz", "x-rewrite-url": "/healthz"},
    {"x-forwarded-prefix": "/healthz", "x-envoy-original-path": "/healthz"},
]


@pytest.mark.parametrize("headers", HOST_GAMES)
def test_host_and_forwarding_headers_do_not_admit(
    gateway: GatewayServer, upstream: MockUpstream, headers: dict[str, str]
) -> None:
    """Claims of a trusted host, a proxy or a rewritten path change nothing: no key, 401."""
    response = httpx.post(gateway.base_url + "/chat/completions", json=CHAT, headers=headers)
    assert response.status_code == 401
    assert upstream.received == []


def raw_request(gateway: GatewayServer, head: bytes, body: bytes = b"") -> bytes:
    """Send bytes as they are (no client normalises the path) and read one answer."""
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=5) as sock:
        sock.sendall(head + body)
        answer = b""
        while chunk := sock.recv(65_536):
            answer += chunk
            top, _, rest = answer.partition(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in top.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                None,
            )
            if length is not None and len(rest) >= length:
                break
    return answer


@pytest.mark.parametrize(
    "path",
    [
        b"/healthz/../v1/chat/completions",
        b"/healthz/%2e%2e/v1/chat/completions",
        b"//v1/chat/completions",
        b"/v1/chat/completions/",
        b"/v1/./chat/completions",
        b"/V1/chat/completions",
        b"/v1/chat/completions?/healthz",
        b"/v1/chat/completions%00/healthz",
        b"/metrics/../v1/models",
    ],
)
def test_path_tricks_do_not_reach_a_route_without_a_key(
    gateway: GatewayServer, upstream: MockUpstream, path: bytes
) -> None:
    """Paths dressed up to look public either find no route or need the key."""
    body = b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "Hi"}]}'
    head = (
        b"POST " + path + b" HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
        b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    status = int(raw_request(gateway, head, body).split(b" ", 2)[1])
    assert status in (400, 401, 404, 405)
    assert upstream.received == []


@pytest.fixture
def canary() -> Iterator[MockUpstream]:
    """A loopback server that should never hear from the gateway."""
    with MockUpstream() as server:
        yield server


@pytest.mark.parametrize("field", ["api_base", "base_url", "api_key", "custom_llm_provider"])
def test_a_body_cannot_choose_the_upstream(
    gateway: GatewayServer, upstream: MockUpstream, canary: MockUpstream, field: str
) -> None:
    """A body field naming another upstream or key (as other gateways honour) is a 400 on
    both APIs; neither the canary server nor the upstream hears anything."""
    with (
        openai.OpenAI(base_url=gateway.base_url, api_key=KEY, max_retries=0) as client,
        pytest.raises(openai.BadRequestError) as refused,
    ):
        client.chat.completions.create(**CHAT, extra_body={field: canary.base_url})  # type: ignore[call-overload]
    assert refused.value.code == "unsupported_parameter"
    assert refused.value.param == field
    with (
        anthropic.Anthropic(base_url=gateway.url, api_key=KEY, max_retries=0) as claude,
        pytest.raises(anthropic.BadRequestError),
    ):
        claude.messages.create(**CLAUDE, extra_body={field: canary.base_url})  # type: ignore[call-overload]
    assert canary.received == []
    assert upstream.received == []


def test_oversized_headers_are_431(gateway: GatewayServer, upstream: MockUpstream) -> None:
    """Headers over max_header_bytes are refused before anything else is done."""
    headers = {"authorization": f"Bearer {KEY}", "x-padding": "p" * 9_000}
    response = httpx.post(gateway.base_url + "/chat/completions", json=CHAT, headers=headers)
    assert response.status_code == 431
    assert response.json()["error"]["code"] == "headers_too_large"
    assert upstream.received == []


def test_a_body_that_does_not_arrive_in_time_is_408(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """A client that announces a body and sends only part of it gets a 408 once
    body_timeout passes, instead of holding the connection forever."""
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer " + KEY.encode() + b"\r\ncontent-length: 500\r\n\r\n"
    )
    started = time.monotonic()
    answer = raw_request(gateway, head, b'{"model": "gpt-4o", ')
    assert answer.startswith(b"HTTP/1.1 408")
    assert b"request_timeout" in answer
    assert time.monotonic() - started < 4
    assert upstream.received == []
