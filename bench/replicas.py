"""Scale-out: one, two and three gateway replicas sharing one Redis, and what a replica
holds in memory at rest and per request in flight.

    python -m bench.replicas [--quick] [--rounds 5] [--seconds 2] [--output docs/BENCHMARKS.md]

1. Throughput and latency: three ``contextgate serve`` processes on one private
   ``redis-server``, in front of one mock upstream. The closed-loop load generator
   (``bench/load.py``) spreads its connections round-robin over the first 1, 2 or 3
   replicas, or sends the same load straight to the mock; the four configurations take
   turns within each round, in an order that rotates from round to round, and the figures
   are medians over the rounds. The CPU the serving processes spent per request (from
   /proc) is measured with each run: unlike req/s, it barely depends on what else the
   machine is running.
2. Memory: two more replicas on the same Redis, in front of a second mock that answers
   slowly (stream events paced, completions held), are sampled at rest after a warm-up and
   at their peak while one holds 100 streams and the other 100 non-streamed 20K-token
   requests, all in flight at once.

``--quick`` is a smoke run (one short round; most of its minute goes to starting the
seven processes); it prints its results and writes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.load import closed_loop, on_new_connection, request_bytes
from bench.overhead import ROOT, answers, free_port, history
from bench.report import publish, quantile
from pipelines import TokenCounter
from tests.harness import redis_server

START, END = "<!-- replicas:start -->", "<!-- replicas:end -->"
HEADING = "## Scale-out: replicas on one Redis (`make bench`)"
PATH = "/v1/chat/completions"
REPLICAS = 3
MIB = 1024 * 1024


@dataclass(frozen=True)
class Plan:
    """How long and how often each measurement runs."""

    rounds: int
    seconds: float
    """Length of one closed loop (one configuration, one load, one round)."""
    concurrencies: tuple[int, ...] = (16, 64)
    held: int = 100
    """Requests held in flight at once for the memory samples."""
    holds: int = 3
    """Times each memory replica holds them (a round each)."""
    stream_interval: float = 0.2
    """Seconds between the slow mock's stream events (34 events: about 7 s a stream)."""
    delay: float = 7.0
    """Seconds the slow mock holds a completion."""


QUICK = Plan(rounds=1, seconds=0.5, concurrencies=(16,), holds=1, stream_interval=0.08, delay=3.0)


@dataclass(frozen=True)
class Load:
    name: str
    body: bytes


def bodies(counter: TokenCounter) -> tuple[Load, Load, bytes]:
    """The small request, the mid-size history, and a small streamed request."""
    small = [{"role": "user", "content": "Say hello."}]
    mid = history(20_000, counter)

    def body(messages: list[dict[str, Any]], stream: bool = False) -> bytes:
        return orjson.dumps({"model": "gpt-4o", "messages": messages, "stream": stream})

    tokens = counter.count_messages(mid)
    return (
        Load("1 message", body(small)),
        Load(f"{round(tokens, -3) // 1000:.0f}K-token history", body(mid)),
        body(small, stream=True),
    )


def memory(pid: int) -> dict[str, float]:
    """MiB of the process: resident (RSS), proportional (PSS) and unique (USS) set."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            out["rss"] = int(line.split()[1]) * 1024 / MIB
    private = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name == "Pss":
            out["pss"] = int(rest.split()[0]) * 1024 / MIB
        elif name in ("Private_Clean", "Private_Dirty"):
            private += int(rest.split()[0]) * 1024
    out["uss"] = private / MIB
    return out


# -- throughput -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """Where a closed loop sends its connections (round-robin), and the processes that
    serve them."""

    name: str
    ports: list[int]
    pids: list[int]


@dataclass(frozen=True)
class Run:
    rps: float
    p50: float
    p99: float
    cpu: float
    """Milliseconds of CPU (user and system) the target's processes spent per request."""
    redis_cpu: float
    """The same for the shared redis-server."""


def targets(mock: tuple[int, int], replicas: list[tuple[int, int]]) -> list[Target]:
    """The mock alone (``direct``), then the first 1, 2, ... replicas; (port, pid) pairs."""
    out = [Target("direct", [mock[0]], [mock[1]])]
    for n in range(1, len(replicas) + 1):
        ports, pids = zip(*replicas[:n], strict=True)
        out.append(Target(f"{n} replica{'s' if n > 1 else ''}", list(ports), list(pids)))
    return out


def cpu_seconds(pids: list[int]) -> float:
    """User plus system CPU seconds the processes have used so far."""
    ticks = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def closed(load: Load, concurrency: int, target: Target, seconds: float, redis: int) -> Run:
    latencies: list[float] = []
    cpu, redis_cpu = cpu_seconds(target.pids), cpu_seconds([redis])
    rps, failed = asyncio.run(
        closed_loop(
            target.ports,
            PATH,
            load.body,
            concurrency=concurrency,
            seconds=seconds,
            latencies=latencies,
        )
    )
    cpu, redis_cpu = cpu_seconds(target.pids) - cpu, cpu_seconds([redis]) - redis_cpu
    if failed:
        raise RuntimeError(f"{failed} requests failed ({load.name}, {target.name})")
    return Run(
        rps,
        statistics.median(latencies),
        quantile(latencies, 0.99),
        cpu * 1000 / len(latencies),
        redis_cpu * 1000 / len(latencies),
    )


