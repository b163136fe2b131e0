"""Context quality on real agent traces: contextgate's pipeline against baselines and
Headroom.

    python -m bench.compaction [--trajectories 200] [--output docs/BENCHMARKS.md]
                               [--plots docs/img] [--no-headroom]

Every tau-bench airline trajectory is replayed as a client would send it (after each user
message and each complete block of tool results), under a small ``max-input`` so that
compaction is needed, each trajectory as a session and then chained into long sessions
(one agent serving customer after customer), by five methods:

- ``none``: the raw history, whatever its size;
- ``drop-oldest``: drop the oldest non-system messages until it fits (as LiteLLM's
  ``trim_messages`` does), which can split a tool call from its result;
- ``middle-out``: drop messages from the middle until it fits (OpenRouter's transform);
- ``headroom``: Headroom's compression, run in its own virtualenv
  (``bench.quality_headroom``); it enforces no budget;
- ``contextgate``: the default pipeline with an in-memory store.

Per method: tokens sent, requests over budget, requests with a broken tool-call pair, the
share of sent tokens that repeat the previous request's prefix (what a provider's prompt
cache could reuse), a cost under Anthropic-style cache pricing (prefix tokens read at
0.1x, the rest written at 1.25x; one unit per uncached input token), fact retention and
reversibility (``bench.quality``); for contextgate also the pipeline's own time per
request. A PNG per run plots tokens per request and cost per session
(``bench.quality_plots``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import re
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from bench.quality import Fact, Quality, due_at, facts_of, restored
from bench.quality_headroom import Compressed, compress_sessions, headroom_version
from bench.report import machine, quantile, write_block
from gateway.store import MemoryStore
from pipelines import CompactResult, ConversationState, Pipeline, Policy, RequestRejected
from pipelines.ports import Summaries
from pipelines.tokens import REPLY_PRIMING, TokenCounter

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "bench" / "data" / "tau-bench-gpt-4o-airline.json"
START, END = "<!-- compaction:start -->", "<!-- compaction:end -->"
REF = re.compile(r"ctx_[A-Za-z0-9_-]{22,}")
Messages = list[dict[str, Any]]
LONG_RUNS = ((100, 8_000), (100, 16_000), (400, 8_000))
"""Long sessions replayed: (requests per session, max-input)."""


def requests_of(messages: Messages) -> list[Messages]:
    """The histories a client sends while the trajectory unfolds."""
    out = []
    for end in range(2, len(messages) + 1):
        last = messages[end - 1]
        following = messages[end] if end < len(messages) else None
        if last["role"] == "user" or (
            last["role"] == "tool" and (following is None or following["role"] != "tool")
        ):
            out.append(messages[:end])
    return out


TURN_GAP_S = 5.0
"""Seconds between the turns of a replayed session: well within every cache TTL."""


class Session:
    """One conversation sent through a pipeline as the gateway sends it: the conversation's
    record carried from request to request, on a simulated clock."""

    def __init__(
        self,
        pipeline: Pipeline,
        policy: Policy,
        model: str = "gpt-4o",
        summaries: Summaries | None = None,
    ) -> None:
        self.pipeline, self.policy, self.model = pipeline, policy, model
        self.summaries = summaries
        self.state: ConversationState | None = None
        self.now = 1_000_000.0

    async def send(self, history: Messages, *, after: float = TURN_GAP_S) -> CompactResult:
        """Compact ``history``, sent ``after`` seconds after the previous request."""
        self.now += after
        result = await self.pipeline.compact(
            {"model": self.model, "messages": history},
            policy=self.policy,
            state=self.state,
            now=self.now,
            summaries=self.summaries,
        )
        self.state = result.state.answered(at=self.now)
        return result


def pairs_valid(messages: Messages) -> bool:
    """Every call answered right after it, every tool message answering such a call."""
    pending: set[str] = set()
    for message in messages:
        if message["role"] == "tool":
            if message.get("tool_call_id") not in pending:
                return False
            pending.discard(message["tool_call_id"])
            continue
        if pending:
            return False
        pending = {c["id"] for c in message.get("tool_calls") or ()}
    return not pending


def drop_oldest(messages: Messages, budget: int, count: Callable[[Messages], int]) -> Messages:
    system = [m for m in messages if m["role"] == "system"]
    rest = [m for m in messages if m["role"] != "system"]
    sizes = [count([m]) - REPLY_PRIMING for m in rest]
    total = count(system) + sum(sizes)
    start = 0
    while len(rest) - start > 1 and total > budget:
        total -= sizes[start]
        start += 1
    return system + rest[start:]


def middle_out(messages: Messages, budget: int, count: Callable[[Messages], int]) -> Messages:
    system = [m for m in messages if m["role"] == "system"]
    rest = [m for m in messages if m["role"] != "system"]
    sizes = [count([m]) - REPLY_PRIMING for m in rest]
    total = count(system) + sum(sizes)
    while len(rest) > 2 and total > budget:
        middle = len(rest) // 2
        total -= sizes.pop(middle)
        rest.pop(middle)
    return system + rest


class Tally:
    """What one method sent over a replay: tokens, prefix, cost (also per session and per
    request, for the plots), and what the sent requests still carry (``quality``)."""

    def __init__(self, counter: TokenCounter, budget: int) -> None:
        self.counter, self.budget = counter, budget
        self.tokens = self.prefix = self.requests = self.over = self.broken = 0
        self.sessions = self.refs = self.restorable = 0
        self.cost = 0.0
        self.floor = 0.0
        """On the raw history: what a method would cost that sent ``FLOOR_SHARE`` x the
        budget of its tokens as they are per request (the whole history while it is
        shorter) and never rewrote what it sent before (``cost_floor``)."""
        self.previous: Messages = []
        self.session_costs: list[float] = []
        self.turn_tokens: list[list[int]] = []
        self.quality = Quality()

    def add(self, sent: Messages, new_trajectory: bool, expired: bool = False) -> None:
        """Count one request; ``expired``: the provider's cache lapsed before it."""
        if new_trajectory:
            self.sessions += 1
            self.session_costs.append(0.0)
            self.turn_tokens.append([])
            self.quality.start_session()
        if new_trajectory or expired:
            self.previous = []
        size = REPLY_PRIMING + sum(self.counter.count_message(m) for m in sent)
        shared = 0
        for before, now in zip(self.previous, sent, strict=False):
            if before != now:
                break
            shared += self.counter.count_message(now)
        cost = 0.1 * shared + 1.25 * (size - shared)
        self.floor += cost_floor(size, size - shared, int(FLOOR_SHARE * self.budget))
        self.tokens += size
        self.prefix += shared
        self.cost += cost
        self.session_costs[-1] += cost
        self.turn_tokens[-1].append(size)
        self.requests += 1
        self.over += size > self.budget
        self.broken += not pairs_valid(sent)
        self.previous = sent


