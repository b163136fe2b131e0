"""The offload store under load: latency of offload and restore, and what Redis costs a
gateway that offloads on every request.

    python -m bench.store [--output docs/BENCHMARKS.md]

1. Latency: objects of 10 KB, 200 KB and 2 MB (log-like text, so compression has work to
   do) are offloaded (``put``, each one new) and restored (``get``) one after another, on a
   private ``redis-server`` and on the in-memory store, side by side in the same run.
2. Throughput: a gateway (``contextgate serve``, one process) with Redis and one with the
   in-memory store, each in front of the mock upstream, answer a closed loop of requests
   whose history carries a large tool output, so the filter offloads on every request (the
   same output each time, as a client resending its history does).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from bench.load import closed_loop
from bench.overhead import ROOT, answers, free_port, process
from bench.report import publish, quantile
from gateway.config import StoreSettings
from gateway.store import MemoryStore
from gateway.store.redis import RedisBackend, RedisStore
from tests.harness import redis_server

START, END = "<!-- store:start -->", "<!-- store:end -->"
SIZES = {"10 KB": 10 * 1024, "200 KB": 200 * 1024, "2 MB": 2 * 1024 * 1024}


def log_like(size: int, seed: int) -> bytes:
    """``size`` bytes of log lines, unique per ``seed``."""
    line = f"{seed} 2026-11-22T02:00:00Z INFO worker-{seed % 7} handled request id=%d in %d ms\n"
    out = bytearray()
    i = 0
    while len(out) < size:
        out += (line % (i, i % 97)).encode()
        i += 1
    return bytes(out[:size])


async def latencies(url: str) -> list[str]:
    stores: dict[str, Any] = {
        "redis": RedisStore(RedisBackend(url, StoreSettings(timeout=5.0))),
        "memory": MemoryStore(),
    }
    lines = [
        "| object | backend | offload p50 | offload p99 | restore p50 | restore p99 |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for label, size in SIZES.items():
        runs = 200 if size < 1_000_000 else 40
        puts: dict[str, list[float]] = {name: [] for name in stores}
        gets: dict[str, list[float]] = {name: [] for name in stores}
        for i in range(runs):
            content = log_like(size, i)
            for name, store in stores.items():  # interleaved, same objects
                started = time.perf_counter()
                ref = await store.put("bench", content, ttl=600)
                puts[name].append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                await store.get("bench", ref)
                gets[name].append((time.perf_counter() - started) * 1000)
        lines.extend(
            f"| {label} | {name} | {statistics.median(puts[name]):.2f} |"
            f" {quantile(puts[name], 0.99):.2f} | {statistics.median(gets[name]):.2f} |"
            f" {quantile(gets[name], 0.99):.2f} |"
            for name in stores
        )
    await stores["redis"].backend.aclose()
    return lines


def request_body() -> bytes:
    output = log_like(60 * 1024, 1).decode()
    call = {"id": "c1", "type": "function", "function": {"name": "logs", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "Why did the deploy fail?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": output},
    ]
    return orjson.dumps({"model": "gpt-4o", "messages": messages})


def throughput(url: str) -> list[str]:
    mock_port = free_port()
    upstream = f"http://127.0.0.1:{mock_port}/v1"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("REDIS_URL", None)
    env.pop("CONTEXTGATE_CONFIG", None)
    mock_cmd = [sys.executable, "-m", "tests.mock_upstream", "--port", str(mock_port)]
    body = request_body()
    ports = {"redis": free_port(), "memory": free_port()}
    envs = {
        "redis": {**env, "CONTEXTGATE_UPSTREAM_BASE_URL": upstream, "REDIS_URL": url},
        "memory": {**env, "CONTEXTGATE_UPSTREAM_BASE_URL": upstream},
    }
    results: dict[str, list[float]] = {name: [] for name in ports}
    with process(mock_cmd, env, answers(f"{upstream}/models")):
        for name, port in ports.items():
            cmd = [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)]
            with process(cmd, envs[name], answers(f"http://127.0.0.1:{port}/healthz")):
                for concurrency in (8, 32):
                    rps, failed = asyncio.run(
                        closed_loop(
                            port,
                            "/v1/chat/completions",
                            body,
                            concurrency=concurrency,
                            seconds=6,
                        )
                    )
                    assert failed == 0, f"{name}: {failed} requests failed"
                    results[name].append(rps)
    return [
        "| store | 8 connections | 32 connections |",
        "|---|---:|---:|",
        *(
            f"| {name} | {values[0]:.0f} req/s | {values[1]:.0f} req/s |"
            for name, values in results.items()
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "BENCHMARKS.md")
    args = parser.parse_args()
    with redis_server() as redis:
        latency = asyncio.run(latencies(redis.url))
        rps = throughput(redis.url)
    publish(
        args.output,
        (START, END),
        "## Offload store (`make bench`)",
        "`make bench` (`python -m bench.store`). A private `redis-server` on loopback;"
        " milliseconds, from the gateway's store client.",
        [
            *latency,
            "",
            "Requests per second, each request carrying a 60 KB tool output that the filter"
            " offloads (the same output on every request), closed loop for 6 s:",
            "",
            *rps,
        ],
    )


if __name__ == "__main__":
    main()
