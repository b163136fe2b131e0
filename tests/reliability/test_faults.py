"""Faults under traffic: the gateway's Redis killed, restarted empty, paused and resumed
while clients keep sending; upstreams that refuse, fail, time out or reset; a summary
model that fails. What a client sees, what goes upstream, and what is lost (nothing).

Each test prints its figures (``pytest -s``); ``docs/RELIABILITY.md`` has a run's.
"""

from __future__ import annotations

import re
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from gateway.config import AnthropicSettings, Settings, UpstreamSettings
from tests.harness import GatewayServer, RedisServer, ServeProcess, free_port, redis_server
from tests.mock_upstream import (
    Drop,
    Hang,
    JSONReply,
    MockUpstream,
    Received,
    Reply,
    SSEReply,
    SummaryModel,
    chat_chunk,
    chat_completion,
    events_of,
)
from tests.scenarios.test_summaries import turns as summary_turns

REF = re.compile(r"ctx_[A-Za-z0-9_-]{22,}")


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


# -- 1. Redis killed, restarted empty, paused and resumed under traffic -------------------

STORE_TIMEOUT, COOLDOWN = 0.2, 0.5
MARGIN = 0.8
"""Seconds allowed on top of the store timeout for a request's own work (pipeline,
upstream, relay) on a noisy 2-core machine shared with four clients and the mock."""
CLIENTS, CONVERSATIONS = 4, 2
THINK = 0.05
"""Seconds a client waits between its requests."""
KEY = "sk-faults-under-traffic"


@dataclass
class Sent:
    """One client request: when it ran, how it ended, and what its tool outputs were."""

    probe: str
    client: int
    stream: bool
    started: float
    seconds: float
    status: int
    complete: bool
    """A whole answer: a completion, or a stream ending with ``[DONE]`` and no error."""
    outputs: list[str] = field(repr=False)


class Timeline:
    """The faults as they were injected: (name, from, to) in monotonic seconds."""

    def __init__(self) -> None:
        self.phases: list[tuple[str, float, float]] = []
        self._name, self._since = "baseline", time.monotonic()

    def enter(self, name: str) -> None:
        now = time.monotonic()
        self.phases.append((self._name, self._since, now))
        self._name, self._since = name, now

    def end(self) -> None:
        self.enter("")

    def phase_of(self, at: float) -> str:
        return next((n for n, start, end in self.phases if start <= at < end), "")

    def window(self, name: str) -> tuple[float, float]:
        return next((start, end) for n, start, end in self.phases if n == name)


def upstream_answer(received: Received) -> Reply:
    """Chat traffic: a stream when asked for one, else a completion."""
    if b'"stream":true' in received.body:
        return SSEReply(events_of([chat_chunk({"content": "ok"}), chat_chunk({}, "stop")]))
    return JSONReply(chat_completion("ok"))


def tool_turn(client: int, turn: int) -> tuple[list[dict[str, Any]], str]:
    """An assistant tool call and its output (about 800 tokens, unique to the turn):
    large enough for the filter stage (``filter-tokens=300``) to offload."""
    output = "".join(f"client {client} turn {turn} row {i}: status ok\n" for i in range(60))
    call = f"call_{client}_{turn}"
    fn = {"name": "query", "arguments": orjson.dumps({"turn": turn}).decode()}
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": call, "type": "function", "function": fn}],
        },
        {"role": "tool", "tool_call_id": call, "content": output},
    ], output


