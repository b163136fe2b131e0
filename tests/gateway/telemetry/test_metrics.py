"""The gateway's Prometheus metrics after real requests (the openai and anthropic SDKs
against a gateway in front of the mock upstream): what was asked, by whom and for which
model, what it cost in tokens and time, what each stage saved, and what failed, each
read back from ``GET /metrics`` as a scraper would."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import Settings, StoreSettings, TenantSettings, UpstreamSettings
from gateway.tenancy.tenants import hash_key
from tests.conftest import settings_for
from tests.gateway.routes.test_messages import ANSWER
from tests.harness import GatewayServer, RedisServer, redis_server
from tests.mock_upstream import JSONReply, MockUpstream, SSEReply, chat_completion, events_of
from tests.scenarios.test_summaries import SummaryModel, turns

CHAT = "/v1/chat/completions"
KEY = "sk-metrics-canary-0123456789"
USAGE = {
    "prompt_tokens": 1_200,
    "completion_tokens": 34,
    "total_tokens": 1_234,
    "prompt_tokens_details": {"cached_tokens": 1_000},
}
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(server: GatewayServer) -> Samples:
    """Every sample of ``/metrics``, by name and labels."""
    text = httpx.get(f"{server.url}/metrics").text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name`` over the series that have ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, found), v in samples.items() if n == name and wanted <= found)


def scrape_when(server: GatewayServer, ready: Callable[[Samples], bool]) -> Samples:
    """The metrics once ``ready`` holds: a request is recorded when its answer has gone
    out, which the client may see a moment before."""
    deadline = time.monotonic() + 5
    while True:
        samples = scrape(server)
        if ready(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.02)


def requests_seen(server: GatewayServer, count: int) -> Samples:
    return scrape_when(
        server, lambda s: total(s, "contextgate_requests_total", route=CHAT) >= count
    )


def label_values(samples: Samples) -> set[str]:
    return {v for _, labels in samples for _, v in labels}


def tool_turn(output: str) -> list[dict[str, Any]]:
    call = {"id": "c1", "type": "function", "function": {"name": "query", "arguments": "{}"}}
    return [
        {"role": "user", "content": "Run the query."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": output},
    ]


@pytest.fixture
def gateway(upstream: MockUpstream) -> Iterator[GatewayServer]:
    """A gateway of its own, so that every count starts at zero."""
    with GatewayServer(settings_for(upstream)) as server:
        yield server


@pytest.fixture
def client(gateway: GatewayServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.base_url, api_key=KEY, max_retries=0) as sdk:
        yield sdk


def test_requests_are_counted_by_route_tenant_model_and_status(
    gateway: GatewayServer, client: openai.OpenAI, upstream: MockUpstream
) -> None:
    """An answer, a relayed upstream error and a malformed request each count under
    their status, with the model asked for (none when the body could not be read) and
    the ``passthrough`` tenant; the upstream's usage is counted by kind, and its latency
    by outcome; no label holds the caller's key or its namespace."""
    answer = chat_completion()
    answer["usage"] = USAGE
    limited = {"error": {"message": "Slow down.", "type": "rate_limit", "code": "rate_limit"}}
    upstream.push(JSONReply(answer), JSONReply(limited, status=429))
    messages: Any = [{"role": "user", "content": "Hello?"}]
    client.chat.completions.create(model="gpt-4o", messages=messages)
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="gpt-4o", messages=messages)
    bad = httpx.post(f"{gateway.base_url}/chat/completions", content=b"{oops")
    assert bad.status_code == 400

    samples = requests_seen(gateway, 3)
    count = "contextgate_requests_total"
    caller = {"tenant": "passthrough", "model": "gpt-4o"}
    assert value(samples, count, route=CHAT, status="200", **caller) == 1
    assert value(samples, count, route=CHAT, status="429", **caller) == 1
    assert value(samples, count, route=CHAT, tenant="passthrough", model="", status="400") == 1
    assert total(samples, count, route=CHAT) == 3
    assert value(samples, "contextgate_request_duration_seconds_count", route=CHAT) == 3
    tokens = "contextgate_upstream_tokens_total"
    assert value(samples, tokens, kind="input", **caller) == 1_200
    assert value(samples, tokens, kind="output", **caller) == 34
    assert value(samples, tokens, kind="cache_read", **caller) == 1_000
    assert value(samples, tokens, kind="cache_write", **caller) == 0
    latency = "contextgate_upstream_duration_seconds_count"
    assert value(samples, latency, provider="openai", outcome="success") == 1
    assert value(samples, latency, provider="openai", outcome="error") == 1
    assert not [v for v in label_values(samples) if KEY in v or v.startswith("key:")]


