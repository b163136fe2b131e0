"""Liveness and readiness probes."""

from __future__ import annotations

import time

import httpx

from gateway.config import Settings, UpstreamSettings
from tests.harness import GatewayServer, free_port
from tests.mock_upstream import MockUpstream


def test_healthz(gateway: GatewayServer) -> None:
    """The liveness probe answers 200 ok."""
    response = httpx.get(f"{gateway.url}/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_readyz_with_reachable_redis(gateway: GatewayServer) -> None:
    """With its Redis answering, the gateway is ready and says it stores in Redis."""
    response = httpx.get(f"{gateway.url}/readyz")
    assert response.status_code == 200
    body = response.json()
    assert (body["status"], body["store"]) == ("ready", "redis")
    assert isinstance(body["store_failures"], int)


def test_readyz_degraded_when_redis_is_down(upstream: MockUpstream) -> None:
    """With its Redis down the gateway still starts and serves, and reports degraded."""
    settings = Settings(
        upstream=UpstreamSettings(base_url=upstream.base_url),
        redis_url=f"redis://127.0.0.1:{free_port()}/0",
    )
    with GatewayServer(settings) as server:
        ready = httpx.get(f"{server.url}/readyz")
        chat = httpx.post(
            f"{server.base_url}/chat/completions",
            json={"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]},
        )
    assert ready.status_code == 200
    assert ready.json()["status"] == "degraded"
    assert ready.json()["store"] == "redis-unreachable"
    assert ready.json()["store_failures"] >= 1
    assert chat.status_code == 200


def test_readyz_without_redis(upstream: MockUpstream) -> None:
    """With no Redis configured the store is in memory and the gateway is ready."""
    with GatewayServer(Settings(upstream=UpstreamSettings(base_url=upstream.base_url))) as server:
        # Ready at once; warm once the encoding has loaded in the background.
        deadline = time.monotonic() + 30
        while not (response := httpx.get(f"{server.url}/readyz")).json()["warm"]:
            assert response.json()["status"] == "ready"
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert response.json() == {
        "status": "ready",
        "store": "memory",
        "store_failures": 0,
        "warm": True,
    }
