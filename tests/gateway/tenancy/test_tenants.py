"""Tenants: gateway keys (held as hashes) admit callers, keep their offloaded content
apart, and are never sent upstream; the tenant's own upstream key is."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from gateway.config import (
    AnthropicSettings,
    Settings,
    TenantSettings,
    UpstreamSettings,
)
from gateway.tenancy.auth import credential_of
from gateway.tenancy.tenants import hash_key
from tests.harness import GatewayServer
from tests.mock_upstream import JSONReply, MockUpstream, chat_completion

REF = re.compile(r"ctx_[A-Za-z0-9_-]{22,}")
ALPHA, BETA = "cg-alpha-key-0123456789abcdef", "cg-beta-key-0123456789abcdef"


@pytest.fixture
def gateway(upstream: MockUpstream, redis_url: str) -> Iterator[GatewayServer]:
    settings = Settings(
        upstream=UpstreamSettings(base_url=upstream.base_url, api_key="sk-shared-upstream"),
        redis_url=redis_url,
        tenants=(
            TenantSettings("alpha", (hash_key(ALPHA),), upstream_api_key="sk-alpha-upstream"),
            TenantSettings("beta", (hash_key(BETA),)),
        ),
    )
    with GatewayServer(settings) as server:
        yield server


def chat(gateway: GatewayServer, key: str | None, output: str) -> httpx.Response:
    call = {"id": "c1", "type": "function", "function": {"name": "dump", "arguments": "{}"}}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Dump the table."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": output},
    ]
    headers = {"x-contextgate-policy": "filter-tokens=300"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    return httpx.post(
        f"{gateway.base_url}/chat/completions",
        json={"model": "gpt-4o", "messages": messages},
        headers=headers,
    )


OUTPUT = "".join(f"row {i}: value {i * 7}\n" for i in range(400))


def test_each_tenant_reads_only_its_own_objects(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    upstream.push(JSONReply(chat_completion()))
    assert chat(gateway, ALPHA, OUTPUT).status_code == 200
    sent = upstream.received[-1]
    ref = REF.search(sent.body.decode()).group()  # type: ignore[union-attr]
    assert sent.headers["authorization"] == "Bearer sk-alpha-upstream"
    assert ALPHA not in orjson.dumps(sent.headers).decode()

    def fetch(key: str) -> httpx.Response:
        return httpx.get(f"{gateway.base_url}/context/objects/{ref}", headers={"x-api-key": key})

    assert fetch(ALPHA).content == OUTPUT.encode()
    assert fetch(BETA).status_code == 404


def test_beta_uses_the_shared_upstream_key(gateway: GatewayServer, upstream: MockUpstream) -> None:
    upstream.push(JSONReply(chat_completion()))
    assert chat(gateway, BETA, "short").status_code == 200
    assert upstream.received[-1].headers["authorization"] == "Bearer sk-shared-upstream"


@pytest.mark.parametrize("key", [None, "cg-not-a-tenant-key-0000000000"])
def test_no_or_unknown_key_is_401_and_nothing_goes_upstream(
    gateway: GatewayServer, upstream: MockUpstream, key: str | None
) -> None:
    response = chat(gateway, key, "short")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
    models = httpx.get(f"{gateway.base_url}/models")
    objects = httpx.get(f"{gateway.base_url}/context/objects/ctx_" + "A" * 24)
    assert (models.status_code, objects.status_code) == (401, 401)
    assert upstream.received == []


# -- what each tenant may do -----------------------------------------------------------------

GAMMA = "cg-gamma-key-0123456789abcdef"
GAMMA_OLD = "cg-gamma-old-key-0123456789ab"


CLAUDE_ANSWER = {
    "id": "msg_01",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-6",
    "content": [{"type": "text", "text": "Hello."}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 20, "output_tokens": 2},
}


def gamma_settings(upstream: MockUpstream, redis_url: str, *keys: str) -> Settings:
    """Gamma may use gpt-4o models and Claude, runs in truncate mode, and its callers may
    tune max-input only within 8,000-64,000, mode only to truncate or off, and never the
    summary model. Beta, the shared tenant, has the built-in bounds."""
    return Settings(
        upstream=UpstreamSettings(base_url=upstream.base_url, api_key="sk-shared-upstream"),
        anthropic=AnthropicSettings(base_url=upstream.base_url.removesuffix("/v1")),
        redis_url=redis_url,
        summaries=False,
        tenants=(
            TenantSettings(
                "gamma",
                tuple(hash_key(key) for key in keys),
                anthropic_api_key="sk-ant-gamma-upstream",
                models=("gpt-4o*", "claude-*"),
                policy={"mode": "truncate", "keep-images": 1},
                bounds={
                    "max-input": [8000, 64000],
                    "mode": ["truncate", "off"],
                    "summary-model": False,
                },
            ),
            TenantSettings("beta", (hash_key(BETA),)),
        ),
    )


@pytest.fixture(scope="module")
def gamma(mock_upstream: MockUpstream, redis_url: str) -> Iterator[GatewayServer]:
    with GatewayServer(gamma_settings(mock_upstream, redis_url, GAMMA, GAMMA_OLD)) as server:
        yield server


def dry_run(gateway: GatewayServer, key: str, policy: str | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"}
    if policy is not None:
        headers["x-contextgate-policy"] = policy
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Hello."}]}
    return httpx.post(f"{gateway.base_url}/context/compact", json=body, headers=headers)


def test_a_model_outside_the_tenant_list_is_403_in_each_envelope(
    gamma: GatewayServer, upstream: MockUpstream
) -> None:
    """Gamma's key cannot use a model its tenant does not list, on either API, and the
    request never reaches the upstream."""
    with (
        openai.OpenAI(base_url=gamma.base_url, api_key=GAMMA, max_retries=0) as client,
        pytest.raises(openai.PermissionDeniedError) as refused,
    ):
        client.chat.completions.create(
            model="o3-mini", messages=[{"role": "user", "content": "Hi"}]
        )
    assert refused.value.code == "model_not_allowed"
    assert "o3-mini" in refused.value.message
    with (
        anthropic.Anthropic(base_url=gamma.url, api_key=GAMMA, max_retries=0) as claude,
        pytest.raises(anthropic.PermissionDeniedError) as denied,
    ):
        claude.messages.create(
            model="gpt-3.5-turbo", max_tokens=50, messages=[{"role": "user", "content": "Hi"}]
        )
    assert denied.value.body["error"]["type"] == "permission_error"  # type: ignore[index]
    assert upstream.received == []


def test_models_lists_only_what_the_tenant_may_use(
    gamma: GatewayServer, upstream: MockUpstream
) -> None:
    """GET /v1/models shows gamma the upstream's models its globs admit; beta sees all."""
    listing = {
        "object": "list",
        "data": [
            {"id": name, "object": "model", "created": 1, "owned_by": "mock"}
            for name in ("gpt-4o", "gpt-4o-mini", "o3-mini", "text-embedding-3-small")
        ],
    }
    upstream.push(JSONReply(listing), JSONReply(listing))
    with openai.OpenAI(base_url=gamma.base_url, api_key=GAMMA) as client:
        assert [m.id for m in client.models.list().data] == ["gpt-4o", "gpt-4o-mini"]
    with openai.OpenAI(base_url=gamma.base_url, api_key=BETA) as client:
        assert len(client.models.list().data) == 4
    assert upstream.received[0].headers["authorization"] == "Bearer sk-shared-upstream"