def test_a_stream_is_counted_when_it_ends_with_the_usage_it_reported(
    gateway: GatewayServer, client: openai.OpenAI, upstream: MockUpstream
) -> None:
    """A streamed answer counts once its last event is relayed, with the usage of its
    usage chunk."""
    delta = {"object": "chat.completion.chunk", "model": "gpt-4o", "id": "c", "created": 1}
    chunks = [
        {**delta, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hi"}}]},
        {**delta, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {**delta, "choices": [], "usage": USAGE},
    ]
    upstream.push(SSEReply(events_of(chunks), interval=0.05))
    stream = client.chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "Hello?"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    assert [c.usage for c in stream][-1] is not None

    samples = requests_seen(gateway, 1)
    caller = {"tenant": "passthrough", "model": "gpt-4o"}
    assert value(samples, "contextgate_requests_total", route=CHAT, status="200", **caller) == 1
    assert value(samples, "contextgate_upstream_tokens_total", kind="output", **caller) == 34
    assert value(samples, "contextgate_upstream_tokens_total", kind="cache_read", **caller) == 1_000
    duration = value(samples, "contextgate_request_duration_seconds_sum", route=CHAT)
    assert duration >= 0.1  # the whole stream, not its first event
    latency = "contextgate_upstream_duration_seconds_count"
    assert value(samples, latency, provider="openai", outcome="success") == 1
    assert value(samples, "contextgate_requests_in_flight") == 1  # the scrape itself


def test_each_stage_counts_the_tokens_it_saved_and_its_time(
    gateway: GatewayServer, client: openai.OpenAI, upstream: MockUpstream
) -> None:
    """A large tool output is offloaded by the filter stage: each stage's saved tokens
    are its tokens before less after in the request's report, the request's tokens
    before and after are those of ``x-contextgate-tokens``, and every stage was timed
    once (the dry run that told the report is not counted)."""
    output = "".join(f"row {i}: status ok, value {i * 7}\n" for i in range(300))
    body = {"model": "gpt-4o", "messages": tool_turn(output)}
    headers = {"authorization": f"Bearer {KEY}", "x-contextgate-policy": "filter-tokens=300"}
    report = httpx.post(f"{gateway.base_url}/context/compact", json=body, headers=headers).json()[
        "report"
    ]
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o",
        messages=body["messages"],
        extra_headers={"x-contextgate-policy": "filter-tokens=300"},
    )
    parts = raw.headers["x-contextgate-tokens"].split(", ")
    tokens = dict(part.split("=") for part in parts if "=" in part)

    samples = requests_seen(gateway, 1)
    saved = {s["name"]: max(0, s["tokens_before"] - s["tokens_after"]) for s in report["stages"]}
    assert saved["filter"] > 1_000
    for stage, count in saved.items():
        assert value(samples, "contextgate_tokens_saved_total", stage=stage) == count
        assert value(samples, "contextgate_stage_duration_seconds_count", stage=stage) == 1
        assert value(samples, "contextgate_stage_failures_total", stage=stage) == 0
    compaction = "contextgate_compaction_tokens_total"
    caller = {"tenant": "passthrough", "model": "gpt-4o"}
    assert value(samples, compaction, phase="before", **caller) == int(tokens["before"])
    assert value(samples, compaction, phase="after", **caller) == int(tokens["after"])
    assert int(tokens["before"]) - int(tokens["after"]) == sum(saved.values())


def test_the_stages_series_are_there_at_zero_once_the_gateway_has_warmed(
    gateway: GatewayServer,
) -> None:
    """The warm-up makes every default stage's series before the first request (so the
    first request does not pay for making them): a scrape lists each at 0."""
    deadline = time.monotonic() + 10
    while httpx.get(f"{gateway.url}/readyz").json()["warm"] is not True:
        assert time.monotonic() < deadline, "the gateway did not warm up"
        time.sleep(0.05)
    samples = scrape(gateway)
    stages = [stage.name for stage in gateway.app.state.gateway.pipeline.stages]
    assert len(stages) >= 10
    for stage in stages:
        key = ("contextgate_stage_duration_seconds_count", frozenset({("stage", stage)}))
        assert samples.get(key) == 0, stage
        assert value(samples, "contextgate_stage_failures_total", stage=stage) == 0


def test_unknown_models_the_upstream_refused_are_counted_as_other(
    gateway: GatewayServer, client: openai.OpenAI, upstream: MockUpstream
) -> None:
    """A model the catalog does not know keeps its name once the upstream answered it;
    one it refused is ``other``, so made-up names cannot add series; a catalog model
    keeps its name even when refused."""
    missing = {"error": {"message": "No such model.", "type": "invalid_request_error"}}
    upstream.push(
        JSONReply(chat_completion()),
        JSONReply(missing, status=404),
        JSONReply(missing, status=404),
    )
    messages: Any = [{"role": "user", "content": "Hello?"}]
    client.chat.completions.create(model="my-local-model", messages=messages)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="made-up-model-7f3a", messages=messages)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o-mini", messages=messages)

    samples = requests_seen(gateway, 3)
    models = {
        dict(labels)["model"]
        for name, labels in samples
        if name == "contextgate_requests_total" and dict(labels)["route"] == CHAT
    }
    assert models == {"my-local-model", "other", "gpt-4o-mini"}


