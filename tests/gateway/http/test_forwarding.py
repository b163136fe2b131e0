"""What crosses to the upstream: headers in, headers out, and a configured key."""

from __future__ import annotations

import httpx
import openai

from gateway.http.forwarding import relayable_response_headers, upstream_request_headers
from tests.conftest import settings_for
from tests.harness import GatewayServer
from tests.mock_upstream import JSONReply, MockUpstream, chat_completion


def test_request_headers_drop_hop_by_hop_and_gateway_headers() -> None:
    """Hop-by-hop, host, length, encoding and x-contextgate-* headers are not forwarded;
    the caller's own headers are."""
    headers = upstream_request_headers(
        [
            ("Host", "gateway"),
            ("Connection", "keep-alive"),
            ("Content-Length", "10"),
            ("Accept-Encoding", "br"),
            ("X-ContextGate-Policy", "mode=off"),
            ("Authorization", "Bearer sk-1"),
            ("OpenAI-Organization", "org-1"),
            ("X-Stainless-Lang", "python"),
            ("Cookie", "a=b"),
        ],
        api_key=None,
    )
    assert headers == {
        "authorization": "Bearer sk-1",
        "openai-organization": "org-1",
        "x-stainless-lang": "python",
    }


def test_configured_key_replaces_callers() -> None:
    """With an upstream key configured, the caller's key is not what the upstream sees."""
    headers = upstream_request_headers(
        [("authorization", "Bearer caller"), ("x-api-key", "k")], api_key="sk-server"
    )
    assert headers == {"authorization": "Bearer sk-server"}


def test_a_key_sent_as_x_api_key_goes_as_authorization() -> None:
    """Without a configured key, a caller's key presented only as ``x-api-key`` (Anthropic's
    clients) goes as the Authorization OpenAI-compatible upstreams read; a caller's own
    Authorization is left as it is."""
    assert upstream_request_headers([("x-api-key", "sk-1")], api_key=None) == {
        "authorization": "Bearer sk-1"
    }
    both = upstream_request_headers(
        [("authorization", "Basic dTpw"), ("x-api-key", "sk-1")], api_key=None
    )
    assert both == {"authorization": "Basic dTpw", "x-api-key": "sk-1"}


def test_response_headers_relayed_without_hop_by_hop() -> None:
    """Rate-limit and request-id headers are relayed; framing and cookies are not."""
    upstream = httpx.Headers(
        [
            ("x-request-id", "r1"),
            ("x-ratelimit-remaining-requests", "9"),
            ("transfer-encoding", "chunked"),
            ("content-length", "5"),
            ("set-cookie", "a=b"),
            ("retry-after", "3"),
        ]
    )
    assert relayable_response_headers(upstream) == [
        ("x-request-id", "r1"),
        ("x-ratelimit-remaining-requests", "9"),
        ("retry-after", "3"),
    ]


def test_gateway_uses_configured_key(upstream: MockUpstream) -> None:
    """A gateway configured with an upstream key sends that key, whatever the caller sends."""
    upstream.push(JSONReply(chat_completion()))
    with (
        GatewayServer(settings_for(upstream, api_key="sk-server-side")) as server,
        openai.OpenAI(base_url=server.base_url, api_key="sk-caller", max_retries=0) as client,
    ):
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    assert upstream.received[0].headers["authorization"] == "Bearer sk-server-side"
