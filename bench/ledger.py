"""The ledger (the context inspector's record of each request, issue 28): what making an
entry costs the event loop, and what the entries cost in memory and in Redis.

    python -m bench.ledger [--output docs/BENCHMARKS.md]

Entries are made as the gateway makes them: each request's body is compacted by the real
pipeline (``pipelines.Pipeline``, the gateway's default policy, an in-memory offload
store, the conversation's state carried from one request to the next) and its entry made
by ``gateway.context.ledger.entry_of``. The conversations are the tau-bench airline
trajectories (``bench/data/``) laid end to end from a different trajectory each, cut at
20 to 200 messages, plus one long conversation of 1,243 messages (about 120K tokens, on
gpt-4o, so it is compacted on its way); an agent sends a request after each user message
and each tool result, so a conversation of n messages makes about n/2 requests.

1. ``entry_of``, timed (it runs on the gateway's event loop after each response), on the
   overhead benchmark's histories and on the conversations' requests by size; and
   ``MemoryLedger.add``, which compresses the detail there too.
2. The in-memory ledger at the default bounds (``gateway.config.inspector``): the bytes it
   counts (``.size``) against what ``tracemalloc`` sees it hold, per request; then the
   same conversations again and again under new names, well past ``max_bytes``, checking
   the count after every write and the process's RSS.
3. The Redis ledger on a private ``redis-server``: ``MEMORY USAGE`` of each of its keys
   and ``INFO memory``'s ``used_memory`` before and after, per request and per
   conversation, the long conversation at the 200-entry cap, and the namespace's bound
   (1,050 conversations written, 1,000 kept).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import json
import os
import statistics
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis as redis_sync

from bench.overhead import DATA, ROOT, history
from bench.report import publish, quantile
from gateway.config import Settings, StoreSettings
from gateway.config.inspector import InspectorSettings
from gateway.context.compaction import ChatRequest
from gateway.context.ledger import entry_of
from gateway.context.record import RequestRecord, new_request_id
from gateway.store import MemoryStore
from gateway.store.ledger import LedgerEntry, MemoryLedger
from gateway.store.ledger_redis import RedisLedger, _prefix
from gateway.store.redis import RedisBackend
from gateway.tenancy.auth import Caller
from gateway.tenancy.tenants import Tenants
from pipelines import Pipeline, Policy, TokenCounter
from tests.harness import redis_server

START, END = "<!-- ledger:start -->", "<!-- ledger:end -->"
HEADING = "## The ledger's memory and Redis bytes (`make bench`)"
NAMESPACE = "bench"
LENGTHS = (20, 40, 80, 120, 160, 200)
"""Messages of the conversations, in turn."""
CONVERSATIONS = 24
TIMED_RUNS = 40
KB = 1024
MB = 1024 * 1024


@dataclass
class Made:
    """One request's entry, with what it took to make."""

    messages: int
    entry: LedgerEntry
    ms: float


@dataclass
class Conversation:
    name: str
    made: list[Made]


def trajectories() -> list[list[dict[str, Any]]]:
    return [
        [{k: v for k, v in m.items() if v is not None or k == "content"} for m in t["traj"]]
        for t in json.loads(DATA.read_text())
    ]


def laid_end_to_end(trajs: list[list[dict[str, Any]]], first: int, length: int) -> list[Any]:
    """The system prompt, then whole trajectories from ``first`` on, cut at ``length``."""
    messages = [trajs[first][0]]
    index = first
    while len(messages) < length:
        messages += trajs[index % len(trajs)][1:]
        index += 1
    return messages[:length]


def caller() -> Caller:
    return Caller(NAMESPACE, Tenants(Settings()).passthrough)