ALPHA = "cg-alpha-key-0123456789abcdef"


def test_with_tenants_the_tenant_label_is_its_name_and_never_a_key(
    upstream: MockUpstream,
) -> None:
    """A tenant's requests count under its name; a refused key under no tenant; neither
    the gateway key, its hash, the tenant's upstream key nor its namespace is a label."""
    settings = Settings(
        upstream=UpstreamSettings(base_url=upstream.base_url, api_key="sk-shared-upstream"),
        tenants=(TenantSettings("alpha", (hash_key(ALPHA),), upstream_api_key=KEY),),
        summaries=False,
    )
    with GatewayServer(settings) as server:
        messages: Any = [{"role": "user", "content": "Hello?"}]
        with openai.OpenAI(base_url=server.base_url, api_key=ALPHA, max_retries=0) as sdk:
            sdk.chat.completions.create(model="gpt-4o", messages=messages)
        with (
            openai.OpenAI(
                base_url=server.base_url, api_key="cg-wrong-key-00000000000", max_retries=0
            ) as sdk,
            pytest.raises(openai.AuthenticationError),
        ):
            sdk.chat.completions.create(model="gpt-4o", messages=messages)
        samples = requests_seen(server, 2)
    count = "contextgate_requests_total"
    assert value(samples, count, route=CHAT, tenant="alpha", model="gpt-4o", status="200") == 1
    # refused before its body is read: neither tenant nor model is known
    assert value(samples, count, route=CHAT, tenant="", model="", status="401") == 1
    tokens = "contextgate_upstream_tokens_total"
    assert value(samples, tokens, tenant="alpha", model="gpt-4o", kind="input") == 12
    for label in label_values(samples):
        assert ALPHA not in label
        assert KEY not in label
        assert not label.startswith(("sha256:", "tenant:"))


