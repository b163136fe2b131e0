"""Summaries on real agent traces: how many summary calls, what they cost, and what the
request that crosses the cut waits for.

    python -m bench.summaries [--output docs/BENCHMARKS.md]

The tau-bench airline trajectories are chained into sessions of 100 turns (one agent
serving customer after customer under its system prompt) and replayed turn by turn under
```max-input`` 8,000 with the pipeline's summarize stage, background preparation included:
the background work is run between turns, as a user's think time allows. The same sessions
are replayed deterministically (``mode=truncate``) for comparison.

No model is reachable here, so the summary model is a deterministic stand-in: it keeps
40% of the input's key entities (ids, numbers; the validator asks for 30%), the first and
latest user requests (200 characters each) and the tools called. Its tokens are counted
as a real call's would be: the prompt the gateway sends, and the JSON it gets back.

The latency part times ``Pipeline.compact`` on the request where compress first cuts,
with the stand-in answering at once: (a) a prepared checkpoint ready, (b) none ready, so
made on the spot (a real model adds its generation time, seconds, to this), (c) the
summary failing, so the deterministic notes are sent.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from bench.compaction import DATA, ROOT, TURN_GAP_S, Messages, Session, Tally, requests_of
from bench.report import publish, quantile
from gateway.store import MemoryStore
from pipelines import Pipeline, Policy
from pipelines.checkpoints import Checkpoint, SummaryJob
from pipelines.local_summaries import run_job
from pipelines.messages import Message, message_text
from pipelines.summary import (
    FIELDS,
    LIST_FIELDS,
    Summary,
    SummaryFailed,
    key_entities,
    summary_request_messages,
)

START, END = "<!-- summaries:start -->", "<!-- summaries:end -->"
BUDGET = 8_000
TURNS = 100


class StandIn:
    """The summary model's stand-in (see the module's docstring), counting its tokens."""

    def __init__(self, pipeline: Pipeline, *, fail: bool = False) -> None:
        self.counter = pipeline.counter("o200k_base")
        self.fail = fail
        self.calls = 0
        self.tokens_in = 0
        self.tokens_out = 0

    async def summarize(
        self, messages: Sequence[Message], *, model: str, previous: Any = None
    ) -> Summary:
        if self.fail:
            raise SummaryFailed("the summary model is down")
        self.calls += 1
        prompt = summary_request_messages(messages, previous)
        self.tokens_in += sum(self.counter.count_message(m) for m in prompt)
        entities = sorted(key_entities(message_text(m) for m in messages))
        users = [message_text(m)[:200] for m in messages if m.get("role") == "user"]
        tools = sorted(
            {
                str(call.get("function", {}).get("name"))
                for m in messages
                for call in m.get("tool_calls") or ()
                if isinstance(call, dict)
            }
        )
        fields: dict[str, Any] = {n: ([] if n in LIST_FIELDS else "") for n in FIELDS}
        fields.update(
            user_goal=(previous or {}).get("user_goal") or (users[0] if users else ""),
            active_task=users[-1] if users else "",
            completed_actions=[f"called {name}" for name in tools],
            key_findings=entities[: max(1, int(len(entities) * 0.4))],
        )
        self.tokens_out += self.counter.count_text(orjson.dumps(fields).decode())
        return Summary(fields, 0.4, 1)


class Background:
    """The summaries service as the gateway runs it, with the background work done
    between turns."""

    background = True

    def __init__(self, summarizer: StandIn, store: MemoryStore) -> None:
        self.summarizer, self.store = summarizer, store
        self.prepared: Checkpoint | None = None
        self.jobs: list[SummaryJob] = []
        self.now_calls = 0

    async def ready(self) -> Checkpoint | None:
        return self.prepared

    async def now(self, job: SummaryJob, *, within: float) -> Checkpoint:
        self.now_calls += 1
        self.prepared = await run_job(job, self.summarizer, self.store)
        return self.prepared

    def later(self, job: SummaryJob) -> bool:
        self.jobs.append(job)
        return True

    async def drain(self) -> None:
        jobs, self.jobs = self.jobs, []
        for job in jobs[-1:]:  # single-flight: the latest job of the conversation
            self.prepared = await run_job(job, self.summarizer, self.store)


def sessions() -> list[list[Messages]]:
    """Sessions of ``TURNS`` turns: trajectories one after the other."""
    out: list[list[Messages]] = []
    messages: Messages = []
    for trajectory in orjson.loads(DATA.read_bytes()):
        traj = trajectory["traj"]
        messages.extend(traj if not messages else traj[1:])
        turns = requests_of(messages)
        if len(turns) >= TURNS:
            out.append(turns[:TURNS])
            messages = []
    return out


async def replay(session: list[Messages], mode: str) -> dict[str, Any]:
    pipeline = Pipeline(store=MemoryStore())
    store = pipeline.store
    assert isinstance(store, MemoryStore)
    summarizer = StandIn(pipeline)
    background = Background(summarizer, store)
    policy = Policy(max_input=BUDGET, mode=mode)  # type: ignore[arg-type]
    conversation = Session(pipeline, policy, summaries=background if mode == "summarize" else None)
    paths: list[str] = []
    tally = Tally(pipeline.counter("o200k_base"), BUDGET)
    kept_cuts = 0
    for index, history in enumerate(session):
        result = await conversation.send(history)
        tally.add(result.request["messages"], new_trajectory=index == 0)
        compress = result.report.stage("compress")
        kept_cuts += bool(compress is not None and compress.details.get("anti_thrash"))
        stage = result.report.stage("summarize")
        paths.append(str(stage.details.get("path", "")) if stage is not None else "")
        await background.drain()
    return {
        "sent": tally.tokens,
        "cost": tally.cost,
        "prefix": tally.prefix,
        "over": tally.over,
        "broken": tally.broken,
        "kept_cuts": kept_cuts,
        "calls": summarizer.calls,
        "summary_in": summarizer.tokens_in,
        "summary_out": summarizer.tokens_out,
        "waited": background.now_calls,
        "summarised_requests": sum(
            1
            for p in paths
            if p in ("prepared checkpoint used", "checkpoint reused", "checkpoint extended")
        ),
        "fallbacks": sum(1 for p in paths if p.startswith("fallback")),
    }


async def cut_latency(session: list[Messages], repeats: int = 15) -> dict[str, list[float]]:
    """Milliseconds of ``Pipeline.compact`` on the session's first cut, three ways."""
    pipeline = Pipeline(store=MemoryStore())
    store = pipeline.store
    assert isinstance(store, MemoryStore)
    background = Background(StandIn(pipeline), store)
    policy = Policy(max_input=BUDGET)
    conversation = Session(pipeline, policy, summaries=background)
    for history in session:
        state, now = conversation.state, conversation.now + TURN_GAP_S
        result = await conversation.send(history)
        stage = result.report.stage("summarize")
        if stage is not None and "path" in stage.details:
            break
        await background.drain()
    else:
        return {}
    times: dict[str, list[float]] = {"ready": [], "made now": [], "fallback": []}
    for _ in range(repeats):
        for kind in times:
            service = Background(StandIn(pipeline, fail=kind == "fallback"), store)
            service.prepared = background.prepared if kind == "ready" else None
            started = time.perf_counter()
            await pipeline.compact(
                {"model": "gpt-4o", "messages": history},
                policy=policy,
                state=state,
                now=now,
                summaries=service,
            )
            times[kind].append((time.perf_counter() - started) * 1000)
    return times


