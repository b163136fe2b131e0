"""Overload: one ``contextgate serve`` process in front of the mock upstream, its capacity
measured in closed loop on this machine, then offered twice as much in open loop
(requests started at a fixed rate whatever the answers). With the defaults the excess is
refused at once with 503 ``gateway_overloaded`` and ``Retry-After``, the accepted requests
keep a latency that does not grow over the run, memory stays near its resting size, the
probes answer throughout, and when the load stops the process is as before.

``CONTEXTGATE_RELIABILITY=long`` (``make soak``) offers the load for a minute instead of
12 s, and also runs the same load with shedding off, which the process cannot serve."""

from __future__ import annotations

import asyncio
import socket
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from bench.load import Answer, burst, closed_loop, open_loop
from tests.harness import ServeProcess
from tests.reliability.process_watch import LONG, gauge, mock_upstream_process, rss_mib

BODY = b'{"model":"gpt-4o","messages":[{"role":"user","content":"Hi"}]}'
PATH = "/v1/chat/completions"
SECONDS = 60.0 if LONG else 12.0
"""Seconds the open-loop load is offered."""
OVERLOAD = 2.0
"""Times the measured capacity offered."""
RSS_SLACK_MIB = 100.0
"""RSS allowed over the resting size under overload (a few hundred small requests in flight
and the connections' buffers: tens of MiB)."""
UNSHED = "max_in_flight: null\nmax_queue_delay: null\n"
SHED_P50_MS = 50
SHED_P99_MS = 1_000
"""Bounds on the 503s' latency. The aim is a p99 of 50 ms; on the shared two-vCPU machine
of docs/RELIABILITY.md ("Twice the capacity"), with the load generator, the mock and the
gateway on the same two cores among other work (load average 4-11), it measured p50
11-30 ms and p99 92-726 ms at 2x: the p99 is the host's scheduling there (the gateway
waited for a CPU 41-71% of the time), so the aim is asserted of the median, and the p99
is held under a second, as before. Before refusals were answered as read, p50 20 ms-3.2 s
and p99 0.17-7.7 s in the same runs; without shedding the p99 reaches 28-30 s. On a quiet
host the rest of the p99 was partly the load generator's: its full garbage collections
(51-86 ms, two or three a run) held every request due meanwhile, and ``open_loop`` now
makes none while it sends. What remains is mostly the first second (the burst taken whole
before the limit is cut), so the report also gives the p99 after it."""
OK_P99_MS = 4_000
"""Bound on the accepted requests' p99: measured 0.38-1.36 s in the 12-second runs at 2x
on the loaded host (0.4-1.1 s at 1.5x before), 0.7-3.1 s in the 60-second ones at 1.5x;
25-27 s without shedding."""


@dataclass
class Run:
    """What one overload run measured."""

    capacity: float
    rest_mib: float
    answers: list[Answer]
    peak_mib: float = 0.0
    probes: list[tuple[int, float]] = field(default_factory=list)
    """(status, seconds) of each /healthz asked during the load, on a new connection."""
    after: dict[str, float] = field(default_factory=dict)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    with mock_upstream_process() as url:
        yield url


