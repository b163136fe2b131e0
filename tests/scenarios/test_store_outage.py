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

from gateway.config import Settings, StoreSettings, UpstreamSettings
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
        summaries=False,  # no background calls taking the mock's scripted replies
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


def answered_keeping_content(gateway: GatewayServer, upstream: MockUpstream) -> None:
    """While the store is out: answered within the timeout and a margin, nothing replaced
    (nothing was stored)."""
    elapsed, output, sent = ask(gateway, upstream)
    assert elapsed < TIMEOUT + MARGIN
    assert REF.search(sent.decode()) is None
    assert orjson.loads(sent)["messages"][2]["content"] == output


def offloading_again(gateway: GatewayServer, upstream: MockUpstream) -> tuple[str, bytes]:
    """After the store is back and the breaker's cool-down: requests until one offloads
    again (5 s at most); its output and what the upstream received."""
    time.sleep(COOLDOWN + 0.1)
    deadline = time.monotonic() + 5
    while True:
        _, output, sent = ask(gateway, upstream)
        if REF.search(sent.decode()) or time.monotonic() > deadline:
            return output, sent
        time.sleep(0.1)


def ready(gateway: GatewayServer) -> str:
    return str(httpx.get(f"{gateway.url}/readyz").json()["status"])


def test_redis_killed_then_back(upstream: MockUpstream, redis: RedisServer) -> None:
    with GatewayServer(settings(upstream, redis.url)) as gateway:
        _, output, sent = ask(gateway, upstream)
        assert output.encode() not in sent
        assert restores(gateway, sent)

        redis.kill()
        for _ in range(5):
            answered_keeping_content(gateway, upstream)
        assert ready(gateway) == "degraded"

        redis.start()
        output, sent = offloading_again(gateway, upstream)
        assert output.encode() not in sent
        assert restores(gateway, sent)
        assert ready(gateway) == "ready"


def test_redis_paused_then_resumed(upstream: MockUpstream, redis: RedisServer) -> None:
    with GatewayServer(settings(upstream, redis.url)) as gateway:
        ask(gateway, upstream)
        redis.pause()
        try:
            for _ in range(4):
                answered_keeping_content(gateway, upstream)
        finally:
            redis.resume()
        output, sent = offloading_again(gateway, upstream)
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
            _, sent = offloading_again(gateway, upstream)
            assert restores(gateway, sent)
            assert ready(gateway) == "ready"
    finally:
        server.stop()


class SlowProxy:
    """A TCP proxy in front of Redis that holds every answer back ``delay`` seconds: a
    Redis that answers, but slowly."""

    def __init__(self, port: int, delay: float) -> None:
        import asyncio
        import contextlib
        import threading

        self.target, self.delay = port, delay
        self.loop = asyncio.new_event_loop()
        self.port = 0
        started = threading.Event()

        async def serve() -> None:
            server = await asyncio.start_server(self._client, "127.0.0.1", 0)
            self.port = server.sockets[0].getsockname()[1]
            started.set()
            async with server:
                await server.serve_forever()

        def run() -> None:
            self.task = self.loop.create_task(serve())
            with contextlib.suppress(asyncio.CancelledError):
                self.loop.run_until_complete(self.task)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        started.wait(5)

    async def _client(self, reader: Any, writer: Any) -> None:
        import asyncio

        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.target)

        async def pipe(source: Any, sink: Any, delay: float) -> None:
            try:
                while data := await source.read(65536):
                    if delay:
                        await asyncio.sleep(delay)
                    sink.write(data)
                    await sink.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                sink.close()

        await asyncio.gather(
            pipe(reader, upstream_writer, 0.0), pipe(upstream_reader, writer, self.delay)
        )

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.task.cancel)
        self.thread.join(5)


def test_a_slow_redis_costs_a_request_at_most_the_store_timeout(
    upstream: MockUpstream, redis: RedisServer
) -> None:
    """Every answer 35 ms late, under the 0.2 s timeout, so nothing trips the breaker: a
    request offloading 40 outputs would wait 40 round trips (1.4 s); with one store
    deadline per request it waits at most about the timeout, and what it had no time to
    store stays in place (how many got stored depends on the machine's speed)."""
    proxy = SlowProxy(redis.port, 0.035)
    try:
        with GatewayServer(settings(upstream, f"redis://127.0.0.1:{proxy.port}/0")) as gateway:
            call = {"id": "c0", "type": "function", "function": {"name": "q", "arguments": "{}"}}
            messages: list[dict[str, Any]] = [{"role": "user", "content": "Run them all."}]
            for n in range(40):
                output = "".join(f"{n}-{next(serial)} row {i}: ok\n" for i in range(120))
                messages += [
                    {"role": "assistant", "content": None, "tool_calls": [{**call, "id": f"c{n}"}]},
                    {"role": "tool", "tool_call_id": f"c{n}", "content": output},
                ]
            upstream.push(JSONReply(chat_completion()))
            started = time.monotonic()
            response = httpx.post(
                f"{gateway.base_url}/chat/completions",
                json={"model": "gpt-4o", "messages": messages},
                headers={
                    "authorization": "Bearer sk-slow",
                    "x-contextgate-policy": "filter-tokens=300",
                },
                timeout=30,
            )
            elapsed = time.monotonic() - started
            assert response.status_code == 200
            sent = orjson.loads(upstream.received[-1].body)["messages"]
            kept = sum(1 for m in sent if m["role"] == "tool" and not m["content"].startswith("["))
            assert elapsed < 2 * TIMEOUT + MARGIN  # the record's read, then the offloads
            assert kept > 0  # outputs stayed in place once the request's store time was used up
    finally:
        proxy.close()
