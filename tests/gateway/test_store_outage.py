"""The gateway while its Redis dies, stops answering, and comes back: every request is
answered within the store timeout and a margin, no placeholder is ever sent without a
stored copy behind it, and offloading resumes when Redis returns."""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from gateway.settings import Settings, StoreSettings, UpstreamSettings
from tests.harness import GatewayServer, RedisServer, redis_server
from tests.mock_upstream import JSONReply, MockUpstream, chat_completion

REF = re.compile(r"ctx_[A-Za-z0-9_-]{22,}")
TIMEOUT, COOLDOWN = 0.2, 0.5
MARGIN = 0.6
"""Allowance on top of the store timeout for the rest of the request on a noisy machine."""
serial = itertools.count()


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


def settings(upstream: MockUpstream, url: str) -> Settings:
    return Settings(
        upstream=UpstreamSettings(base_url=upstream.base_url),
        redis_url=url,
        store=StoreSettings(timeout=TIMEOUT, breaker_cooldown=COOLDOWN),
    )


def ask(gateway: GatewayServer, upstream: MockUpstream) -> tuple[float, str, bytes]:
    """One chat request carrying a fresh large tool output; (seconds taken, the output,
    what the upstream received)."""
    output = "".join(f"{next(serial)} result row {i}: status ok\n" for i in range(120))
    call = {"id": "c1", "type": "function", "function": {"name": "query", "arguments": "{}"}}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Run the query."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": output},
    ]
    upstream.push(JSONReply(chat_completion()))
    started = time.monotonic()
    response = httpx.post(
        f"{gateway.base_url}/chat/completions",
        json={"model": "gpt-4o", "messages": messages},
        headers={"authorization": "Bearer sk-outage", "x-contextgate-policy": "filter-tokens=300"},
        timeout=10,
    )
    elapsed = time.monotonic() - started
    assert response.status_code == 200
    return elapsed, output, upstream.received[-1].body


def restores(gateway: GatewayServer, sent: bytes) -> bool:
    """Every ref in ``sent`` restores through the endpoint."""
    refs = REF.findall(sent.decode())
    assert refs
    return all(
        httpx.get(
            f"{gateway.base_url}/context/objects/{ref}",
            headers={"authorization": "Bearer sk-outage"},
        ).status_code
        == 200
        for ref in refs
    )


def ready(gateway: GatewayServer) -> str:
    return str(httpx.get(f"{gateway.url}/readyz").json()["status"])


def test_redis_killed_then_back(upstream: MockUpstream, redis: RedisServer) -> None:
    with GatewayServer(settings(upstream, redis.url)) as gateway:
        _, output, sent = ask(gateway, upstream)
        assert output.encode() not in sent
        assert restores(gateway, sent)

        redis.kill()
        for _ in range(5):
            elapsed, output, sent = ask(gateway, upstream)
            assert elapsed < TIMEOUT + MARGIN
            assert REF.search(sent.decode()) is None  # nothing stored, nothing replaced
            assert orjson.loads(sent)["messages"][2]["content"] == output
        assert ready(gateway) == "degraded"

        redis.start()
        time.sleep(COOLDOWN + 0.1)
        deadline = time.monotonic() + 5
        while True:
            _, output, sent = ask(gateway, upstream)
            if REF.search(sent.decode()) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert output.encode() not in sent
        assert restores(gateway, sent)
        assert ready(gateway) == "ready"


def test_redis_paused_then_resumed(upstream: MockUpstream, redis: RedisServer) -> None:
    with GatewayServer(settings(upstream, redis.url)) as gateway:
        ask(gateway, upstream)
        redis.pause()
        try:
            for _ in range(4):
                elapsed, output, sent = ask(gateway, upstream)
                assert elapsed < TIMEOUT + MARGIN
                assert REF.search(sent.decode()) is None
                assert orjson.loads(sent)["messages"][2]["content"] == output
        finally:
            redis.resume()
        time.sleep(COOLDOWN + 0.1)
        deadline = time.monotonic() + 5
        while True:
            _, output, sent = ask(gateway, upstream)
            if REF.search(sent.decode()) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert output.encode() not in sent
        assert restores(gateway, sent)


def test_starting_with_redis_down_then_it_comes_up(upstream: MockUpstream) -> None:
    server = RedisServer()
    try:
        with GatewayServer(settings(upstream, server.url)) as gateway:
            _, output, sent = ask(gateway, upstream)
            assert orjson.loads(sent)["messages"][2]["content"] == output
            assert ready(gateway) == "degraded"
            server.start()
            time.sleep(COOLDOWN + 0.1)
            deadline = time.monotonic() + 5
            while True:
                _, output, sent = ask(gateway, upstream)
                if REF.search(sent.decode()) or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert restores(gateway, sent)
            assert ready(gateway) == "ready"
    finally:
        server.stop()