def throughput(plan: Plan, loads: tuple[Load, ...], every: list[Target], redis: int) -> list[str]:
    """Closed loops over every (load, concurrency, target), the targets in an order that
    rotates from round to round; a table of medians over the rounds."""
    cells = [(load, c) for load in loads for c in plan.concurrencies]
    runs: dict[tuple[str, int, str], list[Run]] = {}
    for load, concurrency in cells:  # warm every path: connections, caches, the record
        for target in every:
            closed(load, concurrency, target, min(1.0, plan.seconds), redis)
    for i in range(plan.rounds):
        order = every[i % len(every) :] + every[: i % len(every)]
        for load, concurrency in cells:
            for target in order:
                run = closed(load, concurrency, target, plan.seconds, redis)
                runs.setdefault((load.name, concurrency, target.name), []).append(run)
                print(
                    f"round {i + 1} {load.name:18s} {concurrency:3d} conn {target.name:10s}"
                    f" {run.rps:6.0f} req/s  p50 {run.p50:6.2f}  p99 {run.p99:6.2f} ms"
                    f"  cpu {run.cpu:5.2f} ms/req (redis {run.redis_cpu * 1000:.0f} µs)"
                )

    lines = [
        "| load | connections | target | req/s | vs 1 replica | p50 ms | p99 ms |"
        " p50 over direct | p99 over direct | server CPU per request | Redis CPU per request |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for load, concurrency in cells:
        direct = runs[(load.name, concurrency, "direct")]
        single = statistics.median(r.rps for r in runs[(load.name, concurrency, every[1].name)])
        for target in every:
            own = runs[(load.name, concurrency, target.name)]
            rps = statistics.median(r.rps for r in own)
            # each round's difference against the direct run of the same round
            pairs = list(zip(own, direct, strict=True))
            over = target.name != "direct"
            row = [
                load.name,
                str(concurrency),
                target.name,
                f"{rps:.0f}",
                f"{rps / single:.2f}x" if over else "",
                f"{statistics.median(r.p50 for r in own):.2f}",
                f"{statistics.median(r.p99 for r in own):.2f}",
                f"{statistics.median(g.p50 - d.p50 for g, d in pairs):.2f}" if over else "",
                f"{statistics.median(g.p99 - d.p99 for g, d in pairs):.2f}" if over else "",
                f"{statistics.median(r.cpu for r in own):.2f} ms",
                f"{statistics.median(r.redis_cpu for r in own) * 1000:.0f} µs" if over else "",
            ]
            lines.append("| " + " | ".join(row) + " |")
    return lines


# -- memory -----------------------------------------------------------------------------------


async def in_flight(port: int) -> float:
    async with httpx.AsyncClient() as client:
        response = await client.get(f"http://127.0.0.1:{port}/metrics")
    for line in response.text.splitlines():
        if line.startswith("contextgate_requests_in_flight "):
            return float(line.split()[1])
    raise RuntimeError("/metrics has no contextgate_requests_in_flight")


async def hold(port: int, pid: int, body: bytes, n: int) -> dict[str, float]:
    """Send ``n`` requests at once on ``n`` connections and read every answer to the end;
    the replica's peak memory from the moment all ``n`` are in flight (by its own gauge)
    until the first answer ends."""
    request = request_bytes(PATH, body)
    tasks = [asyncio.create_task(on_new_connection(port, request)) for _ in range(n)]
    deadline = time.monotonic() + 30
    while await in_flight(port) < n:
        if time.monotonic() > deadline or any(task.done() for task in tasks):
            raise RuntimeError(f"{n} requests were never in flight at once; slow the mock down")
        await asyncio.sleep(0.05)
    peak = memory(pid)
    while not any(task.done() for task in tasks):
        sample = memory(pid)
        if sample["rss"] > peak["rss"]:
            peak = sample
        await asyncio.sleep(0.02)
    statuses = await asyncio.gather(*tasks)
    if any(status != 200 for status in statuses):
        raise RuntimeError(f"answers while held: {sorted(set(statuses))}")
    return peak


def at_rest(pid: int) -> dict[str, float]:
    time.sleep(1)
    return memory(pid)


def sizing(plan: Plan, kind: str, port: int, pid: int, body: bytes) -> list[str]:
    """Table rows for one replica that serves one kind of request: warmed with 5 of them at
    once, then per round its memory at rest and its peak with ``plan.held`` in flight."""
    asyncio.run(hold(port, pid, body, 5))
    n = plan.held
    rows = []
    for i in range(plan.holds):
        rest = at_rest(pid)
        peak = asyncio.run(hold(port, pid, body, n))
        growth = peak["rss"] - rest["rss"]
        print(f"{kind}, round {i + 1}: at rest {rest}, {n} in flight {peak}")
        rows.append(
            f"| {kind} | {i + 1} | {rest['rss']:.1f} | {rest['pss']:.1f} | {rest['uss']:.1f} |"
            f" {peak['rss']:.1f} | {growth:.1f} | {growth * 1024 / n:.0f} KiB |"
        )
    return rows


# -- processes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Service:
    """A process to run for the benchmark: its command, environment and readiness check."""

    args: list[str]
    env: dict[str, str]
    ready: Callable[[], bool]


def environment(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in list(env):
        if name.startswith(("CONTEXTGATE_", "REDIS", "OTEL_")):
            del env[name]
    return {**env, **extra}


def mock_upstream(port: int, *options: str) -> Service:
    cmd = [sys.executable, "-m", "tests.mock_upstream", "--port", str(port), *options]
    return Service(cmd, environment(), answers(f"http://127.0.0.1:{port}/v1/models"))


def gateway(port: int, redis_url: str, upstream: int) -> Service:
    """A ``contextgate serve`` replica with default settings on ``redis_url``."""
    env = environment(
        REDIS_URL=redis_url, CONTEXTGATE_UPSTREAM_BASE_URL=f"http://127.0.0.1:{upstream}/v1"
    )
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)]
    return Service(cmd, env, answers(f"http://127.0.0.1:{port}/healthz"))