def test_policy_resolves_built_in_then_tenant_then_header(gamma: GatewayServer) -> None:
    """A request runs under the built-in defaults, overridden by its tenant's policy, then
    by its header, as the dry run reports."""
    policy = dry_run(gamma, GAMMA).json()["policy"]
    assert (policy["mode"], policy["keep-images"], policy["trigger"]) == ("truncate", 1, 0.7)
    tuned = dry_run(gamma, GAMMA, "mode=off, max-input=9000, keep-images=3").json()["policy"]
    assert (tuned["mode"], tuned["max-input"], tuned["keep-images"]) == ("off", 9000, 3)
    assert dry_run(gamma, BETA).json()["policy"]["mode"] == "summarize"


@pytest.mark.parametrize(
    ("header", "key", "says"),
    [
        ("max-input=100000", "max-input", "between 8000 and 64000"),
        ("max-input=4000", "max-input", "between 8000 and 64000"),
        ("mode=summarize", "mode", "one of truncate, off"),
        ("summary-model=gpt-4o", "summary-model", "callers may not change it"),
    ],
)
def test_a_tenant_bound_refuses_the_header_naming_key_and_range(
    gamma: GatewayServer, header: str, key: str, says: str
) -> None:
    """Gamma's bounds turn a header value outside them into a 400 naming the key and
    what it may be; beta, with the built-in bounds, may send the same value."""
    refused = dry_run(gamma, GAMMA, header)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "invalid_policy"
    assert error["param"] == f"x-contextgate-policy.{key}"
    assert says in error["message"]
    assert dry_run(gamma, BETA, header).status_code == 200


