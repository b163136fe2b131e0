"""Replaying tau-bench trajectories through the pipeline to Anthropic's prompt cache, as
``bench.prompt_cache`` models it: what the cache_markers stage is worth."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.compaction import requests_of
from bench.prompt_cache import PrefixCache, cost
from gateway.codecs.chat_anthropic import to_messages, usage_of
from gateway.store import MemoryStore
from pipelines import ConversationState, Pipeline, Policy, Report, TokenCounter
from pipelines.stages import DEFAULT_STAGES, PassThrough

TRACES = Path(__file__).resolve().parents[3] / "bench" / "data" / "tau-bench-gpt-4o-airline.json"
MODEL = "claude-sonnet-4-5"
MARK = {"type": "ephemeral"}
HOUR = {"type": "ephemeral", "ttl": "1h"}
COUNTER = TokenCounter("o200k_base")


def trajectories(count: int) -> list[list[dict[str, Any]]]:
    return [t["traj"] for t in json.loads(TRACES.read_text())[:count]]


def to_anthropic(request: dict[str, Any]) -> dict[str, Any]:
    """The Messages API request the gateway sends for ``request`` (the codec puts each
    message-level ``cache_control`` on the last block the message becomes)."""
    return to_messages(request)


def client_marked(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``history`` as a client that sets markers of its own sends it: a 1-hour one on the
    system prompt's text, 5-minute ones on its second and fourth messages."""
    out = list(history)
    text = {"type": "text", "text": out[0]["content"], "cache_control": HOUR}
    out[0] = {**out[0], "content": [text]}
    for index in (2, 4):
        if index < len(out):
            out[index] = {**out[index], "cache_control": MARK}
    return out


def system_marked(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``history`` with one marker, on the system prompt's text."""
    out = list(history)
    text = {"type": "text", "text": out[0]["content"], "cache_control": MARK}
    out[0] = {**out[0], "content": [text]}
    return out


@dataclass
class Bill:
    """What a replay cost under the cache model."""

    sessions: int = 0
    requests: int = 0
    input: int = 0
    written: int = 0
    read: int = 0
    dollars: float = 0.0
    reports: list[list[Report]] = field(default_factory=list)
    markers: int = 0
    """The most cache_control markers one converted request carried."""
    prompts: list[list[list[bytes]]] = field(default_factory=list)
    """Per session, per request, the prefix digest of each block of the converted request
    (``PrefixCache.positions``): what the provider's cache compares."""

    @property
    def read_share(self) -> float:
        return self.read / (self.input + self.written + self.read)

    @property
    def per_session(self) -> float:
        return self.dollars / self.sessions

    def add(self, usage: dict[str, int]) -> None:
        self.requests += 1
        self.input += usage["input_tokens"]
        self.written += usage["cache_creation_input_tokens"]
        self.read += usage["cache_read_input_tokens"]
        self.dollars += cost(usage)


async def replay(
    traces: list[list[dict[str, Any]]], policy: Policy, *, markers: str, gap: float = 5.0
) -> Bill:
    """Every trajectory sent request by request (``gap`` seconds apart, one minute between
    conversations) through the pipeline, converted for the Messages API and billed by one
    shared cache; the provider's usage goes back into the conversation's record as the
    gateway does. ``markers``: ``stage`` (the default pipeline), ``none`` (no stage, no
    client markers), ``system`` (no stage, the client marks its system prompt), ``client``
    (the stage, and a client that sets three markers of its own: ``client_marked``)."""
    stages = DEFAULT_STAGES
    if markers in ("none", "system"):
        stages = tuple(PassThrough(s.name) if s.name == "cache_markers" else s for s in stages)
    pipeline = Pipeline(stages=stages, store=MemoryStore())
    cache = PrefixCache(COUNTER)
    bill = Bill()
    now = 1_000_000.0
    for trace in traces:
        bill.sessions += 1
        state: ConversationState | None = None
        reports: list[Report] = []
        prompts: list[list[bytes]] = []
        now += 60.0
        for history in requests_of(trace):
            if markers == "system":
                history = system_marked(history)
            elif markers == "client":
                history = client_marked(history)
            now += gap
            result = await pipeline.compact(
                {"model": MODEL, "messages": history}, policy=policy, state=state, now=now
            )
            request = to_anthropic(result.request)
            bill.markers = max(bill.markers, json.dumps(request).count('"cache_control"'))
            usage = cache.usage(request, now)
            bill.add(usage)
            reports.append(result.report)
            prompts.append([position.prefix for position in cache.positions(request)])
            state = result.state.answered(at=now, usage=usage_of(usage))
        bill.reports.append(reports)
        bill.prompts.append(prompts)
    return bill