class Traffic:
    """``CLIENTS`` threads, each alternating between ``CONVERSATIONS`` conversations of
    its own, streamed and not in turn, each request adding one large tool output to the
    conversation's history, until ``stop``."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.sent: list[Sent] = []
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, args=(c,), daemon=True) for c in range(CLIENTS)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self.stopping.set()
        for thread in self._threads:
            thread.join(30)

    def _run(self, client: int) -> None:
        histories: list[list[dict[str, Any]]] = [
            [{"role": "user", "content": f"Client {client}, conversation {c}: run the queries."}]
            for c in range(CONVERSATIONS)
        ]
        outputs: list[list[str]] = [[] for _ in range(CONVERSATIONS)]
        with httpx.Client(timeout=30) as http:
            turn = 0
            while not self.stopping.is_set():
                c = turn % CONVERSATIONS
                messages, output = tool_turn(client, turn)
                histories[c] += messages
                outputs[c].append(output)
                stream = turn % 2 == 1
                self._send(http, client, c, turn, histories[c], stream, list(outputs[c]))
                histories[c].append({"role": "assistant", "content": "ok"})
                histories[c].append({"role": "user", "content": f"Next, turn {turn + 1}."})
                turn += 1
                self.stopping.wait(THINK)

    def _send(
        self,
        http: httpx.Client,
        client: int,
        conversation: int,
        turn: int,
        messages: list[dict[str, Any]],
        stream: bool,
        outputs: list[str],
    ) -> None:
        probe = f"{client}-{turn}"
        headers = {
            "authorization": f"Bearer {KEY}",
            "x-contextgate-policy": "filter-tokens=300",
            "x-contextgate-conversation": f"faults-{client}-{conversation}",
            "x-probe": probe,  # forwarded upstream: ties what the mock saw to this request
        }
        body = {"model": "gpt-4o", "messages": messages, "stream": stream}
        started = time.monotonic()
        try:
            with http.stream(
                "POST", f"{self.base_url}/chat/completions", json=body, headers=headers
            ) as response:
                data = response.read()
            status = response.status_code
        except httpx.HTTPError:
            data, status = b"", 0
        seconds = time.monotonic() - started
        if stream:
            complete = data.endswith(b"data: [DONE]\n\n") and b'"error"' not in data
        else:
            complete = status == 200 and bool(orjson.loads(data).get("choices"))
        with self._lock:
            self.sent.append(
                Sent(probe, client, stream, started, seconds, status, complete, outputs)
            )


def restorable(http: httpx.Client, ref: str) -> bytes | None:
    return restorable_as(http, ref, KEY)


def restorable_as(http: httpx.Client, ref: str, key: str) -> bytes | None:
    """The object ``ref`` names, read back through the gateway with ``key``; None if it
    is gone."""
    response = http.get(f"context/objects/{ref}", headers={"authorization": f"Bearer {key}"})
    return response.content if response.status_code == 200 else None


def metric(text: str, name: str) -> float:
    """The sum of a metric's samples in a Prometheus exposition."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