async def run() -> list[str]:
    chosen = sessions()
    summarized = [await replay(s, "summarize") for s in chosen]
    truncated = [await replay(s, "truncate") for s in chosen]
    latencies: dict[str, list[float]] = {"ready": [], "made now": [], "fallback": []}
    for session in chosen:
        for kind, values in (await cut_latency(session)).items():
            latencies[kind].append(statistics.median(values))

    def total(rows: list[dict[str, Any]], key: str) -> int:
        return sum(int(r[key]) for r in rows)

    turns = TURNS * len(chosen)
    sent_s, sent_t = total(summarized, "sent"), total(truncated, "sent")
    summary_in, summary_out = total(summarized, "summary_in"), total(summarized, "summary_out")
    calls = total(summarized, "calls")
    cost_s = sum(float(r["cost"]) for r in summarized)
    cost_t = sum(float(r["cost"]) for r in truncated)
    lines = [
        f"{len(chosen)} sessions of {TURNS} turns ({turns:,} requests), max-input {BUDGET:,}:",
        "",
        "| | deterministic (`mode=truncate`) | with summaries |",
        "|---|---|---|",
        f"| summary calls per 100 turns | - | {calls / len(chosen):.1f}"
        f" (median session {statistics.median(r['calls'] for r in summarized):.0f}) |",
        f"| requests that waited for a summary | - | {total(summarized, 'waited')} |",
        f"| requests carrying a summary | - | {total(summarized, 'summarised_requests'):,}"
        f" (fallback to notes: {total(summarized, 'fallbacks')}) |",
        f"| tokens sent per session | {sent_t / len(chosen):,.0f}"
        f" | {sent_s / len(chosen):,.0f} ({sent_s / sent_t:.3f}x) |",
        f"| summary input tokens per session | - | {summary_in / len(chosen):,.0f} |",
        f"| prefix-stable share (what a prompt cache can reuse) |"
        f" {total(truncated, 'prefix') / sent_t:.1%}"
        f" | {total(summarized, 'prefix') / sent_s:.1%} |",
        f"| cost under cache pricing, summary input at 1x (relative to deterministic) |"
        f" 1.000x | {(cost_s + summary_in) / cost_t:.3f}x |",
        f"| summary output tokens per session | - | {summary_out / len(chosen):,.0f} |",
        f"| requests over budget / with a broken tool pair | {total(truncated, 'over')}"
        f" / {total(truncated, 'broken')} | {total(summarized, 'over')}"
        f" / {total(summarized, 'broken')} |",
        f"| previous cut kept by anti-thrashing (requests) | {total(truncated, 'kept_cuts')}"
        f" | {total(summarized, 'kept_cuts')} |",
        "",
        "Pipeline time on the request where compress first cuts, median over sessions of"
        " each session's median of 15 runs (ms; the summary model answering at once):",
        "",
        "| checkpoint | p50 | max |",
        "|---|---|---|",
    ]
    for kind, values in latencies.items():
        if values:
            lines.append(
                f"| {kind} | {statistics.median(values):.2f} | {quantile(values, 1.0):.2f} |"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "BENCHMARKS.md")
    args = parser.parse_args()
    publish(
        args.output,
        (START, END),
        "## Summaries (`make bench`)",
        "`make bench` (`python -m bench.summaries`). The summary model is a deterministic"
        " stand-in (no model is reachable here): call counts and the tokens sent are the"
        " pipeline's own; summary token figures depend on how long a real model's summaries"
        " are.",
        asyncio.run(run()),
    )


if __name__ == "__main__":
    main()