FLOOR_SHARE = 0.45
"""The default policy's ``target``: where a compaction leaves a request."""


def cost_floor(size: int, new: int, kept: int) -> float:
    """The least a request of ``size`` tokens, ``new`` of them new, can cost under cache
    pricing when ``kept`` of its tokens are sent as they are (all of them if fewer): the
    new ones written, the rest read from the cache. A method that sends that much of the
    history unchanged pays no less (a compaction also rewrites its prefix, which this
    never does); only re-encoding the same content in fewer tokens goes under it."""
    sent = min(size, kept)
    written = min(new, sent)
    return 0.1 * (sent - written) + 1.25 * written


@dataclass(frozen=True, slots=True)
class Replayed:
    """A session to replay: its messages, the histories the client sends, the facts."""

    messages: Messages
    requests: list[Messages]
    due: dict[int, list[Fact]]

    @classmethod
    def of(cls, messages: Messages, facts: list[Fact]) -> Replayed:
        requests = requests_of(messages)
        return cls(messages, requests, due_at(facts, [len(r) for r in requests]))


def single_sessions(trajectories: list[Any]) -> list[Replayed]:
    """Each trajectory as its own session."""
    return [
        Replayed.of(t["traj"], facts_of(t["traj"], t["info"]["task"]["actions"]))
        for t in trajectories
    ]


def chained_sessions(trajectories: list[Any], turns: int) -> list[Replayed]:
    """Sessions of ``turns`` requests: trajectories one after the other under the first
    one's system prompt (one agent serving customer after customer), each trajectory's
    facts needed where it needs them."""
    out: list[Replayed] = []
    messages: Messages = []
    facts: list[Fact] = []
    for trajectory in trajectories:
        offset = len(messages) - 1 if messages else 0
        traj = trajectory["traj"]
        messages.extend(traj if not messages else traj[1:])
        actions = trajectory["info"]["task"]["actions"]
        facts += [Fact(f.value, f.needed_at + offset) for f in facts_of(traj, actions)]
        if len(requests_of(messages)) >= turns:
            session = Replayed.of(messages, facts)
            due = {index: due for index, due in session.due.items() if index < turns}
            out.append(replace(session, requests=session.requests[:turns], due=due))
            messages, facts = [], []
    return out