def test_an_anthropic_answer_counts_its_cache_reads_and_writes(
    anthropic_gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """A ``claude-*`` answer from the built-in provider counts under the anthropic
    provider, with its cache reads and writes apart and inside its input tokens."""
    usage = {
        "input_tokens": 20,
        "output_tokens": 6,
        "cache_read_input_tokens": 100,
        "cache_creation_input_tokens": 50,
    }
    upstream.push(JSONReply({**ANSWER, "usage": usage}))
    with anthropic.Anthropic(
        base_url=anthropic_gateway.url, api_key="sk-ant-mine", max_retries=0
    ) as sdk:
        sdk.messages.create(
            model="claude-sonnet-4-6",
            max_tokens=100,
            messages=[{"role": "user", "content": "Hello?"}],
        )
    route = "/v1/messages"
    samples = scrape_when(
        anthropic_gateway,
        lambda s: total(s, "contextgate_requests_total", route=route) >= 1,
    )
    tokens = "contextgate_upstream_tokens_total"
    caller = {"tenant": "passthrough", "model": "claude-sonnet-4-6"}
    assert value(samples, tokens, kind="input", **caller) == 170
    assert value(samples, tokens, kind="output", **caller) == 6
    assert value(samples, tokens, kind="cache_read", **caller) == 100
    assert value(samples, tokens, kind="cache_write", **caller) == 50
    latency = "contextgate_upstream_duration_seconds_count"
    assert value(samples, latency, provider="anthropic", outcome="success") == 1


OPERATIONS = {
    *("object_put", "object_get", "object_touch", "record_get", "record_put"),
    *("checkpoint_get", "checkpoint_put", "lock", "unlock", "secret", "epoch", "ping"),
    "ledger_add",
}


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


def test_store_failures_and_fail_opens_are_counted_while_redis_is_down(
    upstream: MockUpstream, redis: RedisServer
) -> None:
    """With Redis killed, requests are still answered: each counts once as a fail-open,
    the failed operations count by name and the circuit shows open; readiness probes
    are not fail-opens."""
    settings = Settings(
        upstream=UpstreamSettings(base_url=upstream.base_url),
        redis_url=redis.url,
        store=StoreSettings(timeout=0.2),
        summaries=False,
    )
    output = "".join(f"row {i}: status ok\n" for i in range(200))
    with GatewayServer(settings) as server:
        headers = {"authorization": f"Bearer {KEY}", "x-contextgate-policy": "filter-tokens=300"}

        def ask(nonce: int) -> None:
            body = {"model": "gpt-4o", "messages": tool_turn(f"{nonce}\n{output}")}
            response = httpx.post(f"{server.base_url}/chat/completions", json=body, headers=headers)
            assert response.status_code == 200

        ask(0)
        assert value(scrape(server), "contextgate_store_fail_open_total") == 0
        redis.kill()
        ask(1)
        ask(2)
        assert httpx.get(f"{server.url}/readyz").json()["status"] == "degraded"
        samples = requests_seen(server, 3)
    assert value(samples, "contextgate_store_fail_open_total") == 2
    failures = {
        dict(labels)["operation"]: v
        for (name, labels), v in samples.items()
        if name == "contextgate_store_failures_total"
    }
    assert sum(failures.values()) >= 3
    assert failures["ping"] == 1
    assert set(failures) <= OPERATIONS
    assert value(samples, "contextgate_store_circuit_open") == 1


def test_summaries_are_counted_by_the_path_each_request_took(
    upstream: MockUpstream, redis_url: str
) -> None:
    """With the mock as the summary model, a conversation's requests count under the
    summary path ``x-contextgate-summary`` told them, and the background jobs by outcome."""
    settings = Settings(
        upstream=UpstreamSettings(base_url=upstream.base_url), redis_url=redis_url, summaries=True
    )
    upstream.handler = SummaryModel()
    paths: dict[str, int] = {}
    sent = 0
    with GatewayServer(settings) as server:
        for history in turns():
            sent += 1
            response = httpx.post(
                f"{server.base_url}/chat/completions",
                json={"model": "gpt-4o", "messages": history},
                headers={
                    "authorization": f"Bearer {KEY}",
                    "x-contextgate-policy": "max-input=8000",
                    "x-contextgate-conversation": "metrics-summaries",
                },
                timeout=60,
            )
            assert response.status_code == 200
            path = response.headers.get("x-contextgate-summary", "").split(",")[0]
            if path and not path.startswith("prepare="):
                paths[path] = paths.get(path, 0) + 1
            if paths.get("prepared"):
                break
        service = server.app.state.gateway.summaries
        deadline = time.monotonic() + 20
        while service.busy and time.monotonic() < deadline:
            time.sleep(0.02)
        samples = requests_seen(server, sent)
        made = service.counts["made"]
    assert paths.get("prepared")
    for path, count in paths.items():
        assert value(samples, "contextgate_summaries_total", path=path) == count
    assert total(samples, "contextgate_summaries_total") == sum(paths.values())
    assert made >= 1
    assert value(samples, "contextgate_summary_jobs_total", outcome="made") == made
