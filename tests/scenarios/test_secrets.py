"""Canary secrets: after a run of successes, errors, streams, refusals and offloads, no
gateway key and no upstream key appears in the logs, the exported spans, any response,
the metrics, or any Redis key or value, raw or hashed with a public hash."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import secrets
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import redis

from gateway.tenancy.tenants import hash_key
from tests.harness import RedisServer, ServeProcess, redis_server
from tests.mock_upstream import JSONReply, MockUpstream, SSEReply, chat_completion, events_of
from tests.otlp_receiver import OTLPReceiver

MARK = secrets.token_hex(6)
GATEWAY_KEY = f"cg-canary-gateway-{MARK}-0123456789"
UPSTREAM_KEY = f"sk-canary-upstream-{MARK}-0123456789"
ANTHROPIC_KEY = f"sk-ant-canary-anthropic-{MARK}-0123"
CALLER_KEY = f"sk-canary-passthrough-{MARK}-01234"
"""A passthrough caller's own upstream key: it goes upstream, and nowhere else."""
CANARIES = (GATEWAY_KEY, UPSTREAM_KEY, ANTHROPIC_KEY, CALLER_KEY)


def forms(secret: str) -> list[str]:
    """The secret, and what a careless gateway would store instead of it."""
    raw = secret.encode()
    return [
        secret,
        hashlib.sha256(raw).hexdigest(),
        hashlib.sha1(raw).hexdigest(),
        hashlib.md5(raw).hexdigest(),
        hashlib.blake2b(raw).hexdigest(),
        base64.b64encode(raw).decode(),
        hash_key(secret).removeprefix("sha256:"),
        MARK,
    ]


FORBIDDEN = [form for secret in CANARIES for form in forms(secret)]


def leaks(text: str) -> list[str]:
    return [form for form in FORBIDDEN if form in text]


OUTPUT = "".join(f"row {i}: value {i * 7} and more words\n" for i in range(600))
TOOL_CALL = {"id": "c1", "type": "function", "function": {"name": "dump", "arguments": "{}"}}
HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "Dump the table."},
    {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
    {"role": "tool", "tool_call_id": "c1", "content": OUTPUT},
]


def key_echo(key: str) -> JSONReply:
    """A 401 quoting the key, as OpenAI's does."""
    error = {"message": f"Incorrect API key provided: {key}.", "type": "invalid_request_error"}
    return JSONReply({"error": {**error, "code": "invalid_api_key"}}, status=401)


