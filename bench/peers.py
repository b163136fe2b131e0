"""Peers: contextgate, LiteLLM's proxy and Headroom in front of the same mock upstream,
measured by the same client in the same run.

    python -m bench.peers [--quick] [--rounds 5] [--output docs/BENCHMARKS.md]
    python -m bench.peers --only contextgate    # one proxy through the same plan

Each peer is installed at a pinned release in a virtualenv of its own (``bench/peer_envs``)
and configured as a plain OpenAI-compatible proxy to the mock (``bench/peers_targets``).
The mock (``bench/peers_upstream``) is also measured directly: a proxy's *added* latency is
its latency minus the mock's, both taken in the same round. So is a bare relay on
contextgate's own server stack (``bench/passthrough``): not a peer, but the least any
gateway built on uvicorn, Litestar and httpx adds, measured beside the others.

1. What each proxy forwards: one request of each size through each proxy; the mock keeps
   the body it received, which is compared with what the client sent.
2. Latency, sequential on keep-alive connections: a one-message request, the same streamed
   (time to the first body byte), and 20K- and 100K-token histories (tau-bench airline).
   Every round sends each request to every target in turn, the order rotating from request
   to request; the added p50 is the median over rounds of each round's difference of
   medians, the added p99 the difference of the p99s over all rounds. Each target therefore
   sits idle while the others answer; a second pass sends each target its round's requests
   back to back (the busy regime) and reports the added p50 the same way.
3. Throughput: closed loops at a fixed number of connections (as ``bench/load.py``'s,
   counting the answers that are not 200 by status), each request size and target in
   turn, rotating from round to round; medians over rounds.
4. Memory: the resident memory of each proxy's whole process group (workers included) at
   rest after start-up, at its peak during the run (sampled every 0.2 s), and at rest after
   the load.

A peer that fails a request is recorded and the run goes on; every process started is
stopped at the end, process group and all. ``--quick`` is a smoke run that writes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import itertools
import os
import signal
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.load import read_answer, request_bytes
from bench.overhead import ROOT, free_port, history
from bench.peers_report import Figures, Sent, compare, write
from bench.peers_targets import (
    BARE,
    KEY,
    MODEL,
    PeakMemory,
    Proxy,
    Running,
    bare,
    base_env,
    contextgate,
    headroom,
    litellm,
    settled,
    started,
)
from bench.report import quantile
from pipelines import TokenCounter

PATH = "/v1/chat/completions"
DIRECT = "direct"


@dataclass(frozen=True)
class Payload:
    """One kind of request, and how many of it a round sends to each target. Every request
    ends with a new user message (numbered), as an agent's next turn does, so no two
    requests are the same and no proxy can answer one from a response cache."""

    name: str
    history: tuple[dict[str, Any], ...]
    per_round: int
    stream: bool = False

    def messages(self, turn: int) -> list[dict[str, Any]]:
        return [*self.history, self.turn(turn)]

    def turn(self, turn: int) -> dict[str, Any]:
        return {"role": "user", "content": f"And what about request {turn}?"}

    def body(self, turn: int) -> bytes:
        return self.head + orjson.dumps(self.turn(turn)) + b"]}"

    @functools.cached_property
    def head(self) -> bytes:
        """The body up to the new message (serialised once: the histories are large)."""
        whole = orjson.dumps({"model": MODEL, "stream": self.stream, "messages": self.history})
        return whole[:-2] + (b"," if self.history else b"")


TURNS = itertools.count()
"""Numbers the new user message of every request the benchmark sends."""


@dataclass(frozen=True)
class Plan:
    rounds: int
    scale: float = 1.0
    """Multiplies every payload's requests per round."""
    connections: int = 16
    seconds: float = 3.0
    """Length of one closed loop."""
    load_rounds: int = 3


QUICK = Plan(rounds=2, scale=0.2, seconds=1.0, load_rounds=1)


def payloads(counter: TokenCounter, scale: float) -> list[Payload]:
    mid, big = history(20_000, counter), history(100_000, counter)

    def count(n: int) -> int:
        return max(3, round(n * scale))

    def label(messages: list[dict[str, Any]]) -> str:
        return f"{round(counter.count_messages(messages), -3) // 1000:.0f}K-token history"

    return [
        Payload("1 message", (), count(60)),
        Payload("1 message, streamed (time to first byte)", (), count(60), True),
        Payload(label(mid), tuple(mid), count(24)),
        Payload(label(big), tuple(big), count(12)),
    ]


# -- the targets ------------------------------------------------------------------------------


