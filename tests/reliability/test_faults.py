"""Faults under traffic: the gateway's Redis killed, restarted empty, paused and resumed
while clients keep sending; upstreams that refuse, fail, time out or reset; a summary
model that fails. What a client sees, what goes upstream, and what is lost (nothing).

Each test prints its figures (``pytest -s``); ``docs/reliability-faults.md`` has a run's.
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

import httpx
import orjson
import pytest

from tests.harness import RedisServer, ServeProcess, redis_server
from tests.mock_upstream import (
    JSONReply,
    MockUpstream,
    Received,
    Reply,
    SSEReply,
    chat_chunk,
    chat_completion,
    events_of,
)

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
    """The object ``ref`` names, read back through the gateway; None if it is gone."""
    response = http.get(f"context/objects/{ref}", headers={"authorization": f"Bearer {KEY}"})
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