def test_each_tenant_sends_its_own_anthropic_key(
    gamma: GatewayServer, upstream: MockUpstream
) -> None:
    """Claude requests go with the tenant's own Anthropic key; a tenant without one (and no
    global key) is told the provider is not configured."""
    upstream.push(JSONReply(CLAUDE_ANSWER))
    with anthropic.Anthropic(base_url=gamma.url, api_key=GAMMA, max_retries=0) as claude:
        claude.messages.create(
            model="claude-sonnet-4-6", max_tokens=50, messages=[{"role": "user", "content": "Hi"}]
        )
    sent = upstream.received[-1].headers
    assert credential_of(sent) == "sk-ant-gamma-upstream"
    assert GAMMA not in orjson.dumps(sent).decode()
    with (
        openai.OpenAI(base_url=gamma.base_url, api_key=BETA, max_retries=0) as beta,
        pytest.raises(openai.BadRequestError) as refused,
    ):
        beta.chat.completions.create(
            model="claude-sonnet-4-6", messages=[{"role": "user", "content": "Hi"}]
        )
    assert refused.value.code == "provider_not_configured"


def test_a_tenant_conversation_is_invisible_to_another(
    gamma: GatewayServer, upstream: MockUpstream
) -> None:
    """The same conversation id names two conversations under two tenants: gamma's record
    (which predicts a cache break when its system prompt changes) is not beta's."""
    conversation = {"x-contextgate-conversation": "shared-name-1"}

    def send(key: str, system: str) -> httpx.Response:
        upstream.push(JSONReply(chat_completion()))
        messages = [{"role": "system", "content": system}, {"role": "user", "content": "Hi"}]
        return httpx.post(
            f"{gamma.base_url}/chat/completions",
            json={"model": "gpt-4o", "messages": messages},
            headers={"authorization": f"Bearer {key}", **conversation},
        )

    assert "x-contextgate-cache-break" not in send(GAMMA, "You are terse.").headers
    time.sleep(0.3)  # the record is stored in the background
    assert send(GAMMA, "You are verbose.").headers["x-contextgate-cache-break"] == "system"
    assert "x-contextgate-cache-break" not in send(BETA, "You are chatty.").headers


def test_a_revoked_key_is_401_and_the_tenant_keeps_its_objects(
    gamma: GatewayServer, upstream: MockUpstream, redis_url: str
) -> None:
    """A key removed from the tenant's list is refused by a gateway started without it,
    while the tenant's other key still reads what the old key offloaded."""
    upstream.push(JSONReply(chat_completion()))
    assert chat(gamma, GAMMA_OLD, OUTPUT).status_code == 200
    ref = REF.search(upstream.received[-1].body.decode()).group()  # type: ignore[union-attr]
    with GatewayServer(gamma_settings(upstream, redis_url, GAMMA)) as revoked:
        refused = chat(revoked, GAMMA_OLD, "short")
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "invalid_api_key"
        kept = httpx.get(f"{revoked.base_url}/context/objects/{ref}", headers={"x-api-key": GAMMA})
        assert kept.content == OUTPUT.encode()


def test_an_upstream_error_never_echoes_the_tenant_key(
    gamma: GatewayServer, upstream: MockUpstream
) -> None:
    """Providers quote the key in a 401; the tenant's caller gets the error with the
    gateway's key (OpenAI's or Anthropic's) redacted, on both APIs."""
    openai_error = {
        "error": {
            "message": "Incorrect API key provided: sk-shared-upstream. Find your key at ...",
            "type": "invalid_request_error",
            "code": "invalid_api_key",
        }
    }
    claude_error = {
        "type": "error",
        "error": {"type": "authentication_error", "message": "bad key sk-ant-gamma-upstream"},
    }
    upstream.push(JSONReply(openai_error, status=401), JSONReply(claude_error, status=401))
    relayed = httpx.post(
        f"{gamma.base_url}/chat/completions",
        json={"model": "gpt-4o", "messages": [{"role": "user", "content": "Hi"}]},
        headers={"authorization": f"Bearer {BETA}"},
    )
    claude = httpx.post(
        f"{gamma.url}/v1/messages",
        json={
            "model": "claude-sonnet-4-6",
            "max_tokens": 9,
            "messages": [{"role": "user", "content": "Hi"}],
        },
        headers={"x-api-key": GAMMA},
    )
    assert (relayed.status_code, claude.status_code) == (401, 401)
    assert "Incorrect API key provided: [redacted]." in relayed.json()["error"]["message"]
    assert claude.json()["error"]["message"] == "bad key [redacted]"
    assert "sk-shared-upstream" not in relayed.text
    assert "sk-ant-gamma-upstream" not in claude.text
