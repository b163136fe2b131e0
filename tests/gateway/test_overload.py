"""The shedder: a cap on requests in flight and on the event loop's lag, refused with a 503
``gateway_overloaded`` and ``Retry-After``; counted by reason."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import httpx

from gateway.errors import Overloaded
from gateway.overload import SUSTAINED, TICK, Shedder
from gateway.settings import AnthropicSettings, Settings, UpstreamSettings
from tests.harness import GatewayServer
from tests.mock_upstream import JSONReply, MockUpstream, chat_completion

AUTH = {"authorization": "Bearer sk-test"}
CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Hi"}]}
CLAUDE = {
    "model": "claude-sonnet-4-6",
    "max_tokens": 20,
    "messages": [{"role": "user", "content": "Hi"}],
}


def test_past_max_in_flight_a_request_is_refused_and_counted() -> None:
    """Two slots: the third request is refused with Retry-After; a release frees one."""
    shedder = Shedder(max_in_flight=2, max_queue_delay=None)
    assert shedder.admit() is None
    assert shedder.admit() is None
    refused = shedder.admit()
    assert isinstance(refused, Overloaded)
    assert refused.status == 503
    assert refused.code == "gateway_overloaded"
    assert refused.headers == {"retry-after": "1"}
    assert shedder.shed == {"in_flight": 1, "event_loop_lag": 0, "accept_queue": 0}
    shedder.release()
    assert shedder.admit() is None
    assert shedder.in_flight == 2


def test_without_limits_nothing_is_refused() -> None:
    """Both signals off: any number of requests is admitted."""
    shedder = Shedder(max_in_flight=None, max_queue_delay=None)
    assert not any(shedder.admit() for _ in range(10_000))
    assert shedder.in_flight == 10_000


async def test_one_long_stretch_is_not_overload_but_a_saturated_loop_is() -> None:
    """The loop blocked once for 0.3 s (a large request worked on): the next request is
    admitted. Blocked again and again, tick after tick: refused, until a timely tick."""
    shedder = Shedder(max_in_flight=None, max_queue_delay=0.1)
    shedder.start()
    try:
        await asyncio.sleep(TICK * 2)
        time.sleep(0.3)  # noqa: ASYNC251 -- the point: the loop is stuck
        for _ in range(2):  # the late tick runs
            await asyncio.sleep(0)
        assert shedder.lag > 0.1
        assert shedder.admit() is None
        for _ in range(SUSTAINED):
            time.sleep(0.2)  # noqa: ASYNC251 -- work after work, no idle moment
            for _ in range(2):  # the overdue tick runs, late again
                await asyncio.sleep(0)
        assert shedder.lag > 0.1
        assert isinstance(shedder.admit(), Overloaded)
        assert shedder.shed["event_loop_lag"] == 1
        await asyncio.sleep(TICK * 3)
        assert shedder.lag < 0.1
        assert shedder.admit() is None
        assert shedder.tasks >= 1
    finally:
        shedder.stop()


def test_over_the_cap_routes_answer_503_in_their_envelope_and_probes_still_answer(
    upstream: MockUpstream,
) -> None:
    """One slot, held by a slow request: chat gets the OpenAI envelope, messages
    Anthropic's, both with Retry-After; /healthz, /readyz and /metrics answer 200."""
    settings = Settings(
        upstream=UpstreamSettings(base_url=upstream.base_url),
        anthropic=AnthropicSettings(base_url=upstream.base_url.removesuffix("/v1")),
        summaries=False,
        max_in_flight=1,
    )
    upstream.push(JSONReply(chat_completion(), delay=1.0))
    with GatewayServer(settings) as server, httpx.Client(base_url=server.url) as client:
        holder = threading.Thread(
            target=client.post,
            args=("/v1/chat/completions",),
            kwargs={"json": CHAT, "headers": AUTH},
        )
        holder.start()
        deadline = time.monotonic() + 5
        while not upstream.in_flight and time.monotonic() < deadline:
            time.sleep(0.01)
        chat = client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
        messages = client.post("/v1/messages", json=CLAUDE, headers=AUTH)
        probes = [client.get(path).status_code for path in ("/healthz", "/readyz", "/metrics")]
        holder.join()
        metrics = client.get("/metrics").text
    assert chat.status_code == 503
    assert chat.headers["retry-after"] == "1"
    assert chat.json()["error"]["type"] == "server_error"
    assert chat.json()["error"]["code"] == "gateway_overloaded"
    assert messages.status_code == 503
    assert messages.headers["retry-after"] == "1"
    assert messages.json()["type"] == "error"
    assert messages.json()["error"]["type"] == "api_error"
    assert probes == [200, 200, 200]
    assert 'contextgate_overload_shed_total{reason="in_flight"} 2.0' in metrics
    assert "contextgate_admitted_in_flight 0.0" in metrics


async def test_a_burst_of_connections_is_not_overload_but_a_standing_queue_is() -> None:
    """A real listening socket: 16 connections completed and not yet accepted read as
    0.32 s of delay at the assumed minimum rate. At once, that is a pool opening its
    connections: admitted. Still waiting tick after tick: refused."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=64)
    clients = [socket.create_connection(listener.getsockname()) for _ in range(16)]
    shedder = Shedder(max_in_flight=None, max_queue_delay=0.1)
    shedder.listen_on([listener])
    shedder.start()
    try:
        assert shedder.accept_queue == 16
        assert shedder.queue_delay > 0.1
        assert shedder.admit() is None
        await asyncio.sleep(TICK * (SUSTAINED + 1))
        assert isinstance(shedder.admit(), Overloaded)
        assert shedder.shed["accept_queue"] == 1
        while shedder.accept_queue:
            listener.accept()[0].close()
        await asyncio.sleep(TICK * 2)
        assert shedder.admit() is None
    finally:
        shedder.stop()
        for client in clients:
            client.close()
        listener.close()