async def conversation(
    pipeline: Pipeline, name: str, messages: list[dict[str, Any]], model: str
) -> Conversation:
    """Every request of an agent's conversation ending in ``messages`` (each prefix that
    ends at a user message or a tool result), compacted and its entry made."""
    who, catalog = caller(), pipeline.catalog
    policy: Policy = who.profile.policy
    state = None
    made: list[Made] = []
    cached = 0
    for end in range(2, len(messages) + 1):
        if messages[end - 1]["role"] not in ("user", "tool"):
            continue
        body = {"model": model, "messages": messages[:end]}
        now = time.time()
        result = await pipeline.compact(
            body, policy=policy, state=state, namespace=NAMESPACE, conversation=name, now=now
        )
        prompt = result.report.tokens_after
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": 120,
            "prompt_tokens_details": {"cached_tokens": min(cached, prompt) // 128 * 128},
        }
        record = RequestRecord(new_request_id(), at=now, answered=True, usage=usage)
        record.stream = False
        chat = ChatRequest(None, body, policy, result, NAMESPACE, name, state, who, None)
        started = time.perf_counter()
        entry = entry_of(chat, record, "chat", 200, catalog)
        made.append(Made(end, entry, (time.perf_counter() - started) * 1000))
        state = result.state.answered(at=now, usage=usage)
        cached = prompt
    return Conversation(name, made)


async def workload() -> tuple[list[Conversation], Conversation]:
    """The conversations of 20-200 messages, and the long one."""
    trajs = trajectories()
    pipeline = Pipeline(store=MemoryStore())
    short = [
        await conversation(
            pipeline,
            f"conv-{i}",
            laid_end_to_end(trajs, i * 7, LENGTHS[i % len(LENGTHS)]),
            "gpt-4o",
        )
        for i in range(CONVERSATIONS)
    ]
    long = laid_end_to_end(trajs, 0, 1_243)
    return short, await conversation(pipeline, "conv-long", long, "gpt-4o")


async def overhead_histories() -> list[tuple[str, int, float, float, LedgerEntry]]:
    """``entry_of`` and ``MemoryLedger.add`` on the overhead benchmark's requests
    (``bench/overhead.py``): name, messages, median ms of each, the entry."""
    counter = TokenCounter()
    pipeline = Pipeline(store=MemoryStore())
    who, catalog = caller(), pipeline.catalog
    cases = [
        ("1 message", "gpt-4o", [{"role": "user", "content": "Say hello."}]),
        ("20K-token history", "gpt-4o", history(20_000, counter)),
        ("60K-token history on gpt-4o", "gpt-4o", history(60_000, counter)),
        (
            "120K-token history on gpt-4.1, warm",
            "gpt-4.1",
            [*history(120_000, counter), {"role": "user", "content": "And reservation 7?"}],
        ),
    ]
    out = []
    for name, model, messages in cases:
        body = {"model": model, "messages": messages}
        policy = who.profile.policy
        result = await pipeline.compact(body, policy=policy, namespace=NAMESPACE)
        usage = {"prompt_tokens": result.report.tokens_after, "completion_tokens": 20}
        record = RequestRecord(new_request_id(), answered=True, usage=usage)
        chat = ChatRequest(None, body, policy, result, NAMESPACE, "c", None, who, None)
        times, adds = [], []
        ledger = MemoryLedger(max_bytes=InspectorSettings().memory_max_bytes, **bounds())
        gc.collect()
        for _ in range(TIMED_RUNS):
            started = time.perf_counter()
            entry = entry_of(chat, record, "chat", 200, catalog)
            made = time.perf_counter()
            await ledger.add(NAMESPACE, "c", copied(entry, new_request_id()))
            times.append((made - started) * 1000)
            adds.append((time.perf_counter() - made) * 1000)
        out.append((name, len(messages), statistics.median(times), statistics.median(adds), entry))
    return out


def copied(entry: LedgerEntry, request_id: str | None = None) -> LedgerEntry:
    """``entry`` with bytes of its own (as a newly made entry has)."""
    return LedgerEntry(
        request_id or entry.request_id,
        entry.at,
        bytes(memoryview(entry.summary)),
        bytes(memoryview(entry.detail)) if entry.detail is not None else None,
        entry.totals,
    )


def rss() -> int:
    """This process's resident bytes, after the collector ran and the allocator gave back
    what it holds free (else RSS keeps the workload's high-water mark)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def bounds() -> dict[str, Any]:
    inspector = InspectorSettings()
    return {
        "max_requests": inspector.requests_per_conversation,
        "max_details": inspector.detailed_requests,
        "max_conversations": inspector.conversations_per_namespace,
        "ttl": inspector.ttl,
    }


def replayed(conversations: list[Conversation], rounds: int) -> Iterator[tuple[str, LedgerEntry]]:
    """The conversations' entries ``rounds`` times, each round under new names and ids."""
    for n in range(rounds):
        for conv in conversations:
            for made in conv.made:
                yield f"{conv.name}-{n}", copied(made.entry, new_request_id())