def stream() -> SSEReply:
    chunk = {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-4o",
        "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}],
    }
    usage = {**chunk, "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 1}}
    return SSEReply(events_of([chunk, usage]))


@pytest.fixture(scope="module")
def private_redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


@pytest.fixture(scope="module")
def receiver() -> Iterator[OTLPReceiver]:
    with OTLPReceiver() as server:
        yield server


def exercise_tenant(base: str, upstream: MockUpstream) -> list[httpx.Response]:
    """Successes, offloads, streams and every kind of refusal, with the tenant's key."""
    answers: list[httpx.Response] = []
    headers = {
        "authorization": f"Bearer {GATEWAY_KEY}",
        "x-contextgate-policy": "filter-tokens=300",
    }
    chat = {"model": "gpt-4o", "messages": HISTORY}
    upstream.push(JSONReply(chat_completion()))
    answers.append(httpx.post(f"{base}/v1/chat/completions", json=chat, headers=headers))
    upstream.push(stream())
    answers.append(
        httpx.post(f"{base}/v1/chat/completions", json={**chat, "stream": True}, headers=headers)
    )
    upstream.push(key_echo(UPSTREAM_KEY), JSONReply({"error": "boom"}, status=500))
    for _ in range(2):
        answers.append(httpx.post(f"{base}/v1/chat/completions", json=chat, headers=headers))
    claude = {"model": "claude-sonnet-4-6", "max_tokens": 9, "messages": HISTORY[:1]}
    upstream.push(key_echo(ANTHROPIC_KEY))
    answers.append(
        httpx.post(f"{base}/v1/messages", json=claude, headers={"x-api-key": GATEWAY_KEY})
    )
    bad = [
        ({**headers, "x-contextgate-policy": "trigger=7"}, chat),
        ({**headers, "authorization": f"Bearer {GATEWAY_KEY}x"}, chat),
        (headers, {**chat, "api_base": "http://127.0.0.1:9/v1"}),
        (headers, {"model": "gpt-4o", "messages": "not a list"}),
        (headers, {**chat, "model": "not-allowed-model"}),
    ]
    for bad_headers, body in bad:
        answers.append(httpx.post(f"{base}/v1/chat/completions", json=body, headers=bad_headers))
    with openai.OpenAI(base_url=f"{base}/v1", api_key=GATEWAY_KEY, max_retries=0) as client:
        client.models.list()
    answers.append(httpx.get(f"{base}/v1/models", headers=headers))
    answers.append(httpx.get(f"{base}/v1/context/objects/ctx_{'A' * 24}", headers=headers))
    with anthropic.Anthropic(base_url=base, api_key=GATEWAY_KEY, max_retries=0) as sdk:
        upstream.push(key_echo(ANTHROPIC_KEY))
        with pytest.raises(anthropic.AuthenticationError):
            sdk.messages.create(**claude)
    return answers


def test_no_secret_leaks_anywhere(
    mock_upstream: MockUpstream,
    private_redis: RedisServer,
    receiver: OTLPReceiver,
    tmp_path: Path,
) -> None:
    """Tenant and passthrough gateways, traced, on one Redis, through a run with errors:
    the canary keys reach the upstream as credentials and nothing else anywhere."""
    upstream = mock_upstream
    upstream.reset()
    tenant = (
        f"upstream:\n  base_url: {upstream.base_url}\n  api_key: {UPSTREAM_KEY}\n"
        f"anthropic:\n  base_url: {upstream.base_url.removesuffix('/v1')}\n"
        f"  api_key: {ANTHROPIC_KEY}\n"
        f"redis_url: {private_redis.url}\nsummaries: false\n"
        "limits: {requests_per_minute: 1000, concurrency: 10}\n"
        "tenants:\n  - name: canary\n"
        f"    keys: ['{hash_key(GATEWAY_KEY)}']\n"
        "    models: ['gpt-4o*', 'claude-*']\n"
    )
    passthrough = (
        f"upstream:\n  base_url: {upstream.base_url}\n"
        f"redis_url: {private_redis.url}\nsummaries: false\n"
        "limits: {requests_per_minute: 1000}\n"
    )
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "20"}
    answers: list[httpx.Response] = []
    with (
        ServeProcess(tenant, str(tmp_path), "--log-level", "debug", env=env) as tenant_gateway,
        ServeProcess(passthrough, str(tmp_path), "--log-level", "debug", env=env) as open_gateway,
    ):
        answers += exercise_tenant(tenant_gateway.base_url.removesuffix("/v1"), upstream)
        caller = {
            "authorization": f"Bearer {CALLER_KEY}",
            "x-contextgate-policy": "filter-tokens=300",
        }
        upstream.push(JSONReply(chat_completion()), key_echo(CALLER_KEY))
        for _ in range(2):
            answers.append(
                httpx.post(
                    f"{open_gateway.base_url}/chat/completions",
                    json={"model": "gpt-4o", "messages": HISTORY},
                    headers=caller,
                )
            )
        metrics = httpx.get(tenant_gateway.base_url.removesuffix("/v1") + "/metrics").text
        metrics += httpx.get(open_gateway.base_url.removesuffix("/v1") + "/metrics").text
    logs = tenant_gateway.log() + open_gateway.log()

    statuses = sorted({answer.status_code for answer in answers})
    assert {200, 400, 401, 403, 404, 500}.issubset(statuses)
    assert "contextgate_requests_total" in metrics
    assert len(logs.splitlines()) >= len(answers)
    assert receiver.spans
    sent = {r.headers.get("authorization") or r.headers.get("x-api-key") for r in upstream.received}
    assert f"Bearer {UPSTREAM_KEY}" in sent  # the canaries are really in use

    for answer in answers:
        assert leaks(answer.text) == [], answer.request.url
        assert leaks(str(answer.headers)) == []
    assert leaks(logs) == []
    assert leaks(metrics) == []
    for span in receiver.spans:
        assert leaks(repr(span)) == [], span.name
    store = redis.Redis.from_url(private_redis.url)
    keys = list(store.scan_iter(count=1000))
    assert keys, "the run offloaded nothing"
    for key in keys:
        assert leaks(key.decode("latin-1")) == []
        kind = store.type(key).decode()
        if kind == "string":
            values = [store.get(key) or b""]
        elif kind == "hash":
            values = [v for pair in store.hgetall(key).items() for v in pair]
        elif kind == "zset":
            values = list(store.zrange(key, 0, -1))
        elif kind == "set":
            values = list(store.smembers(key))
        else:
            values = list(store.lrange(key, 0, -1))
        for value in values:
            if value.startswith(b"z"):  # a compressed object
                with contextlib.suppress(zlib.error):
                    value = b"z" + zlib.decompress(value[1:])
            assert leaks(value.decode("latin-1")) == [], key
    store.close()