@contextlib.contextmanager
def running(services: list[Service]) -> Iterator[list[int]]:
    """Start every service at once (each one's stderr to a file of its own), wait until all
    answer, and yield their pids; terminate them all on the way out."""
    with contextlib.ExitStack() as stack:
        started = []
        for service in services:
            stderr = stack.enter_context(tempfile.TemporaryFile())
            proc = subprocess.Popen(
                service.args, env=service.env, stdout=subprocess.DEVNULL, stderr=stderr
            )
            stack.callback(proc.wait, 15)
            stack.callback(proc.terminate)
            started.append((service, proc, stderr))
        began = time.monotonic()
        deadline = began + 90
        waiting = list(started)
        while waiting:
            for service, proc, stderr in waiting:
                if proc.poll() is not None or time.monotonic() > deadline:
                    stderr.seek(0)
                    raise RuntimeError(f"{service.args[:4]} did not start: {stderr.read()!r}")
            time.sleep(0.1)
            waiting = [entry for entry in waiting if not entry[0].ready()]
        print(f"{len(started)} processes answering after {time.monotonic() - began:.1f} s")
        yield [proc.pid for _, proc, _ in started]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a smoke run; writes nothing")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "BENCHMARKS.md")
    args = parser.parse_args()
    plan = QUICK if args.quick else Plan(rounds=args.rounds, seconds=args.seconds)
    small, mid, stream = bodies(TokenCounter())
    loads = (small,) if args.quick else (small, mid)

    fast, slow = free_port(), free_port()
    replicas = [free_port() for _ in range(REPLICAS)]
    streams_port, requests_port = free_port(), free_port()
    with redis_server() as redis:
        services = [
            mock_upstream(fast),
            mock_upstream(
                slow, "--stream-interval", str(plan.stream_interval), "--delay", str(plan.delay)
            ),
            *(gateway(port, redis.url, fast) for port in replicas),
            gateway(streams_port, redis.url, slow),
            gateway(requests_port, redis.url, slow),
        ]
        assert redis.process is not None
        with running(services) as pids:
            serving = list(zip(replicas, pids[2 : 2 + REPLICAS], strict=True))
            table = throughput(plan, loads, targets((fast, pids[0]), serving), redis.process.pid)
            settled = [at_rest(pid)["rss"] for _, pid in serving]
            rows = [
                *sizing(plan, "streams", streams_port, pids[-2], stream),
                *sizing(plan, f"{mid.name} requests", requests_port, pids[-1], mid.body),
            ]

    n = plan.held
    how = (
        f"`make bench` (`python -m bench.replicas --rounds {plan.rounds} --seconds"
        f" {plan.seconds:g}`). Medians of {plan.rounds} rounds of {plan.seconds:g} s closed"
        " loops; the overheads are each round's difference against the direct run of the"
        " same round."
    )
    lines = [
        *table,
        "",
        "RSS of the three replicas at rest after these rounds: "
        + ", ".join(f"{rss:.1f}" for rss in settled)
        + " MiB.",
        "",
        f"Memory of a replica (MiB, from /proc) at rest and at its peak while {n} requests of"
        f" one kind are in flight at once; per request: the growth divided by {n}. One"
        f" replica per kind, warmed with 5 at once. Streams: 34 events, one every"
        f" {plan.stream_interval:g} s; {mid.name} requests ({len(mid.body) // 1024} KB)"
        f" answered after {plan.delay:g} s.",
        "",
        f"| in flight | round | at rest: RSS | PSS | USS | peak RSS, {n} in flight | growth |"
        " per request |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
    ]
    if args.quick:
        print("\n".join(lines))
        return
    publish(args.output, (START, END), HEADING, how, lines)


if __name__ == "__main__":
    main()