METHODS = ("none", "drop-oldest", "middle-out", "headroom", "contextgate")


async def replay(
    sessions: list[Replayed],
    budget: int,
    pause_every: int | None = None,
    *,
    headroom: bool = True,
) -> tuple[dict[str, Tally], list[float]]:
    """Every session through every method; with ``pause_every``, every so many
    requests the user is away for 15 minutes, longer than any cache TTL in the catalog
    below an hour (the cache of every method lapses then)."""
    counter = TokenCounter()

    def count(messages: Messages) -> int:
        return REPLY_PRIMING + sum(counter.count_message(m) for m in messages)

    def paused(index: int) -> bool:
        return pause_every is not None and index % pause_every == pause_every - 1

    names = [name for name in METHODS if headroom or name != "headroom"]
    tallies = {name: Tally(counter, budget) for name in names}
    peer: list[list[Compressed]] = []
    if headroom:
        jobs = [(s.messages, [len(r) for r in s.requests]) for s in sessions]
        peer = compress_sessions(jobs, model="gpt-4o", budget=budget)
    store = MemoryStore()
    pipeline = Pipeline(store=store)
    policy = Policy(max_input=budget)
    times: list[float] = []
    ours = tallies["contextgate"]

    async def fetch(ref: str) -> bytes | None:
        return await store.get("", ref)

    for number, replayed in enumerate(sessions):
        session = Session(pipeline, policy)
        for index, history in enumerate(replayed.requests):
            first, expired = index == 0, paused(index)
            due = replayed.due.get(index, [])
            sent: dict[str, tuple[Messages, list[str]]] = {
                "none": (history, []),
                "drop-oldest": (drop_oldest(history, budget, count), []),
                "middle-out": (middle_out(history, budget, count), []),
            }
            if headroom:
                compressed = peer[number][index]
                sent["headroom"] = (compressed.messages, compressed.restorable)
            started = time.perf_counter()
            try:
                result = await session.send(history, after=900.0 if expired else TURN_GAP_S)
                outgoing = result.request["messages"]
            except RequestRejected:
                outgoing = history  # refused by the gateway; counted as sent raw (and over)
            times.append((time.perf_counter() - started) * 1000)
            text = orjson.dumps(outgoing).decode()
            sent["contextgate"] = (outgoing, await restored(text, fetch, REF))
            for ref in set(REF.findall(text)):
                ours.refs += 1
                ours.restorable += await store.get("", ref) is not None
            for name, (messages, restorable) in sent.items():
                tallies[name].add(messages, first, expired)
                tallies[name].quality.add(history, messages, due, restorable)
    for tally in tallies.values():
        tally.quality.finish()
    return tallies, times