def _healthz(port: int) -> int:
    """``GET /healthz`` on a new connection, as a kubelet asks; its status (0: no answer
    within 5 s). Raw socket: an httpx client would hold the GIL for tens of milliseconds
    (its TLS context), stalling the load generator in the same process."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            head = sock.recv(64)
    except OSError:
        return 0
    return int(head[9:12]) if head.startswith(b"HTTP/1.1 ") else 0


def overload(upstream: str, config: str = "") -> Run:
    """Measure the capacity of a fresh gateway, offer it ``OVERLOAD`` times as much in open
    loop for ``SECONDS``, then wait for it to settle."""
    with tempfile.TemporaryDirectory() as workdir:
        yaml = f"upstream:\n  base_url: {upstream}\nsummaries: false\n{config}"
        with ServeProcess(yaml, workdir, "--log-level", "warning") as gateway:
            pid = gateway.process.pid
            asyncio.run(closed_loop(gateway.port, PATH, BODY, concurrency=16, seconds=1.5))
            rest = rss_mib(pid)
            capacity, _ = asyncio.run(
                closed_loop(gateway.port, PATH, BODY, concurrency=16, seconds=4)
            )
            run = Run(capacity, rest, [], rest)
            done = threading.Event()

            def watch() -> None:
                while not done.wait(0.5):
                    started = time.monotonic()
                    status = _healthz(gateway.port)
                    run.probes.append((status, time.monotonic() - started))
                    run.peak_mib = max(run.peak_mib, rss_mib(pid))

            watcher = threading.Thread(target=watch)
            watcher.start()
            try:
                run.answers = asyncio.run(
                    open_loop(gateway.port, PATH, BODY, rate=capacity * OVERLOAD, seconds=SECONDS)
                )
            finally:
                done.set()
                watcher.join()
            deadline = time.monotonic() + 30
            while True:
                text = httpx.get(f"{gateway.url}/metrics", timeout=30).text
                in_flight = gauge(text, "contextgate_admitted_in_flight")
                if in_flight == 0 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            answer = httpx.post(
                f"{gateway.url}{PATH}",
                content=BODY,
                headers={"content-type": "application/json", "authorization": "Bearer sk-x"},
                timeout=10,
            )
            run.after = {
                "in_flight": in_flight,
                "status": answer.status_code,
                "rss_mib": rss_mib(pid),
                "accept_queue": gauge(text, "contextgate_accept_queue"),
                "pending": gauge(text, "contextgate_admission_pending"),
            }
    _report(run)
    return run


def _report(run: Run) -> None:
    ok = [a.ms for a in run.answers if a.status == 200]
    shed = [a.ms for a in run.answers if a.status == 503]
    other = [a for a in run.answers if a.status not in (200, 503)]
    shed_fresh = [a.ms for a in run.answers if a.status == 503 and a.fresh]
    shed_kept = [a.ms for a in run.answers if a.status == 503 and not a.fresh]
    shed_later = [a.ms for a in run.answers if a.status == 503 and a.due >= 1]
    thirds = [
        [
            a.ms
            for a in run.answers
            if a.status == 200 and i * SECONDS / 3 <= a.due < (i + 1) * SECONDS / 3
        ]
        for i in range(3)
    ]
    print(
        f"\ncapacity {run.capacity:.0f}/s, offered {run.capacity * OVERLOAD:.0f}/s for"
        f" {SECONDS:.0f} s: {len(run.answers)} sent, {len(ok)} ok, {len(shed)} 503,"
        f" {len(other)} other"
        f" {sorted((a.status, round(a.due, 1), round(a.ms)) for a in other)[:10]};"
        f" ok p50/p99 {quantile(ok, 0.5):.0f}/{quantile(ok, 0.99):.0f} ms,"
        f" 503 p50/p99 {quantile(shed, 0.5):.0f}/{quantile(shed, 0.99):.0f} ms"
        f" (p99 after the first second {quantile(shed_later, 0.99):.0f} ms;"
        f" on a new connection {quantile(shed_fresh, 0.99):.0f} ms of {len(shed_fresh)},"
        f" on one kept alive {quantile(shed_kept, 0.99):.0f} ms);"
        f" sent late p99 {quantile([a.late_ms for a in run.answers], 0.99):.0f} ms;"
        f" ok p50 by third {[round(quantile(t, 0.5)) for t in thirds]} ms;"
        f" RSS rest/peak {run.rest_mib:.0f}/{run.peak_mib:.0f} MiB;"
        f" healthz max {max((s for _, s in run.probes), default=0):.2f} s; after {run.after}"
    )


def test_excess_load_is_refused_fast_and_the_accepted_requests_stay_on_time(
    upstream: str,
) -> None:
    """At twice the capacity: some 503s, each with Retry-After, their median under 50 ms
    and p99 under a second; accepted requests' latency flat across the run; RSS near rest;
    /healthz always 200; afterwards nothing in flight and a request succeeds."""
    run = overload(upstream)
    ok = [a for a in run.answers if a.status == 200]
    shed = [a for a in run.answers if a.status == 503]
    assert len(ok) + len(shed) == len(run.answers), "every request answered, 200 or 503"
    assert shed, "the excess was refused"
    assert all(a.retry_after for a in shed)
    refused = [a.ms for a in shed]
    assert quantile(refused, 0.5) < SHED_P50_MS
    assert quantile(refused, 0.99) < SHED_P99_MS
    first, last = (
        [a.ms for a in ok if a.due < SECONDS / 3],
        [a.ms for a in ok if a.due >= 2 * SECONDS / 3],
    )
    assert quantile(last, 0.5) < 2 * quantile(first, 0.5) + 1_000, "latency does not grow"
    assert quantile([a.ms for a in ok], 0.99) < OK_P99_MS
    assert run.peak_mib < run.rest_mib + RSS_SLACK_MIB
    assert run.probes
    assert all(status == 200 for status, _ in run.probes)
    assert run.after["in_flight"] == 0
    assert run.after["pending"] == 0  # every request let through by the protocol started
    assert run.after["status"] == 200


BURST = 500
"""Small requests sent at once on new connections: about half a second of work."""
SHED_TOTAL = "contextgate_overload_shed_total{"
CLOSED_LOOPS = (16, 64)
"""Connections of the closed loops, each sending its next request when its answer comes."""


def test_a_burst_and_closed_loops_are_served_not_refused(upstream: str) -> None:
    """What the limit must leave alone, on a fresh gateway with the defaults: a burst of
    500 small requests at once, and closed loops of 16 and 64 connections for 4 s each
    (more work than the loop keeps up with in time, but never more than the clients
    are): every request answered 200, none refused."""
    with tempfile.TemporaryDirectory() as workdir:
        yaml = f"upstream:\n  base_url: {upstream}\nsummaries: false\n"
        with ServeProcess(yaml, workdir, "--log-level", "warning") as gateway:
            asyncio.run(closed_loop(gateway.port, PATH, BODY, concurrency=16, seconds=1.5))
            statuses = asyncio.run(burst(gateway.port, PATH, BODY, count=BURST))
            loops = {
                connections: asyncio.run(
                    closed_loop(gateway.port, PATH, BODY, concurrency=connections, seconds=4)
                )
                for connections in CLOSED_LOOPS
            }
            metrics = httpx.get(f"{gateway.url}/metrics", timeout=30).text
    shed = [line for line in metrics.splitlines() if line.startswith(SHED_TOTAL)]
    print(
        f"\nburst of {BURST}: {sorted(Counter(statuses).items())};"
        + "".join(
            f" {c} connections {rate:.0f}/s, {bad} not 200;" for c, (rate, bad) in loops.items()
        )
        + f" {shed}"
    )
    assert statuses == [200] * BURST
    assert all(bad == 0 for _, bad in loops.values()), loops


@pytest.mark.skipif(not LONG, reason="long run: CONTEXTGATE_RELIABILITY=long (make soak)")
def test_without_shedding_the_same_load_collapses(upstream: str) -> None:
    """Cap and queue delay off: the process takes in every request and serves them all
    late (measured: p50 12.8 s, 107,767 of 124,545 with no answer within 30 s), against
    0.15 s with shedding."""
    run = overload(upstream, UNSHED)
    ok = [a.ms for a in run.answers if a.status == 200]
    unanswered = sum(a.status == 0 for a in run.answers)
    assert quantile(ok, 0.5) > 5_000 or unanswered > len(run.answers) / 10