def test_redis_killed_restarted_empty_paused_and_resumed_under_traffic(
    upstream: MockUpstream, redis: RedisServer
) -> None:
    """Four clients keep sending while Redis is killed, restarted empty, paused and
    resumed: every request is answered whole, none waits more than the store timeout and
    a margin, no ref goes upstream without a stored copy (every ref restores at the end,
    byte for byte), and offloading resumes after each fault."""
    upstream.handler = upstream_answer
    config = (
        f"upstream:\n  base_url: {upstream.base_url}\n"
        f"redis_url: {redis.url}\n"
        f"store:\n  timeout: {STORE_TIMEOUT}\n  breaker_cooldown: {COOLDOWN}\n"
        "summaries: false\n"
    )
    timeline = Timeline()
    with (
        tempfile.TemporaryDirectory() as workdir,
        ServeProcess(config, workdir, "--log-level", "warning") as gateway,
    ):
        warm = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Hello."}]}
        httpx.post(f"{gateway.base_url}/chat/completions", json=warm, timeout=30)
        upstream.received.clear()  # the warm-up request is not part of the figures
        traffic = Traffic(gateway.base_url)
        traffic.start()
        try:
            time.sleep(3)
            timeline.enter("killed")
            redis.kill()
            time.sleep(2.5)
            timeline.enter("restarted")
            redis.start()
            time.sleep(3)
            timeline.enter("paused")
            redis.pause()
            time.sleep(2.5)
            timeline.enter("resumed")
            redis.resume()
            time.sleep(3)
        finally:
            redis.resume()
            traffic.stop()
        timeline.end()
        scrape = httpx.get(f"{gateway.url}/metrics").text
        by_probe = {s.probe: s for s in traffic.sent}
        seen: dict[str, list[tuple[Sent, str]]] = {}  # ref -> (request, phase) it went upstream in
        offloading: dict[str, int] = {}
        for received in upstream.received:
            sent = by_probe.get(received.headers.get("x-probe", ""))
            if sent is None:
                continue
            phase = timeline.phase_of(sent.started)
            refs = set(REF.findall(received.body.decode()))
            offloading[phase] = offloading.get(phase, 0) + bool(refs)
            for ref in refs:
                seen.setdefault(ref, []).append((sent, phase))
        lost, wrong = [], []
        http = httpx.Client(base_url=gateway.base_url + "/")
        for ref, sightings in seen.items():
            content = restorable(http, ref)
            if content is None:
                lost.append((ref, sorted({phase for _, phase in sightings})))
            elif content.decode() not in sightings[0][0].outputs:
                wrong.append(ref)
        http.close()

    phases = [name for name, _, _ in timeline.phases]
    latencies = {
        p: [s.seconds for s in traffic.sent if timeline.phase_of(s.started) == p] for p in phases
    }
    print(f"\nrequests: {len(traffic.sent)}, faults injected: kill+restart 1, pause+resume 1")
    for phase in phases:
        values = latencies[phase]
        print(
            f"  {phase:9s} {len(values):4d} requests, {offloading.get(phase, 0):4d} offloading;"
            f" p50 {statistics.median(values) * 1000:6.1f} ms, p99"
            f" {percentile(values, 0.99) * 1000:6.1f} ms, max {max(values) * 1000:6.1f} ms"
        )
    print(
        f"  refs sent upstream: {len(seen)}, not restorable at the end: {len(lost)}, "
        f"restoring other content: {len(wrong)}; store failures"
        f" {metric(scrape, 'contextgate_store_failures_total'):.0f}, fail-open requests"
        f" {metric(scrape, 'contextgate_store_fail_open_total'):.0f}"
    )

    assert [s for s in traffic.sent if s.status != 200 or not s.complete] == []
    assert all(latencies[p] for p in phases)
    slowest = max(traffic.sent, key=lambda s: s.seconds)
    assert slowest.seconds < STORE_TIMEOUT + MARGIN, slowest
    # Nothing offloaded while Redis was dead: no ref could have been acknowledged.
    killed_from, killed_to = timeline.window("killed")
    assert not any(
        killed_from + STORE_TIMEOUT < s.started and s.started + s.seconds < killed_to
        for sightings in seen.values()
        for s, _ in sightings
    )
    # Offloading resumed after each fault, and nothing was lost or mixed up.
    assert offloading.get("restarted", 0) > 0
    assert offloading.get("resumed", 0) > 0
    assert lost == []
    assert wrong == []


# -- 2. Upstream faults: relayed as they came, never retried -------------------------------

