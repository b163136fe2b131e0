"""Tenants: gateway keys (held as hashes) admit callers, keep their offloaded content
apart, and are never sent upstream; the tenant's own upstream key is."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from gateway.settings import ConfigError, Settings, TenantSettings, UpstreamSettings
from gateway.tenants import hash_key
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


def test_tenant_configuration_is_checked() -> None:
    with pytest.raises(ConfigError, match="not a key hash"):
        TenantSettings("alpha", ("cg-the-raw-key",))
    with pytest.raises(ConfigError, match="lower-case"):
        TenantSettings("Alpha Team", (hash_key(ALPHA),))
    with pytest.raises(ConfigError, match="no upstream key"):
        Settings(tenants=(TenantSettings("alpha", (hash_key(ALPHA),)),))
    with pytest.raises(ConfigError, match="two tenants"):
        Settings(
            upstream=UpstreamSettings(api_key="sk-x"),
            tenants=(
                TenantSettings("alpha", (hash_key(ALPHA),)),
                TenantSettings("beta", (hash_key(ALPHA),)),
            ),
        )


def test_hash_key_command() -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "hash-key"],
        input=ALPHA + "\n",
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert printed == hash_key(ALPHA)
    new = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "hash-key", "--new"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert len(new) == 2
    assert hash_key(new[0]) == new[1]
