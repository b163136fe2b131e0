"""Context quality on real agent traces: contextgate's pipeline against baselines and
Headroom.

    python -m bench.compaction [--trajectories 200] [--output docs/BENCHMARKS.md]
                               [--plots docs/img] [--no-headroom]
                               [--no-responses | --responses-only]

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

Then each run again in the OpenAI Responses format (``replay_responses``): the same
sessions as a stateless Responses client sends them (``bench.responses_sessions``:
``instructions``, message items, a synthetic reasoning item before each of the model's
turns, ``function_call`` and ``function_call_output``), through the gateway's Responses
codec and the same pipeline, policy and clock; and once more without the reasoning items,
which tells their weight from the format's. Side by side with the chat format (the raw
history and contextgate), each format's cost relative to its own raw history
(``formats_table``, its own block in the output). ``--responses-only`` writes that block
alone (the chat replay still runs, without Headroom); ``--no-responses`` leaves it out.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from bench.quality import Fact, Quality, due_at, facts_of, restored
from bench.quality_headroom import Compressed, compress_sessions, headroom_version
from bench.report import machine, quantile, write_block
from bench.responses_sessions import (
    REF,
    Style,
    chat_form,
    convert,
    reasoning_problems,
    send,
    unpaired,
)
from gateway.codecs.responses import stored_items
from gateway.store import MemoryStore
from pipelines import (
    CompactResult,
    ConversationState,
    Pipeline,
    Policy,
    Report,
    RequestRejected,
)
from pipelines.ports import Rendering, Summaries
from pipelines.tokens import REPLY_PRIMING, TokenCounter

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "bench" / "data" / "tau-bench-gpt-4o-airline.json"
START, END = "<!-- compaction:start -->", "<!-- compaction:end -->"
FORMATS_START, FORMATS_END = "<!-- compaction-formats:start -->", "<!-- compaction-formats:end -->"
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
    record carried from request to request, on a simulated clock; ``render``: how a run of
    removed messages is stored (a client API's own form, as its route gives it)."""

    def __init__(
        self,
        pipeline: Pipeline,
        policy: Policy,
        model: str = "gpt-4o",
        summaries: Summaries | None = None,
        render: Rendering | None = None,
    ) -> None:
        self.pipeline, self.policy, self.model = pipeline, policy, model
        self.summaries, self.render = summaries, render
        self.state: ConversationState | None = None
        self.now = 1_000_000.0

    async def send(self, history: Messages, *, after: float = TURN_GAP_S) -> CompactResult:
        """Compact ``history``, sent ``after`` seconds after the previous request."""
        return await self.send_request({"model": self.model, "messages": history}, after=after)

    async def send_request(
        self, request: dict[str, Any], *, after: float = TURN_GAP_S
    ) -> CompactResult:
        """Compact ``request`` (a chat request: a client API's, as its codec hands it to
        the pipeline), sent ``after`` seconds after the previous request."""
        self.now += after
        result = await self.pipeline.compact(
            request,
            policy=self.policy,
            state=self.state,
            now=self.now,
            summaries=self.summaries,
            render=self.render,
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
        self.events = 0
        """Compaction events (``Report.is_event_after``) between a session's requests."""
        self.cost = 0.0
        self.floor = 0.0
        """On the raw history: what a method would cost that sent ``FLOOR_SHARE`` x the
        budget of its tokens as they are per request (the whole history while it is
        shorter) and never rewrote what it sent before (``cost_floor``)."""
        self.previous: Messages = []
        self.session_costs: list[float] = []
        self.turn_tokens: list[list[int]] = []
        self.quality = Quality()

    def add(
        self,
        sent: Messages,
        new_trajectory: bool,
        expired: bool = False,
        *,
        paired: bool | None = None,
    ) -> None:
        """Count one request; ``expired``: the provider's cache lapsed before it;
        ``paired``: whether its tool pairs hold, when ``sent`` is another format's request
        in chat form (``pairs_valid`` of ``sent`` by default)."""
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
        self.broken += not (pairs_valid(sent) if paired is None else paired)
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
        previous: Report | None = None
        for index, history in enumerate(replayed.requests):
            first, expired = index == 0, _paused(index, pause_every)
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
                ours.events += previous is not None and result.report.is_event_after(previous)
                previous = result.report
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


@dataclass(slots=True)
class ResponsesReplay:
    """The Responses-format replay of a run: the raw history's (``none``) and
    contextgate's tallies, the gateway's time per request (codec and pipeline; the codec
    alone), and what the reasoning rule and the token difference to the chat format come
    to."""

    tallies: dict[str, Tally]
    times: list[float] = field(default_factory=list)
    codec_times: list[float] = field(default_factory=list)
    reasoning_items: int = 0
    """Reasoning items in the requests the client sent (summed over requests)."""
    reasoning_sent: int = 0
    """... of them in what contextgate sent."""
    reasoning_broken: int = 0
    """Requests sent with a reasoning item edited, duplicated, invented, or apart from
    its follower (``bench.responses_sessions.reasoning_problems``)."""
    reasoning_tokens: int = 0
    """The reasoning items' tokens in the raw Responses histories (summed over requests)."""
    reasoning_tokens_sent: int = 0
    """... in what contextgate sent."""
    tool_name_tokens: int = 0
    """The chat tool messages' ``name`` tokens in the raw chat histories, which a
    ``function_call_output`` does not carry."""
    call_id_tokens: int = 0
    """The tokens the suffixes of reused call ids add to the outputs' ``call_id``."""
    rejected: int = 0


async def replay_responses(
    sessions: list[Replayed],
    budget: int,
    pause_every: int | None = None,
    *,
    style: Style = "instructions",
    reasoning: bool = True,
) -> ResponsesReplay:
    """Every session as a stateless Responses client sends it
    (``bench.responses_sessions.convert``; without ``reasoning``, no reasoning items),
    through the gateway's Responses codec and the pipeline as ``POST /v1/responses`` does,
    under the chat replay's policy, clock and pauses (``replay``). What went up is measured
    in chat form (``chat_form``), so that tokens, cost, retention and reversibility count
    as the chat format's do; tool pairs are checked on the Responses items."""
    counter = TokenCounter()
    store = MemoryStore()
    pipeline = Pipeline(store=store)
    policy = Policy(max_input=budget)
    raw, ours = Tally(counter, budget), Tally(counter, budget)
    out = ResponsesReplay({"none": raw, "contextgate": ours})

    async def fetch(ref: str) -> bytes | None:
        return await store.get("", ref)

    def reasoning_tokens(messages: Messages) -> int:
        """What the reasoning items add to the count of ``messages`` (in chat form)."""
        return sum(
            counter.count_message(message) - counter.count_message(_without_reasoning(message))
            for message in messages
            if message["role"] == "assistant" and isinstance(message.get("content"), list)
        )

    def ids_tokens(messages: Messages) -> int:
        return sum(counter.count_text(m["tool_call_id"]) for m in messages if m["role"] == "tool")

    for replayed in sessions:
        conversion = convert(replayed.messages, style, reasoning=reasoning)
        session = Session(pipeline, policy, render=stored_items)
        previous: Report | None = None
        for index, history in enumerate(replayed.requests):
            first, expired = index == 0, _paused(index, pause_every)
            due = replayed.due.get(index, [])
            client = conversion.body(len(history))
            data = orjson.dumps(client)
            started = time.perf_counter()
            try:
                sent = await send(session, data, after=900.0 if expired else TURN_GAP_S)
            except RequestRejected:
                body, wire = client, data  # refused by the gateway; counted as sent raw
                out.rejected += 1
            else:
                out.times.append((time.perf_counter() - started) * 1000)
                out.codec_times.append(sent.codec_ms)
                body, wire = sent.body, sent.wire
                ours.events += previous is not None and sent.result.report.is_event_after(previous)
                previous = sent.result.report
            received, outgoing = chat_form(client), chat_form(body)
            text = wire.decode()
            restorable = await restored(text, fetch, REF)
            for ref in set(REF.findall(text)):
                ours.refs += 1
                ours.restorable += await store.get("", ref) is not None
            raw.add(received, first, expired, paired=not unpaired(client["input"]))
            raw.quality.add(received, received, due, [])
            ours.add(outgoing, first, expired, paired=not unpaired(body["input"]))
            ours.quality.add(received, outgoing, due, restorable)
            out.reasoning_broken += bool(reasoning_problems(client["input"], body["input"]))
            out.reasoning_items += sum(i.get("type") == "reasoning" for i in client["input"])
            out.reasoning_sent += sum(i.get("type") == "reasoning" for i in body["input"])
            out.reasoning_tokens += reasoning_tokens(received)
            out.reasoning_tokens_sent += reasoning_tokens(outgoing)
            out.tool_name_tokens += sum(
                counter.count_text(m["name"])
                for m in history
                if m["role"] == "tool" and isinstance(m.get("name"), str)
            )
            out.call_id_tokens += ids_tokens(received) - ids_tokens(history)
    for tally in out.tallies.values():
        tally.quality.finish()
    return out


def _without_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    parts = [p for p in message["content"] if p.get("type") != "reasoning"]
    return {**message, "content": parts or None}


def _paused(index: int, pause_every: int | None) -> bool:
    return pause_every is not None and index % pause_every == pause_every - 1


@dataclass(frozen=True, slots=True)
class Formats:
    """One run's sessions through contextgate in each format: the chat replay's tallies
    and pipeline times, the Responses replay, and the Responses replay without reasoning
    items (which tells the reasoning items' weight from the codec's)."""

    label: str
    chat: dict[str, Tally]
    chat_times: list[float]
    responses: ResponsesReplay
    bare: ResponsesReplay


def formats_table(runs: list[Formats]) -> list[str]:
    """contextgate on the same sessions in the chat and the Responses format, a row per
    run and format, each format's cost relative to its own raw history; then, per run,
    where the Responses histories' tokens differ from the chat histories'."""
    lines = [
        "| run | format | raw history tokens | tokens sent | per request | over budget |"
        " broken tool pairs | compaction events | prefix-stable share | cost (cache pricing) |"
        " facts retained | sessions with all facts | reversibility | refs that restore |"
        " time per request p50 |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        rows = (
            ("chat", run.chat, f"{statistics.median(run.chat_times):.2f} ms"),
            ("responses", run.responses.tallies, _codec_time(run.responses)),
            ("responses, no reasoning items", run.bare.tallies, _codec_time(run.bare)),
        )
        for name, tallies, took in rows:
            tally, base = tallies["contextgate"], tallies["none"]
            quality = tally.quality
            reversible = quality.reversibility
            lines.append(
                f"| {run.label} | {name} | {base.tokens:,} | {tally.tokens:,} |"
                f" {tally.tokens / tally.requests:,.0f} | {tally.over:,} | {tally.broken:,} |"
                f" {tally.events:,} | {tally.prefix / tally.tokens:.1%} |"
                f" {tally.cost / base.cost:.2f}x |"
                f" {quality.retained:,} of {quality.tracked:,} ({quality.retention:.1%}) |"
                f" {quality.whole_sessions} of {quality.sessions} |"
                + (
                    " nothing removed |"
                    if reversible is None
                    else f" {reversible:.1%} of {quality.removed_bytes / 1e3:,.0f} KB |"
                )
                + f" {tally.restorable:,} of {tally.refs:,} | {took} |"
            )
    lines.append("")
    for run in runs:
        responses, bare = run.responses, run.bare
        raw_chat = run.chat["none"].tokens
        raw_responses = responses.tallies["none"].tokens
        explained = (
            responses.reasoning_tokens - responses.tool_name_tokens + responses.call_id_tokens
        )
        refused = responses.rejected + bare.rejected
        lines.append(
            f"- {run.label}: raw histories {raw_responses:,} (responses) - {raw_chat:,} (chat)"
            f" = {raw_responses - raw_chat:+,} tokens: {responses.reasoning_items:,}"
            f" reasoning items ({responses.reasoning_tokens:,}), no tool `name`"
            f" (-{responses.tool_name_tokens:,}), reused call ids made unique"
            f" ({responses.call_id_tokens:+,}): {explained:+,}. contextgate sent"
            f" {responses.reasoning_sent:,} of the reasoning items"
            f" ({responses.reasoning_tokens_sent:,} tokens,"
            f" {responses.reasoning_tokens_sent / responses.tallies['contextgate'].tokens:.0%}"
            " of what it sent); requests with a reasoning item edited or apart from its"
            f" follower: {responses.reasoning_broken:,}."
            + (f" Requests refused: {refused:,}." if refused else "")
        )
    lines.append("")
    return lines


def _codec_time(replay: ResponsesReplay) -> str:
    """The median time per request through codec and pipeline, and the codec's share."""
    if not replay.times:
        return "-"
    return (
        f"{statistics.median(replay.times):.2f} ms (codec"
        f" {statistics.median(replay.codec_times):.2f})"
    )


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


def runs_of(trajectories: list[Any]) -> list[Run]:
    """The runs of a replay, in order: single trajectories at 4,000 and 8,000 tokens, at
    8,000 with pauses, then the long sessions (``LONG_RUNS``)."""
    single = single_sessions(trajectories)
    runs = [
        Run(f"max-input {budget:,} tokens", f"single, {budget:,}", single, budget)
        for budget in (4_000, 8_000)
    ]
    runs.append(
        Run(
            "max-input 8,000 tokens, the user away 15 minutes before every 5th request (every"
            " cache lapses; contextgate's cache-TTL prune acts)",
            "single, 8,000, pauses",
            single,
            8_000,
            pause_every=5,
        )
    )
    for turns, budget in LONG_RUNS:
        title = f"long sessions ({turns} requests, trajectories chained), max-input"
        runs.append(
            Run(
                f"{title} {budget:,} tokens",
                f"{turns}-request, {budget:,}",
                chained_sessions(trajectories, turns),
                budget,
                plot=f"{turns}-request sessions, max-input {budget:,}",
            )
        )
    runs[0] = replace(runs[0], plot="single trajectories, max-input 4,000")
    runs[1] = replace(runs[1], plot="single trajectories, max-input 8,000")
    return runs


@dataclass(frozen=True, slots=True)
class Run:
    """One replay of the benchmark: its table's title, its short label, its sessions and
    budget, its pauses, and its plot's title (``None``: not plotted)."""

    title: str
    label: str
    sessions: list[Replayed]
    budget: int
    pause_every: int | None = None
    plot: str | None = None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trajectories", type=int, default=200)
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "BENCHMARKS.md")
    parser.add_argument("--plots", type=Path, default=ROOT / "docs" / "img")
    parser.add_argument("--no-headroom", action="store_true", help="leave Headroom out")
    formats = parser.add_mutually_exclusive_group()
    formats.add_argument(
        "--no-responses", action="store_true", help="leave the Responses format out"
    )
    formats.add_argument(
        "--responses-only",
        action="store_true",
        help="only contextgate in the chat and the Responses format, side by side"
        " (the formats block alone)",
    )
    args = parser.parse_args()
    trajectories = json.loads(DATA.read_text())[: args.trajectories]
    headroom, how = (False, "") if args.responses_only else headroom_line(not args.no_headroom)
    date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    command = f"python -m bench.compaction --trajectories {len(trajectories)}"
    lines = [
        START,
        f"Measured {date} on {machine()}; `make bench` (`{command}`). Costs are relative to"
        f" sending the raw history (`none`). {how}",
        "",
    ]
    plotted: dict[str, dict[str, Tally]] = {}
    side_by_side: list[Formats] = []
    for run in runs_of(trajectories):
        tallies, times = asyncio.run(
            replay(run.sessions, run.budget, run.pause_every, headroom=headroom)
        )
        lines += table(run.title, tallies, times)
        if run.plot is not None:
            plotted[run.plot] = tallies
        if not args.no_responses:
            responses, bare = (
                asyncio.run(
                    replay_responses(run.sessions, run.budget, run.pause_every, reasoning=reasoning)
                )
                for reasoning in (True, False)
            )
            side_by_side.append(Formats(run.label, tallies, times, responses, bare))
    if not args.responses_only:
        lines += [asyncio.run(warm_timing(trajectories)), ""]
        from bench.quality_plots import plot_runs  # matplotlib only where plots are drawn

        lines += plot_runs(plotted, args.plots, args.output.parent)
        lines.append(END)
        block = "\n".join(lines)
        print(block)
        heading = "## Context quality on real traces (`make bench`)"
        write_block(args.output, START, END, block, heading)
    if side_by_side:
        how = (
            f"`{command} --responses-only` (this block alone; `make bench` writes it with"
            " the tables above)"
            if args.responses_only
            else f"`make bench` (`{command}`)"
        )
        block = "\n".join(
            [
                FORMATS_START,
                f"Measured {date} on {machine()}; {how}. contextgate"
                " on the same sessions sent as chat requests and as Responses requests"
                " (`bench.responses_sessions`); each format's cost is relative to its own raw"
                " history; time per request: the pipeline (chat), the codec and the pipeline"
                " (responses).",
                "",
                *formats_table(side_by_side),
                FORMATS_END,
            ]
        )
        print(block)
        heading = "## Context quality in the chat and the Responses format (`make bench`)"
        write_block(args.output, FORMATS_START, FORMATS_END, block, heading)


if __name__ == "__main__":
    main()