async def memory(conversations: list[Conversation]) -> dict[str, Any]:
    """The in-memory ledger: counted and traced bytes for the workload once, then RSS and
    the count while the workload is replayed until well past ``max_bytes``."""
    inspector = InspectorSettings()
    out: dict[str, Any] = {"max_bytes": inspector.memory_max_bytes}
    # Once, traced: what it holds against what it counts.
    ledger = MemoryLedger(max_bytes=inspector.memory_max_bytes, **bounds())
    entries = [(c.name, copied(m.entry)) for c in conversations for m in c.made]
    add_ms: list[float] = []
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for name, entry in entries:
        started = time.perf_counter()
        await ledger.add(NAMESPACE, name, entry)
        add_ms.append((time.perf_counter() - started) * 1000)
    del entries, entry
    gc.collect()
    out["traced"] = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    out["add_ms"] = add_ms
    out["counted"] = ledger.size
    out["held"] = sum(min(len(c.made), inspector.requests_per_conversation) for c in conversations)
    out["conversations"] = len(conversations)
    held = ledger._conversations[NAMESPACE]
    out["long"] = max(held.values(), key=lambda found: found.bytes).bytes
    out["typical"] = statistics.median(found.bytes for found in held.values())
    del ledger
    gc.collect()
    # Again and again under new names: the bound holds and RSS levels off.
    ledger = MemoryLedger(max_bytes=inspector.memory_max_bytes, **bounds())
    sent = sum(len(c.made) for c in conversations)
    rounds = max(3, -(-3 * inspector.memory_max_bytes // max(1, out["counted"])))
    start_rss = rss()
    peak, written, samples = 0, 0, []
    for name, entry in replayed(conversations, rounds):
        await ledger.add(NAMESPACE, name, entry)
        peak = max(peak, ledger.size)
        written += len(entry.summary) + len(entry.detail or b"")
        if written // (256 * MB) > len(samples):
            samples.append((written, ledger.size, rss() - start_rss))
    gc.collect()
    out.update(
        rounds=rounds,
        replayed=rounds * sent,
        written=written,
        peak=peak,
        end_size=ledger.size,
        end_rss=rss() - start_rss,
        samples=samples,
        kept=len(ledger._conversations.get(NAMESPACE, {})),
    )
    return out


async def redis_bytes(url: str, conversations: list[Conversation], long: Conversation) -> Any:
    """The Redis ledger's keys after the workload and after the long conversation, and
    the namespace's bound."""
    backend = RedisBackend(url, StoreSettings(timeout=5.0))
    ledger = RedisLedger(backend, **bounds())
    plain = redis_sync.Redis.from_url(url)
    plain.flushall()
    # The scripts loaded and the allocator warmed on another namespace, then flushed.
    warm = conversations[0].made[0].entry
    await ledger.add("warm", "c", warm)
    plain.flushall()
    plain.config_set("activedefrag", "no")

    def used() -> int:
        return int(plain.info("memory")["used_memory"])

    def keys(namespace: str, conversation: str = "") -> dict[str, int]:
        match = _prefix(namespace) + conversation + "*"  # braces are no glob's
        found = {}
        for key in plain.scan_iter(match=match, count=1000):
            found[key.decode()] = int(plain.memory_usage(key, samples=0) or 0)
        return found

    out: dict[str, Any] = {"version": plain.info("server")["redis_version"]}
    base = used()
    add_ms: list[float] = []
    for conv in conversations:
        for made in conv.made:
            started = time.perf_counter()
            await ledger.add(NAMESPACE, conv.name, made.entry)
            add_ms.append((time.perf_counter() - started) * 1000)
    out["add_ms"] = add_ms
    out["used"] = used() - base
    found = keys(NAMESPACE)
    out["keys"] = found
    out["held"] = sum(min(len(c.made), 200) for c in conversations)
    summaries = sum(len(m.entry.summary) for c in conversations for m in c.made[-200:])
    out["summaries"] = summaries

    def by_kind(found: dict[str, int], kind: str) -> int:
        return sum(size for key, size in found.items() if key.endswith(":" + kind))

    out["log"], out["detail"], out["row"] = (by_kind(found, k) for k in ("log", "detail", "row"))
    out["idx"] = by_kind(found, "idx")
    # The long conversation, past its 200-entry cap, in a namespace of its own.
    before = used()
    sizes = []
    for i, made in enumerate(long.made, 1):
        await ledger.add("long", long.name, made.entry)
        if i in (100, 200, 400, len(long.made)):
            length = int(plain.llen(_prefix("long") + long.name + ":log"))
            sizes.append((i, length, sum(keys("long", long.name).values())))
    out["long_used"] = used() - before
    out["long_sizes"] = sizes
    out["long_keys"] = keys("long", long.name)
    out["long_requests"] = len(long.made)
    # The namespace's bound: 1,050 conversations of one small entry each.
    small = conversations[0].made[0].entry
    for i in range(1_050):
        await ledger.add("many", f"c{i}", copied(small, new_request_id()))
    out["many_index"] = int(plain.zcard(_prefix("many") + "idx"))
    out["many_keys"] = len(keys("many"))
    plain.close()
    await backend.aclose()
    return out


def kib(n: float) -> str:
    return f"{n / KB:,.1f} KB"


def mib(n: float) -> str:
    return f"{n / MB:,.2f} MB"


def report(
    timings: list[tuple[str, int, float, float, LedgerEntry]],
    conversations: list[Conversation],
    long: Conversation,
    mem: dict[str, Any],
    red: dict[str, Any],
) -> list[str]:
    lines = [
        "`entry_of` on the overhead benchmark's requests, each made once through the"
        f" pipeline and its entry made {TIMED_RUNS} times (median):",
        "",
        "| request | messages | `entry_of` p50 | `MemoryLedger.add` p50 | summary |"
        " detail (JSON) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {name} | {count:,} | {ms:.2f} ms | {add:.2f} ms | {kib(len(entry.summary))} |"
        f" {kib(len(entry.detail or b''))} |"
        for name, count, ms, add, entry in timings
    ]
    everything = [m for c in [*conversations, long] for m in c.made]
    buckets = [
        ("up to 50 messages", lambda m: m.messages <= 50),
        ("51-200 messages", lambda m: 50 < m.messages <= 200),
        ("201-600 messages", lambda m: 200 < m.messages <= 600),
        ("601-1,243 messages", lambda m: m.messages > 600),
    ]
    lines += [
        "",
        f"`entry_of` over the workload's requests ({len(conversations)} conversations of"
        f" {LENGTHS[0]}-{LENGTHS[-1]} messages, {sum(len(c.made) for c in conversations):,}"
        f" requests, and the long conversation's {len(long.made)}), by the request's"
        " messages; the entry's sizes are means:",
        "",
        "| request | requests | `entry_of` p50 | p90 | summary | detail (JSON) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, test in buckets:
        chosen = [m for m in everything if test(m)]
        if not chosen:
            continue
        ms = [m.ms for m in chosen]
        lines.append(
            f"| {label} | {len(chosen):,} | {statistics.median(ms):.2f} ms |"
            f" {quantile(ms, 0.9):.2f} ms |"
            f" {kib(statistics.mean(len(m.entry.summary) for m in chosen))} |"
            f" {kib(statistics.mean(len(m.entry.detail or b'') for m in chosen))} |"
        )
    add = mem["add_ms"]
    radd = red["add_ms"]
    per_entry = red["log"] / red["held"]
    detail_each = red["detail"] / len(conversations)
    row_each = red["row"] / len(conversations)
    typical_cap = 200 * per_entry + detail_each + row_each
    lines += [
        "",
        f"`MemoryLedger.add` (which compresses the detail): p50 {statistics.median(add):.3f} ms,"
        f" p99 {quantile(add, 0.99):.3f} ms; `RedisLedger.add` (one script, a round trip):"
        f" p50 {statistics.median(radd):.3f} ms, p99 {quantile(radd, 0.99):.3f} ms.",
        "",
        "The in-memory ledger at the default bounds, after the workload once"
        f" ({mem['conversations']} conversations, {mem['held']:,} entries held, the latest 5"
        " of each with their detail):",
        "",
        "| measure | in all | per request held |",
        "|---|---:|---:|",
        f"| counted (`MemoryLedger.size`) | {mib(mem['counted'])} |"
        f" {kib(mem['counted'] / mem['held'])} |",
        f"| held, by `tracemalloc` | {mib(mem['traced'])} | {kib(mem['traced'] / mem['held'])} |",
        "",
        f"A conversation counts {kib(mem['typical'])} (the median), the long one at its"
        f" 200-entry cap {kib(mem['long'])}.",
        "",
        f"The workload again {mem['rounds']} times under new names ({mem['replayed']:,}"
        f" requests, {mib(mem['written'])} of summaries and details made), the count checked"
        f" after every write: at most {mib(mem['peak'])} (the bound: {mib(mem['max_bytes'])}),"
        f" {mib(mem['end_size'])} at the end with {mem['kept']} conversations kept; the"
        " process's RSS grew by "
        + ", ".join(
            f"{mib(grown)} after {mib(made)} made (counted {mib(size)})"
            for made, size, grown in mem["samples"][:: max(1, len(mem["samples"]) // 4)]
        )
        + f", {mib(mem['end_rss'])} at the end.",
        "",
        f"The Redis ledger (redis-server {red['version']}), `MEMORY USAGE ... SAMPLES 0` of"
        f" its keys after the workload ({red['held']:,} entries held, summaries"
        f" {kib(red['summaries'] / red['held'])} on average):",
        "",
        "| keys | bytes | per request held |",
        "|---|---:|---:|",
        f"| the logs (`:log`, every summary) | {mib(red['log'])} |"
        f" {kib(red['log'] / red['held'])} |",
        f"| the details (`:detail`, the latest 5 per conversation, compressed) |"
        f" {mib(red['detail'])} | {kib(red['detail'] / red['held'])} |",
        f"| the rows (`:row`) and the index (`idx`) | {mib(red['row'] + red['idx'])} |"
        f" {kib((red['row'] + red['idx']) / red['held'])} |",
        f"| all keys | {mib(sum(red['keys'].values()))} |"
        f" {kib(sum(red['keys'].values()) / red['held'])} |",
        f"| `used_memory` delta | {mib(red['used'])} | {kib(red['used'] / red['held'])} |",
        "",
        f"The long conversation ({red['long_requests']} requests of up to 1,243 messages) in"
        " a namespace of its own, its keys' `MEMORY USAGE`: "
        + ", ".join(
            f"{mib(size)} after {n} requests ({length} entries kept)"
            for n, length, size in red["long_sizes"]
        )
        + f"; `used_memory` grew by {mib(red['long_used'])} (with the namespace's index). Its"
        " keys at the end: "
        + ", ".join(
            f"`:{key.rsplit(':', 1)[1]}` {kib(size)}" for key, size in red["long_keys"].items()
        )
        + ".",
        "",
        f"1,050 conversations written to one namespace: {red['many_index']:,} indexed,"
        f" {red['many_keys']:,} keys (with the index) left. At the default bounds (1,000"
        " conversations of 200 entries), a namespace of conversations like the workload's,"
        f" each at its cap ({kib(per_entry)} an entry, a detail hash of {kib(detail_each)}"
        f" and a row of {kib(row_each)}), would take {typical_cap * 1000 / 1e9:.2f} GB of"
        " Redis; one of conversations like the long one at its cap"
        f" {red['long_sizes'][-1][2] * 1000 / 1e9:.2f} GB.",
    ]
    return lines


async def measure() -> tuple[Any, ...]:
    timings = await overhead_histories()
    conversations, long = await workload()
    return timings, conversations, long


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "BENCHMARKS.md")
    args = parser.parse_args()
    timings, conversations, long = asyncio.run(measure())
    print(f"workload: {sum(len(c.made) for c in conversations)} requests + {len(long.made)}")
    mem = asyncio.run(memory([*conversations, long]))
    with redis_server() as server:
        red = asyncio.run(redis_bytes(server.url, conversations, long))
    publish(
        args.output,
        (START, END),
        HEADING,
        "`make bench` (`python -m bench.ledger`): entries made by `entry_of` from requests"
        " compacted by the pipeline (tau-bench airline conversations, gpt-4o, the default"
        " policy), written to the ledgers at the default bounds (200 entries per"
        " conversation, detail for the latest 5, 1,000 conversations per namespace, 32 MiB"
        " in memory).",
        report(timings, conversations, long, mem, red),
    )


if __name__ == "__main__":
    main()