READ_TIMEOUT = 0.5
CLAUDE, GPT = "claude-sonnet-4-6", "gpt-4o"
ROUTES = [("chat", GPT), ("chat", CLAUDE), ("messages", CLAUDE), ("messages", GPT)]
RATE_HEADERS = {
    "retry-after": "7",
    "x-ratelimit-remaining-requests": "0",
    "x-ratelimit-reset-requests": "7s",
    "anthropic-ratelimit-requests-remaining": "0",
    "anthropic-ratelimit-requests-reset": "2026-01-01T00:00:07Z",
}
ANTHROPIC_TYPES = {
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
"""Anthropic's error type for each status (the Messages route's envelope)."""


def upstream_error(status: int, model: str) -> dict[str, Any]:
    """The error body the model's provider sends for ``status``."""
    message = f"upstream says {status}"
    if model.startswith("claude"):
        return {"type": "error", "error": {"type": ANTHROPIC_TYPES[status], "message": message}}
    return {
        "error": {"message": message, "type": "server_error", "param": None, "code": f"c{status}"}
    }


def expected_body(route: str, model: str, status: int) -> dict[str, Any]:
    """What the client gets for an upstream ``status``: the provider's body untouched when
    the route speaks its format, else the route's envelope (docs/API.md, Errors)."""
    sent = upstream_error(status, model)
    if route == "chat" and model.startswith("claude"):
        kind = ANTHROPIC_TYPES[status]
        error = {"message": f"upstream says {status}", "type": kind, "param": None, "code": kind}
        return {"error": error}
    if route == "messages" and not model.startswith("claude"):
        return {
            "type": "error",
            "error": {"type": ANTHROPIC_TYPES[status], "message": f"upstream says {status}"},
        }
    return sent


def relayed_headers(route: str, model: str) -> set[str]:
    """The rate-limit headers that reach the client: all of them, except from Anthropic
    through the chat route, which keeps ``retry-after`` and Anthropic's own."""
    if route == "chat" and model.startswith("claude"):
        return {name for name in RATE_HEADERS if not name.startswith("x-ratelimit")}
    return set(RATE_HEADERS)


def ask_route(base_url: str, route: str, model: str, stream: bool) -> httpx.Response:
    messages = [{"role": "user", "content": "Say hello."}]
    if route == "chat":
        path, body = "chat/completions", {"model": model, "messages": messages}
    else:
        path, body = "messages", {"model": model, "max_tokens": 16, "messages": messages}
    return httpx.post(
        f"{base_url}/{path}",
        json={**body, "stream": stream},
        headers={"authorization": "Bearer sk-faults", "x-api-key": "sk-faults"},
        timeout=10,
    )


def gateway_error(route: str, response: httpx.Response) -> tuple[str, str]:
    """(type, message or code) of one of the gateway's own errors, in the route's envelope."""
    body = response.json()
    if route == "messages":
        assert body["type"] == "error"
        return body["error"]["type"], body["error"]["message"]
    return body["error"]["type"], body["error"]["code"]


@pytest.fixture(scope="module")
def faulty(mock_upstream: MockUpstream) -> Iterator[str]:
    """A gateway in front of the mock for both providers, with short upstream timeouts."""
    settings = Settings(
        upstream=UpstreamSettings(
            base_url=mock_upstream.base_url, read_timeout=READ_TIMEOUT, connect_timeout=0.5
        ),
        anthropic=AnthropicSettings(base_url=mock_upstream.base_url.removesuffix("/v1")),
        summaries=False,
    )
    with GatewayServer(settings) as server:
        yield server.base_url


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("status", [429, 500, 503, 529])
@pytest.mark.parametrize(("route", "model"), ROUTES, ids=[f"{r}-{m[:6]}" for r, m in ROUTES])
def test_an_upstream_error_status_is_relayed_once_with_its_headers(
    faulty: str, upstream: MockUpstream, route: str, model: str, status: int, stream: bool
) -> None:
    """429, 500, 503 and 529 reach the client with their status, body (in the route's
    envelope) and rate-limit headers, after exactly one upstream attempt."""
    upstream.push(JSONReply(upstream_error(status, model), status=status, headers=RATE_HEADERS))
    response = ask_route(faulty, route, model, stream)
    assert response.status_code == status
    assert response.json() == expected_body(route, model, status)
    for name in relayed_headers(route, model):
        assert response.headers[name] == RATE_HEADERS[name], name
    assert response.headers.get("x-contextgate-attempts", "1") == "1"
    assert len(upstream.received) == 1  # no retry: the client's SDK decides


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize(
    ("fault", "status", "code"),
    [("hang", 504, "upstream_timeout"), ("reset", 502, "upstream_unreachable")],
)
@pytest.mark.parametrize(("route", "model"), ROUTES, ids=[f"{r}-{m[:6]}" for r, m in ROUTES])
def test_a_read_timeout_or_a_reset_before_the_first_byte_is_the_gateways_own_error(
    faulty: str,
    upstream: MockUpstream,
    route: str,
    model: str,
    fault: str,
    status: int,
    code: str,
    stream: bool,
) -> None:
    """An upstream that never answers is a 504 after the read timeout; one that closes
    the connection before its first byte a 502: in the route's envelope, one attempt."""
    upstream.push(Hang() if fault == "hang" else Drop())
    started = time.monotonic()
    response = ask_route(faulty, route, model, stream)
    elapsed = time.monotonic() - started
    assert response.status_code == status
    kind, said = gateway_error(route, response)
    assert kind == (ANTHROPIC_TYPES[status] if route == "messages" else "upstream_error")
    assert route == "messages" or said == code  # the Messages envelope has no code field
    assert len(upstream.received) == 1
    if fault == "hang":
        assert READ_TIMEOUT <= elapsed < READ_TIMEOUT + 2.0


@pytest.fixture(scope="module")
def unreachable() -> Iterator[str]:
    """A gateway whose two providers' addresses have nobody listening."""
    dead = f"http://127.0.0.1:{free_port()}"
    settings = Settings(
        upstream=UpstreamSettings(base_url=f"{dead}/v1", connect_timeout=0.5),
        anthropic=AnthropicSettings(base_url=dead),
        summaries=False,
    )
    with GatewayServer(settings) as server:
        yield server.base_url


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize(("route", "model"), ROUTES, ids=[f"{r}-{m[:6]}" for r, m in ROUTES])
def test_a_refused_connection_is_a_502(
    unreachable: str, route: str, model: str, stream: bool
) -> None:
    """A connection refused by either provider: 502 in the route's envelope."""
    response = ask_route(unreachable, route, model, stream)
    assert response.status_code == 502
    kind, said = gateway_error(route, response)
    assert kind == (ANTHROPIC_TYPES[502] if route == "messages" else "upstream_error")
    assert route == "messages" or said == "upstream_unreachable"


def test_the_sdks_see_the_upstreams_errors_and_its_retry_after(
    faulty: str, upstream: MockUpstream
) -> None:
    """With their own retries off, the openai and anthropic SDKs raise the error class of
    the upstream's status and read its ``retry-after``, through either route."""
    messages: list[Any] = [{"role": "user", "content": "Say hello."}]
    oai = openai.OpenAI(base_url=faulty, api_key="sk-faults", max_retries=0)
    claude = anthropic.Anthropic(
        base_url=faulty.removesuffix("/v1"), api_key="sk-faults", max_retries=0
    )
    for model in (GPT, CLAUDE):
        upstream.reset()
        upstream.push(
            JSONReply(upstream_error(429, model), status=429, headers=RATE_HEADERS),
            JSONReply(upstream_error(529, model), status=529, headers=RATE_HEADERS),
        )
        with pytest.raises(openai.RateLimitError) as limited:
            oai.chat.completions.create(model=model, messages=messages)
        assert limited.value.response.headers["retry-after"] == "7"
        with pytest.raises(openai.APIStatusError) as overloaded:
            oai.chat.completions.create(model=model, messages=messages, stream=True)
        assert overloaded.value.status_code == 529
        upstream.push(
            JSONReply(upstream_error(429, model), status=429, headers=RATE_HEADERS),
            JSONReply(upstream_error(529, model), status=529, headers=RATE_HEADERS),
        )
        with pytest.raises(anthropic.RateLimitError) as refused:
            claude.messages.create(model=model, max_tokens=16, messages=messages)
        assert refused.value.response.headers["retry-after"] == "7"
        with pytest.raises(anthropic.APIStatusError) as busy:
            claude.messages.create(model=model, max_tokens=16, messages=messages, stream=True)
        assert busy.value.status_code == 529
        assert busy.value.body == expected_body("messages", model, 529)
        assert len(upstream.received) == 4
    oai.close()
    claude.close()


# -- 3. The summary model down -------------------------------------------------------------

SUMMARY_TIMEOUT = 1.0
SUMMARY_POLICY = f"max-input=7000, summary-timeout={SUMMARY_TIMEOUT:g}"
"""The longest trajectory is 7,379 tokens as compact JSON: at max-input 8,000 its first,
cold, pass alone brings it under the trigger and no summary is asked for."""


class FailingSummaryModel:
    """The mock's handler: chat traffic answered "ok"; summary calls (the requests with
    ``response_format``) answered as ``mode`` says: ``500``, ``slow`` (past the summary
    timeout), ``garbage`` (a completion whose text is not JSON) or ``healthy``."""

    def __init__(self) -> None:
        self.mode = "500"
        self.calls: dict[str, int] = {}
        self.healthy = SummaryModel()

    def __call__(self, received: Received) -> JSONReply:
        if "response_format" not in received.json():
            return JSONReply(chat_completion("ok"))
        self.calls[self.mode] = self.calls.get(self.mode, 0) + 1
        if self.mode == "500":
            return JSONReply({"error": {"message": "boom", "type": "server_error"}}, 500)
        if self.mode == "slow":
            return JSONReply(chat_completion("{}"), delay=SUMMARY_TIMEOUT + 4)
        if self.mode == "garbage":
            return JSONReply(chat_completion('{"user_goal": "trunc'))
        return self.healthy(received)


def test_a_failing_summary_model_falls_back_pauses_and_recovers(
    upstream: MockUpstream, redis_url: str
) -> None:
    """Conversations past the summary threshold while the summary model answers 500, too
    late, then garbage: each request is answered with compress's notes instead (the
    fallback), within the summary timeout and a margin, and what the notes replaced
    restores; after three failures summaries pause (no call reaches the model); once the
    model is back and the pause is over, one request probes, gets a summary, and
    summaries go on."""
    model = FailingSummaryModel()
    upstream.handler = model
    settings = Settings(
        upstream=UpstreamSettings(base_url=upstream.base_url), redis_url=redis_url, summaries=True
    )
    history = summary_turns()[-1]
    paths: list[tuple[str, str, float]] = []
    with GatewayServer(settings) as server:
        breaker = server.app.state.gateway.summary_breaker
        breaker.cooldown = 1.0  # 30 s in production: shortened so the test sees it close

        def ask(mode: str) -> str:
            model.mode = mode
            started = time.monotonic()
            response = httpx.post(
                f"{server.base_url}/chat/completions",
                json={"model": "gpt-4o", "messages": history},
                headers={
                    "authorization": "Bearer sk-summaries-down",
                    "x-contextgate-policy": SUMMARY_POLICY,
                    "x-contextgate-conversation": f"down-{len(paths)}",
                },
                timeout=30,
            )
            elapsed = time.monotonic() - started
            assert response.status_code == 200, response.text
            path = response.headers.get("x-contextgate-summary", "").split(",")[0]
            paths.append((mode, path, elapsed))
            return path

        for mode in ("500", "slow", "garbage"):
            assert ask(mode) == "fallback"
        assert breaker.state == "open"
        failed_calls = sum(model.calls.values())
        assert ask("healthy") == "fallback"  # paused: the model is not asked
        assert sum(model.calls.values()) == failed_calls
        time.sleep(breaker.cooldown + 0.1)
        assert ask("healthy") == "made"
        assert breaker.state == "closed"
        assert ask("healthy") == "made"

        sent = [r for r in upstream.received if "response_format" not in r.json()]
        refs = {ref for r in sent for ref in REF.findall(r.body.decode())}
        with httpx.Client(base_url=server.base_url + "/") as http:
            lost = [ref for ref in refs if restorable_as(http, ref, "sk-summaries-down") is None]
    print(f"\nsummary calls by mode: {model.calls}; requests: {len(paths)}")
    for mode, path, elapsed in paths:
        print(f"  model {mode:8s} -> {path:9s} {elapsed * 1000:7.1f} ms")
    print(f"  refs sent upstream: {len(refs)}, not restorable: {len(lost)}")
    assert len(sent) == len(paths)
    assert all(elapsed < SUMMARY_TIMEOUT + MARGIN for _, _, elapsed in paths)
    assert refs
    assert lost == []
