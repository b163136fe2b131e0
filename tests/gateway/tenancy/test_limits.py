"""Per-tenant rate and concurrency limits: 429 with Retry-After, shared by replicas through
Redis, counted in the process without it, and open when Redis is down."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import (
    LimitSettings,
    Settings,
    StoreSettings,
    TenantSettings,
    UpstreamSettings,
)
from gateway.tenancy.tenants import hash_key
from tests.harness import GatewayServer, redis_server
from tests.mock_upstream import JSONReply, MockUpstream, SSEReply, chat_completion, events_of

CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Hi"}]}
_names = itertools.count()


def limited(upstream: MockUpstream, redis_url: str | None, key: str, **limits: int) -> Settings:
    """A gateway whose one tenant (named afresh, so its counters start empty in a shared
    Redis) has ``limits``."""
    tenant = TenantSettings(
        f"limited-{next(_names)}-{threading.get_ident()}",
        (hash_key(key),),
        limits=LimitSettings(**limits),
    )
    return Settings(
        upstream=UpstreamSettings(base_url=upstream.base_url, api_key="sk-upstream-key"),
        redis_url=redis_url,
        store=StoreSettings(timeout=0.2, breaker_cooldown=60),
        tenants=(tenant,),
        summaries=False,
    )


def chat(gateway: GatewayServer, key: str) -> httpx.Response:
    return httpx.post(
        f"{gateway.base_url}/chat/completions",
        json=CHAT,
        headers={"authorization": f"Bearer {key}"},
    )


def metric(gateway: GatewayServer, name: str) -> float:
    text = httpx.get(gateway.url + "/metrics").text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    )


KEY = "cg-limited-key-0123456789abcdef"


@pytest.mark.parametrize("store", ["redis", "memory"])
def test_over_the_rate_is_429_with_retry_after(
    upstream: MockUpstream, redis_url: str, store: str
) -> None:
    """Three requests a minute: a burst of three passes, the fourth is a 429 saying to
    come back in 20 s, the SDK sees a RateLimitError, and the upstream only the three."""
    settings = limited(
        upstream, redis_url if store == "redis" else None, KEY, requests_per_minute=3
    )
    with GatewayServer(settings) as gateway:
        assert [chat(gateway, KEY).status_code for _ in range(3)] == [200, 200, 200]
        refused = chat(gateway, KEY)
        assert refused.status_code == 429
        assert 19 <= int(refused.headers["retry-after"]) <= 20
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        with (
            openai.OpenAI(base_url=gateway.base_url, api_key=KEY, max_retries=0) as client,
            pytest.raises(openai.RateLimitError),
        ):
            client.chat.completions.create(**CHAT)  # type: ignore[call-overload]
        with (
            anthropic.Anthropic(base_url=gateway.url, api_key=KEY, max_retries=0) as claude,
            pytest.raises(anthropic.RateLimitError) as messages,
        ):
            claude.messages.create(
                model="gpt-4o", max_tokens=10, messages=[{"role": "user", "content": "Hi"}]
            )
        assert messages.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
        assert len(upstream.received) == 3
        assert metric(gateway, "contextgate_rate_limited_total") == 3


def test_replicas_share_one_rate(upstream: MockUpstream, redis_url: str) -> None:
    """Two replicas on one Redis count one allowance: two requests on the first leave the
    second replica one."""
    settings = limited(upstream, redis_url, KEY, requests_per_minute=3)
    with GatewayServer(settings) as first, GatewayServer(settings) as second:
        assert [chat(first, KEY).status_code for _ in range(2)] == [200, 200]
        assert [chat(second, KEY).status_code for _ in range(2)] == [200, 429]
        assert chat(first, KEY).status_code == 429


def slow_stream() -> SSEReply:
    chunk = {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-4o",
        "choices": [{"index": 0, "delta": {"content": "word "}, "finish_reason": None}],
    }
    return SSEReply(events_of([chunk] * 10), interval=0.1)


@pytest.mark.parametrize("store", ["redis", "memory"])
def test_a_stream_holds_its_slot_until_its_end(
    upstream: MockUpstream, redis_url: str, store: str
) -> None:
    """With one request at a time, a second request is refused while a stream is still
    being relayed, and admitted once it has ended."""
    settings = limited(upstream, redis_url if store == "redis" else None, KEY, concurrency=1)
    upstream.push(slow_stream())
    with (
        GatewayServer(settings) as gateway,
        httpx.stream(
            "POST",
            f"{gateway.base_url}/chat/completions",
            json={**CHAT, "stream": True},
            headers={"authorization": f"Bearer {KEY}"},
        ) as streaming,
    ):
        lines = streaming.iter_lines()
        next(lines)
        busy = chat(gateway, KEY)
        assert busy.status_code == 429
        assert busy.headers["retry-after"] == "1"
        assert "1 requests at once" in busy.json()["error"]["message"]
        assert sum(1 for line in lines if line.startswith("data:")) >= 9
        streaming.close()
        upstream.push(JSONReply(chat_completion()))
        assert chat(gateway, KEY).status_code == 200


def test_a_cancelled_request_gives_its_slot_back(upstream: MockUpstream, redis_url: str) -> None:
    """A client that leaves in the middle of a stream frees its slot."""
    settings = limited(upstream, redis_url, KEY, concurrency=1)
    upstream.push(slow_stream())
    with GatewayServer(settings) as gateway:
        with httpx.stream(
            "POST",
            f"{gateway.base_url}/chat/completions",
            json={**CHAT, "stream": True},
            headers={"authorization": f"Bearer {KEY}"},
        ) as streaming:
            next(streaming.iter_lines())
        assert upstream.wait_for_disconnect(5) is not None
        upstream.push(JSONReply(chat_completion()))
        assert chat(gateway, KEY).status_code == 200


def test_passthrough_limits_each_upstream_key(upstream: MockUpstream, redis_url: str) -> None:
    """Without tenants the deployment's limits apply to each caller's own key."""
    settings = Settings(
        upstream=UpstreamSettings(base_url=upstream.base_url),
        redis_url=redis_url,
        limits=LimitSettings(requests_per_minute=1),
        summaries=False,
    )
    first, second = (f"sk-caller-{n}-{next(_names)}-0123456789" for n in (1, 2))
    with GatewayServer(settings) as gateway:
        assert [chat(gateway, first).status_code for _ in range(2)] == [200, 429]
        assert chat(gateway, second).status_code == 200


def test_limits_open_when_redis_is_down(upstream: MockUpstream) -> None:
    """With Redis gone, requests go on (a store outage is not an outage) and each
    unanswered check is counted."""
    with redis_server() as server:
        settings = limited(upstream, server.url, KEY, requests_per_minute=1, concurrency=1)
        with GatewayServer(settings) as gateway:
            assert chat(gateway, KEY).status_code == 200
            server.kill()
            assert [chat(gateway, KEY).status_code for _ in range(3)] == [200, 200, 200]
            assert metric(gateway, "contextgate_limiter_fail_open_total") >= 3


@pytest.fixture
def unlimited(upstream: MockUpstream) -> Iterator[GatewayServer]:
    with GatewayServer(limited(upstream, None, KEY)) as gateway:
        yield gateway


def test_no_limits_no_counting(unlimited: GatewayServer) -> None:
    """A tenant without limits is never refused."""
    assert {chat(unlimited, KEY).status_code for _ in range(20)} == {200}


def test_many_callers_inside_their_window_stay_limited_without_a_pass_per_request() -> None:
    """In a process without Redis, 25,000 callers inside their rate window (more than the
    10,000 arrival times kept before past ones are dropped) are each still limited, and
    dropping past arrival times does not come back on every admission once most of what
    is kept is still ahead of its time."""
    from gateway.telemetry.metrics import Metrics
    from gateway.tenancy.limits import Limiter

    limiter = Limiter(None, Metrics())
    keys = [f"caller-{n}" for n in range(25_000)]
    for key in keys:
        assert limiter._admit_here(key, 1, 0, "m")[0]
    kept = limiter._rates
    for key in keys[::1_000]:
        admitted, retry_ms, reason = limiter._admit_here(key, 1, 0, "m")
        assert not admitted
        assert reason == "rate"
        assert retry_ms > 0
    assert limiter._rates is kept  # no pass over the 25,000 for these admissions