def table(title: str, tallies: dict[str, Tally], times: list[float]) -> list[str]:
    lines = [
        f"{title}, {tallies['none'].requests:,} requests in {tallies['none'].sessions} sessions:",
        "",
        "| method | tokens sent | per request | per session | over budget |"
        " broken tool pairs | prefix-stable share | cost (cache pricing) |"
        " facts retained | sessions with all facts | reversibility |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = tallies["none"].cost
    for name, tally in tallies.items():
        quality = tally.quality
        reversible = quality.reversibility
        lines.append(
            f"| {name} | {tally.tokens:,} | {tally.tokens / tally.requests:,.0f} |"
            f" {tally.tokens / tally.sessions:,.0f} | {tally.over:,} | {tally.broken:,} |"
            f" {tally.prefix / tally.tokens:.1%} | {tally.cost / base:.2f}x |"
            f" {quality.retained:,} of {quality.tracked:,} ({quality.retention:.1%}) |"
            f" {quality.whole_sessions} of {quality.sessions} |"
            + (
                " nothing removed |"
                if reversible is None
                else f" {reversible:.1%} of {quality.removed_bytes / 1e3:,.0f} KB |"
            )
        )
    ours = tallies["contextgate"]
    lines += [
        "",
        f"contextgate: {ours.restorable:,} of {ours.refs:,} refs in sent requests restore;"
        f" pipeline time per request p50 {statistics.median(times):.2f} ms,"
        f" p99 {quantile(times, 0.99):.2f} ms. Cost floor: a method that sent"
        f" {FLOOR_SHARE:.2f} x max-input of the history's tokens as they are per request"
        " (the default `target`; the whole history while shorter) and never rewrote its"
        f" prefix would cost {tallies['none'].floor / base:.2f}x.",
        "",
    ]
    return lines


async def warm_timing(trajectories: list[Any], tokens: int = 100_000, runs: int = 120) -> str:
    """Pipeline time for a warm ~``tokens``-token conversation: whole trajectories joined
    into one long session (tool pairs intact), then the same history resent with one more
    message each time, as a client does, after the first request has been counted."""
    counter = TokenCounter()
    history: Messages = [trajectories[0]["traj"][0]]
    total = 0
    for trajectory in trajectories:
        for message in trajectory["traj"][1:]:
            history.append(message)
            total += counter.count_message(message)
        if total >= tokens:
            break
    pipeline = Pipeline(store=MemoryStore())
    session = Session(pipeline, Policy())
    start = len(history) - runs
    await session.send(history[:start])
    await pipeline.settled()
    gc.collect()
    gc.freeze()  # as the gateway does once warm (gateway.runtime.Gateway.warm)
    times, cpu, last = [], [], None
    for end in range(start + 1, len(history) + 1):
        began, began_cpu = time.perf_counter(), time.thread_time()
        last = await session.send(history[:end])
        times.append((time.perf_counter() - began) * 1000)
        cpu.append((time.thread_time() - began_cpu) * 1000)
    assert last is not None
    report = last.report
    return (
        f"Warm {report.tokens_before:,}-token conversation (gpt-4o, default policy,"
        f" utilisation {report.tokens_before / report.budget:.0%}, actions:"
        f" {', '.join(report.actions) or 'none'}), {len(times)} requests each one message"
        f" longer: pipeline time p50 {statistics.median(times):.2f} ms,"
        f" p99 {quantile(times, 0.99):.2f} ms; CPU time of the thread p50"
        f" {statistics.median(cpu):.2f} ms (target: <= 5 ms p50)."
    )


def headroom_line(enabled: bool) -> tuple[bool, str]:
    """Whether Headroom can be run here, and the sentence that says how it was run."""
    if not enabled:
        return False, "Headroom not run (`--no-headroom`)."
    try:
        version = headroom_version()
    except (OSError, subprocess.CalledProcessError) as exc:
        return False, f"Headroom not run: its virtualenv could not be installed ({exc})."
    return True, (
        f"Headroom {version}: `headroom.compress` per request in its own virtualenv, with"
        " its proxy's per-conversation compression cache and prefix freezing"
        " (`bench/headroom_compress.py`); its ML text compressor off (its weights cannot"
        " be fetched here)."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trajectories", type=int, default=200)
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "BENCHMARKS.md")
    parser.add_argument("--plots", type=Path, default=ROOT / "docs" / "img")
    parser.add_argument("--no-headroom", action="store_true", help="leave Headroom out")
    args = parser.parse_args()
    trajectories = json.loads(DATA.read_text())[: args.trajectories]
    headroom, how = headroom_line(not args.no_headroom)
    date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        START,
        f"Measured {date} on {machine()}; `make bench` (`python -m bench.compaction"
        f" --trajectories {len(trajectories)}`). Costs are relative to sending the raw"
        f" history (`none`). {how}",
        "",
    ]
    single = single_sessions(trajectories)
    runs: dict[str, dict[str, Tally]] = {}
    for budget in (4_000, 8_000):
        tallies, times = asyncio.run(replay(single, budget, headroom=headroom))
        lines += table(f"max-input {budget:,} tokens", tallies, times)
        runs[f"single trajectories, max-input {budget:,}"] = tallies
    tallies, times = asyncio.run(replay(single, 8_000, pause_every=5, headroom=headroom))
    lines += table(
        "max-input 8,000 tokens, the user away 15 minutes before every 5th request (every"
        " cache lapses; contextgate's cache-TTL prune acts)",
        tallies,
        times,
    )
    for turns, budget in LONG_RUNS:
        long = chained_sessions(trajectories, turns)
        tallies, times = asyncio.run(replay(long, budget, headroom=headroom))
        title = f"long sessions ({turns} requests, trajectories chained), max-input"
        lines += table(f"{title} {budget:,} tokens", tallies, times)
        runs[f"{turns}-request sessions, max-input {budget:,}"] = tallies
    lines += [asyncio.run(warm_timing(trajectories)), ""]
    from bench.quality_plots import plot_runs  # matplotlib only where plots are drawn

    lines += plot_runs(runs, args.plots, args.output.parent)
    lines.append(END)
    block = "\n".join(lines)
    print(block)
    heading = "## Context quality on real traces (`make bench`)"
    write_block(args.output, START, END, block, heading)


if __name__ == "__main__":
    main()