@dataclass
class Target:
    """Where requests go, and what went wrong there."""

    name: str
    port: int
    pgid: int | None
    """The proxy's process group (``None`` for the mock itself)."""
    client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=60))
    failures: dict[str, list[str]] = field(default_factory=dict)
    """Payload name -> the errors met, in order."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{PATH}"

    def failed(self, payload: str, error: str) -> None:
        self.failures.setdefault(payload, []).append(error)


class RequestFailed(Exception):
    """A proxy answered with an error, or not at all."""


def send(target: Target, payload: Payload) -> tuple[float, bytes, bytes]:
    """Milliseconds to the whole answer (streamed: to its first body byte), the body sent,
    and the answer."""
    headers = {"content-type": "application/json", "authorization": f"Bearer {KEY}"}
    body = payload.body(next(TURNS))
    began = time.perf_counter()
    try:
        if payload.stream:
            with target.client.stream("POST", target.url, content=body, headers=headers) as r:
                chunks = r.iter_raw()
                first = next(chunks, b"")
                elapsed = time.perf_counter() - began
                answer = first + b"".join(chunks)
        else:
            r = target.client.post(target.url, content=body, headers=headers)
            elapsed = time.perf_counter() - began
            answer = r.content
    except httpx.HTTPError as exc:
        raise RequestFailed(f"{type(exc).__name__}: {exc}") from exc
    if r.status_code != 200:
        raise RequestFailed(f"HTTP {r.status_code}: {answer[:200]!r}")
    if (b'"choices"' not in answer) or (payload.stream and b"data:" not in answer):
        raise RequestFailed(f"not a chat completion: {answer[:200]!r}")
    return elapsed * 1000, body, answer


def attempt(target: Target, payload: Payload) -> float | None:
    """``send``, with a failure recorded rather than raised."""
    try:
        return send(target, payload)[0]
    except RequestFailed as exc:
        target.failed(payload.name, str(exc))
        return None


def usable(target: Target, payload: Payload) -> bool:
    """A target that failed this payload 3 times is not sent it again."""
    return len(target.failures.get(payload.name, [])) < 3


# -- 1. what each proxy forwards -------------------------------------------------------------


def forwarded(
    targets: list[Target], mock_port: int, items: list[Payload], counter: TokenCounter
) -> dict[tuple[str, str], str]:
    """(target, payload) -> what the mock received from that target, against what was sent."""
    out = {}
    for payload in items:
        if payload.stream:
            continue
        for target in targets:
            try:
                _, body, _ = send(target, payload)
            except RequestFailed as exc:
                target.failed(payload.name, str(exc))
                out[(target.name, payload.name)] = "failed"
                continue
            got = orjson.loads(httpx.get(f"http://127.0.0.1:{mock_port}/last").content)
            out[(target.name, payload.name)] = compare(orjson.loads(body), got, counter)
    return out


# -- 2. latency ------------------------------------------------------------------------------


def latency(plan: Plan, targets: list[Target], payload: Payload) -> dict[str, list[list[float]]]:
    """Target name -> per round, the milliseconds of each of its requests."""
    for target in targets:  # connections, caches and lazy imports, on every path
        for _ in range(3):
            if usable(target, payload):
                attempt(target, payload)
    times: dict[str, list[list[float]]] = {t.name: [] for t in targets}
    turn = 0
    for _ in range(plan.rounds):
        for series in times.values():
            series.append([])
        for _ in range(payload.per_round):
            order = targets[turn % len(targets) :] + targets[: turn % len(targets)]
            turn += 1
            for target in order:
                if usable(target, payload) and (ms := attempt(target, payload)) is not None:
                    times[target.name][-1].append(ms)
    return times


def latency_in_runs(
    plan: Plan, targets: list[Target], payload: Payload
) -> dict[str, list[list[float]]]:
    """As ``latency``, but each target gets its requests of a round back to back (after
    3 not counted), the targets' order rotating from round to round: what each adds when
    busy with steady traffic rather than woken from idle."""
    times: dict[str, list[list[float]]] = {t.name: [] for t in targets}
    for round_ in range(plan.rounds):
        order = targets[round_ % len(targets) :] + targets[: round_ % len(targets)]
        for target in order:
            times[target.name].append([])
            for n in range(3 + payload.per_round):
                if not usable(target, payload):
                    break
                ms = attempt(target, payload)
                if ms is not None and n >= 3:
                    times[target.name][-1].append(ms)
    return times


def latency_figures(times: dict[str, list[list[float]]]) -> dict[str, dict[str, float]]:
    """Per target: p50, p99 and, against the direct path, the added p50 and p99 (ms)."""
    direct = times[DIRECT]
    out: dict[str, dict[str, float]] = {}
    for name, rounds in times.items():
        pooled = [ms for r in rounds for ms in r]
        if not pooled:
            continue
        pairs = [(r, d) for r, d in zip(rounds, direct, strict=True) if r and d]
        out[name] = {
            "p50": statistics.median(pooled),
            "p99": quantile(pooled, 0.99),
            "added_p50": statistics.median(
                statistics.median(r) - statistics.median(d) for r, d in pairs
            ),
            "added_p99": quantile(pooled, 0.99) - quantile([ms for r in direct for ms in r], 0.99),
            "count": len(pooled),
        }
    return out


# -- 3. throughput ---------------------------------------------------------------------------


def throughput(plan: Plan, targets: list[Target], payload: Payload) -> dict[str, float]:
    """Target name -> median requests per second over the rounds (closed loop)."""
    runs: dict[str, list[float]] = {t.name: [] for t in targets}
    for i in range(plan.load_rounds):
        for target in targets[i % len(targets) :] + targets[: i % len(targets)]:
            if not usable(target, payload):
                continue
            try:
                rps, others = asyncio.run(
                    closed(target.port, payload, plan.connections, plan.seconds)
                )
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                target.failed(f"{payload.name} under load", f"{type(exc).__name__}: {exc}")
                continue
            if others:
                answers = ", ".join(f"{n} x {status}" for status, n in sorted(others.items()))
                target.failed(f"{payload.name} under load", f"answers not 200: {answers}")
            runs[target.name].append(rps)
    return {name: statistics.median(r) for name, r in runs.items() if r}


async def closed(
    port: int, payload: Payload, connections: int, seconds: float
) -> tuple[float, Counter[int]]:
    """A closed loop as ``bench.load.closed_loop`` runs it: requests per second answered
    200, and how many other answers came, by status."""
    ok, others = 0, Counter[int]()
    deadline = time.perf_counter() + seconds

    async def connection() -> None:
        nonlocal ok
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.perf_counter() < deadline:
                writer.write(request_bytes(PATH, payload.body(next(TURNS))))
                status, _ = await read_answer(reader)
                if status == 200:
                    ok += 1
                else:
                    others[status] += 1
        finally:
            writer.close()

    began = time.perf_counter()
    await asyncio.gather(*(connection() for _ in range(connections)))
    return ok / (time.perf_counter() - began), others


# -- the run ---------------------------------------------------------------------------------


def mock(port: int) -> Proxy:
    args = [str(ROOT / ".venv" / "bin" / "python"), "-m", "bench.peers_upstream"]
    return Proxy("mock", [*args, "--port", str(port)], base_env(), "/v1/models", "", "")


def measure(plan: Plan, running: list[Running], ports: dict[str, int], mock_port: int) -> Figures:
    counter = TokenCounter()
    items = payloads(counter, plan.scale)
    rest = {r.proxy.name: settled(r.process.pid) for r in running}
    targets = [Target(DIRECT, mock_port, None)]
    targets += [Target(r.proxy.name, ports[r.proxy.name], r.process.pid) for r in running]
    sent = [Sent(p.name, len(p.body(0)), p.per_round, p.stream, len(p.messages(0))) for p in items]
    figures = Figures(plan.rounds, plan.connections, plan.seconds, plan.load_rounds, sent)
    figures.proxies = [r.proxy for r in running]
    figures.rest = rest
    peaks = PeakMemory({r.proxy.name: r.process.pid for r in running})
    with peaks.sampling():
        figures.forwarded = forwarded(targets, mock_port, items, counter)
        for payload in items:
            figures.latency[payload.name] = latency_figures(latency(plan, targets, payload))
            print(payload.name, figures.latency[payload.name])
            in_runs = latency_figures(latency_in_runs(plan, targets, payload))
            figures.latency_in_runs[payload.name] = in_runs
            print(payload.name, "back to back", in_runs)
        figures.sequential = {r.proxy.name: r.log.stat().st_size for r in running}
        for payload in items:
            if not payload.stream:
                figures.rps[payload.name] = throughput(plan, targets, payload)
                print(payload.name, "req/s", figures.rps[payload.name])
    figures.peak, figures.processes = peaks.peak, peaks.processes
    figures.after = {r.proxy.name: settled(r.process.pid) for r in running}
    figures.failures = {t.name: t.failures for t in targets}
    figures.logs = {r.proxy.name: r.log for r in running}
    for target in targets:
        target.client.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a smoke run; writes nothing")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--only",
        help="comma-separated targets to run (e.g. 'contextgate,bare relay'): the same plan"
        " for fewer proxies, such as contextgate's memory after the run; writes nothing",
    )
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "BENCHMARKS.md")
    args = parser.parse_args()
    plan = QUICK if args.quick else Plan(rounds=args.rounds)
    # SIGTERM unwinds like Ctrl-C, so that every proxy's process group is still stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    load_before = os.getloadavg()
    mock_port = free_port()
    upstream = f"http://127.0.0.1:{mock_port}/v1"
    ports = {name: free_port() for name in ("contextgate", "LiteLLM", "Headroom", BARE)}
    makers = {
        "contextgate": contextgate,
        "LiteLLM": litellm,
        "Headroom": headroom,
        BARE: bare,
    }
    chosen = {name.strip() for name in args.only.split(",")} if args.only else set(makers)
    proxies = [make(ports[name], upstream) for name, make in makers.items() if name in chosen]
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        stack.enter_context(started(mock(mock_port), mock_port))
        running = [stack.enter_context(started(p, ports[p.name])) for p in proxies]
        print(f"{len(running)} proxies answering after {time.monotonic() - began:.0f} s")
        figures = measure(plan, running, ports, mock_port)
    figures.load = (load_before, os.getloadavg())
    figures.minutes = (time.monotonic() - began) / 60
    write(figures, None if args.quick or args.only else args.output)


if __name__ == "__main__":
    main()
