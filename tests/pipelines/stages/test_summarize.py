"""summarize: the compacted span replaced by one recalled-context summary, reused while
the cut is the same, prepared in the background from 0.40 and used at the cut without a
call, merged as the span grows, and the notes kept whenever that fails."""

from __future__ import annotations

import json
import random
import re
import time
from functools import cache
from pathlib import Path
from typing import Any

from bench.compaction import requests_of
from gateway.store import MemoryStore
from pipelines import ModelCatalog, Pipeline, Policy
from pipelines.checkpoints import Checkpoint, SummaryJob, chain_of
from pipelines.local_summaries import run_job
from pipelines.summary import FIELDS, LIST_FIELDS, Summary, SummaryFailed, SummaryOverflow
from tests.openai_schema import assert_valid_request
from tests.pipelines.stages.conftest import BoundaryProbe, boundary_at, probed
from tests.pipelines.stages.test_normalize import assert_valid

REF = re.compile(r"ctx_[A-Za-z0-9_-]{22,}")
TRACES = Path(__file__).resolve().parents[3] / "bench" / "data" / "tau-bench-gpt-4o-airline.json"


class Scripted:
    """A summarizer that records its calls and answers from a script."""

    def __init__(self, *answers: Any) -> None:
        self.calls: list[dict[str, Any]] = []
        self.answers = list(answers)

    async def summarize(self, messages: Any, *, model: str, previous: Any = None) -> Summary:
        self.calls.append({"messages": list(messages), "model": model, "previous": previous})
        answer = self.answers.pop(0) if self.answers else "default"
        if isinstance(answer, Exception):
            raise answer
        fields = {n: ([] if n in LIST_FIELDS else "") for n in FIELDS}
        fields["user_goal"] = f"goal ({answer})"
        return Summary(fields, 1.0, 1)


def long_history() -> list[dict[str, Any]]:
    trajectory = max(json.loads(TRACES.read_text()), key=lambda t: len(t["traj"]))
    return requests_of(trajectory["traj"])[-1]


STORE = MemoryStore()
"""One store (one secret) for all: refs must agree between runs as between requests."""


async def run(
    summarizer: Any, history: list[dict[str, Any]], state: Any = None, **policy: Any
) -> Any:
    pipeline = Pipeline(store=STORE, summarizer=summarizer)
    return await pipeline.compact(
        {"model": "gpt-4o", "messages": history},
        policy=Policy(**{"max_input": 6_000, **policy}),
        state=state,
        now=1_000.0,
    )


def isolated(summarizer: Any, catalog: Any) -> Pipeline:
    """A pipeline of its own: fresh stages (no memory of other tests' requests), its own
    store."""
    from pipelines.stages import DEFAULT_STAGES, PassThrough

    stages = [s if isinstance(s, PassThrough) else type(s)() for s in DEFAULT_STAGES]
    return Pipeline(stages=stages, store=MemoryStore(), summarizer=summarizer, catalog=catalog)


def details(result: Any) -> dict[str, Any]:
    return next(s.details for s in result.report.stages if s.name == "summarize")


async def test_the_span_becomes_one_summary_listing_its_refs() -> None:
    summarizer = Scripted("first")
    result = await run(summarizer, long_history())
    out = result.request["messages"]
    summaries = [m for m in out if str(m.get("content", "")).startswith("[Recalled context")]
    assert len(summaries) == 1
    assert not any(str(m.get("content", "")).startswith("[Context note:") for m in out)
    assert "goal (first)" in summaries[0]["content"]
    checkpoint = result.state.checkpoint
    assert checkpoint is not None
    # One ref named, however many parts: the index of the stored originals.
    assert REF.findall(summaries[0]["content"]) == [checkpoint["index"]]
    index = json.loads(await STORE.get("", checkpoint["index"]) or b"{}")
    assert index["parts"] == checkpoint["refs"]
    assert summarizer.calls[0]["model"] == "gpt-4o"
    assert summarizer.calls[0]["previous"] is None
    assert any(m.get("role") == "tool" for m in summarizer.calls[0]["messages"])
    assert details(result)["path"] == "summarised"
    assert_valid(out)
    assert_valid_request(result.request)
    assert result.report.tokens_after <= result.report.budget


async def test_what_the_summary_replaced_ends_at_the_compaction_boundary() -> None:
    """With a summary applied, the compaction boundary handed on is the last message of
    what it replaced: the summary, or the notes and protected messages after it."""
    history = long_history()
    probe = BoundaryProbe()
    pipeline = Pipeline(stages=probed(probe), store=MemoryStore(), summarizer=Scripted("first"))
    result = await pipeline.compact(
        {"model": "gpt-4o", "messages": history}, policy=Policy(max_input=6_000)
    )
    assert details(result)["path"] == "summarised"
    out = result.request["messages"]
    summary = next(
        i for i, m in enumerate(out) if str(m.get("content", "")).startswith("[Recalled")
    )
    assert boundary_at(probe, history) >= summary


async def test_the_same_span_reuses_the_checkpoint_without_a_call() -> None:
    history = long_history()
    first = await run(Scripted("first"), history)
    again = Scripted("second")
    state = first.state.answered(at=999.0)
    result = await run(again, history, state=state)
    assert again.calls == []
    assert details(result)["path"] == "checkpoint reused"
    assert result.request == first.request


async def test_failures_leave_the_notes() -> None:
    for failure in (SummaryFailed("no valid answer"), TimeoutError()):
        result = await run(Scripted(failure), long_history())
        out = result.request["messages"]
        assert any(str(m.get("content", "")).startswith("[Context note:") for m in out)
        assert details(result)["path"].startswith("fallback")
        assert result.state.checkpoint is None


async def test_truncate_mode_never_calls_the_summarizer() -> None:
    summarizer = Scripted()
    await run(summarizer, long_history(), mode="truncate")
    assert summarizer.calls == []


async def test_a_summary_model_too_small_for_the_input_gives_way_to_the_main_model() -> None:
    from pipelines import ModelCatalog, ModelInfo

    catalog = ModelCatalog().extended([ModelInfo("tiny-summarizer", 4_000, 500)])
    summarizer = Scripted("big")
    pipeline = isolated(summarizer, catalog)
    result = await pipeline.compact(
        {"model": "gpt-4o", "messages": long_history()},
        policy=Policy(max_input=6_000, summary_model="tiny-summarizer"),
        now=1_000.0,
    )
    assert details(result)["guard"] == "main model"
    assert summarizer.calls[0]["model"] == "gpt-4o"


async def test_inputs_too_big_for_any_window_keep_the_newest() -> None:
    from pipelines import ModelCatalog, ModelInfo

    catalog = ModelCatalog().extended(
        [ModelInfo("small-chat", 5_000, 500), ModelInfo("tiny-summarizer", 4_000, 500)]
    )
    summarizer = Scripted("trimmed")
    history = long_history()
    pipeline = isolated(summarizer, catalog)
    result = await pipeline.compact(
        {"model": "small-chat", "messages": history},
        policy=Policy(max_input=4_000, summary_model="tiny-summarizer"),
        now=1_000.0,
    )
    guard = details(result)["guard"]
    assert guard.startswith("trimmed")
    sent = summarizer.calls[0]["messages"]
    counter = pipeline.counter("o200k_base")
    assert sum(counter.count_message(m) for m in sent) <= 0.8 * 5_000
    removed_newest = summarizer.calls[0]["messages"][-1]
    assert removed_newest in history  # the newest inputs are the ones kept


class Service:
    """A summaries service playing the gateway's: a prepared checkpoint to offer, the
    jobs scheduled for later, and the summaries asked for now (made by ``summarizer``)."""

    background = True

    def __init__(self, summarizer: Any, ready: Checkpoint | None = None) -> None:
        self.summarizer = summarizer
        self.prepared = ready
        self.later_jobs: list[SummaryJob] = []
        self.now_jobs: list[SummaryJob] = []
        self.done = 0

    async def ready(self) -> Checkpoint | None:
        return self.prepared

    async def now(self, job: SummaryJob, *, within: float) -> Checkpoint:
        self.now_jobs.append(job)
        return await run_job(job, self.summarizer, STORE)

    def later(self, job: SummaryJob) -> bool:
        self.later_jobs.append(job)
        return True

    async def drain(self) -> None:
        """Run the jobs scheduled so far, as the background would between two turns."""
        for job in self.later_jobs[self.done :]:
            self.prepared = await run_job(job, self.summarizer, STORE)
        self.done = len(self.later_jobs)


BUDGET = 8_000
"""Large enough that the compactable span, not the system prompt, makes the bulk."""


def turns() -> list[list[dict[str, Any]]]:
    trajectory = max(json.loads(TRACES.read_text()), key=lambda t: len(t["traj"]))
    return requests_of(trajectory["traj"])


async def run_with(
    service: Service, history: list[dict[str, Any]], state: Any = None, **policy: Any
) -> Any:
    pipeline = Pipeline(store=STORE)
    return await pipeline.compact(
        {"model": "gpt-4o", "messages": history},
        policy=Policy(max_input=BUDGET, **policy),
        state=state,
        now=1_000.0,
        summaries=service,
    )


def utilisation(history: list[dict[str, Any]]) -> float:
    counter = Pipeline().counter("o200k_base")
    return sum(counter.count_message(m) for m in history) / BUDGET


async def test_from_0_40_a_summary_is_prepared_and_the_request_is_not_held() -> None:
    service = Service(Scripted("prepared"))
    state = None
    for history in turns():
        result = await run_with(service, history, state=state)
        state = result.state.answered(at=999.0)
        if service.later_jobs:
            break
        assert "prepare" not in details(result)
    assert utilisation(history) >= 0.40
    assert service.now_jobs == []
    out = result.request["messages"]
    assert len(out) == len(history)  # nothing compacted below the trigger
    assert not any(str(m.get("content", "")).startswith("[Recalled") for m in out)
    (job,) = service.later_jobs
    assert job.base is None
    assert job.start == 3  # after the system prompt and the anchor
    assert job.chain == chain_of(history[job.start : job.end])
    assert list(job.originals) == history[job.start : job.end]
    assert details(result)["prepare"] == [job.start, job.end]


async def test_a_prepared_checkpoint_is_used_at_the_cut_without_a_call() -> None:
    """A replay where the background work finishes between turns: the turn compress
    first cuts applies the prepared checkpoint, with no summary asked for on the spot."""
    summarizer = Scripted()
    service = Service(summarizer)
    state = None
    for later in turns():
        result = await run_with(service, later, state=state)
        state = result.state.answered(at=999.0)
        if "path" in details(result):
            break
        await service.drain()
    checkpoint = service.prepared
    assert checkpoint is not None
    assert service.now_jobs == []
    assert details(result)["path"] == "prepared checkpoint used"
    assert details(result)["covers"] == [checkpoint.start, checkpoint.end]
    assert len(summarizer.calls) == service.done <= 3
    out = result.request["messages"]
    recalled = [m for m in out if str(m.get("content", "")).startswith("[Recalled context")]
    assert len(recalled) == 1
    assert REF.findall(recalled[0]["content"]) == [checkpoint.index]
    assert out[: checkpoint.start] == later[: checkpoint.start]
    assert_valid(out)
    assert_valid_request(result.request)
    assert result.report.tokens_after <= BUDGET
    assert result.state.checkpoint["cut"] > 0
    # The originals the summary stands for are stored, in order.
    restored: list[Any] = []
    for ref in checkpoint.refs:
        restored.extend(json.loads(await STORE.get("", ref) or b"[]"))
    assert restored == later[checkpoint.start : checkpoint.end]
    # The next turn applies the same checkpoint again: the prefix does not move.
    after = turns()[turns().index(later) + 1]
    following = await run_with(service, after, state=state)
    assert details(following)["path"] == "checkpoint reused"
    sent = following.request["messages"]
    assert sent[: len(out) - 1] == out[:-1]


async def test_the_next_preparation_merges_only_what_is_new() -> None:
    summarizer = Scripted("first", "merged")
    service = Service(summarizer)
    state = None
    for history in turns():
        state = (await run_with(service, history, state=state)).state.answered(at=999.0)
        await service.drain()
        if len(service.later_jobs) == 2:
            break
    first, second = service.later_jobs
    assert second.base is not None
    assert second.base.end == first.end
    assert list(second.originals) == history[first.end : second.end]
    assert summarizer.calls[1]["previous"]["user_goal"] == "goal (first)"
    merged = service.prepared
    assert merged is not None
    assert merged.summary["user_goal"] == "goal (merged)"
    assert merged.refs[: len(second.base.refs)] == second.base.refs
    assert (merged.start, merged.end) == (first.start, second.end)


async def test_a_summary_overflow_drops_tool_outputs_step_by_step() -> None:
    overflow = SummaryOverflow("window exceeded")
    summarizer = Scripted(overflow, overflow, overflow, "fits now")
    result = await run(summarizer, long_history())
    assert details(result)["path"] == "summarised"
    assert details(result)["dropped_tool_outputs"] == 0.5
    sent = [call["messages"] for call in summarizer.calls]
    omitted = [
        sum("omitted" in str(m.get("content")) for m in s if m["role"] == "tool") for s in sent
    ]
    tools = sum(m["role"] == "tool" for m in sent[0])
    assert omitted == [0, round(tools * 0.1), round(tools * 0.2), round(tools * 0.5)]


async def test_overflowing_even_without_tool_outputs_falls_back_to_notes() -> None:
    summarizer = Scripted(*[SummaryOverflow("window exceeded")] * 5)
    result = await run(summarizer, long_history())
    assert len(summarizer.calls) == 5
    assert details(result)["path"].startswith("fallback")
    assert "[Context note:" in str(result.request["messages"])


async def test_a_cut_sent_with_notes_keeps_them_while_the_cache_is_warm() -> None:
    history = long_history()
    # At 6,000 tokens the compact history's cold pass archives enough that no cut is
    # worth taking; 5,500 keeps the scenario (a cut, then a cold summary).
    policy = {"max_input": 5_500}
    failed = await run(Scripted(SummaryFailed("down")), history, **policy)
    assert details(failed)["path"].startswith("fallback")
    state = failed.state.answered(at=999.0)
    summarizer = Scripted("ready now")
    again = await run(summarizer, history, state=state, **policy)
    assert summarizer.calls == []
    assert again.request == failed.request
    assert details(again)["path"].startswith("notes kept")
    cold = await run(Scripted("ready now"), history, state=failed.state.answered(at=1.0), **policy)
    assert details(cold)["path"] == "summarised"


async def test_a_request_with_no_record_prepares_nothing() -> None:
    """A conversation's first request (no record: it may never be followed up) schedules
    no summary, however full it is."""
    service = Service(Scripted())
    for history in turns():
        if 0.40 <= utilisation(history) < 0.70:
            await run_with(service, history)
    assert service.later_jobs == []


@cache  # the grid tests build the same agent loops hundreds of times (10 million draws)
def words(seed: int, count: int) -> str:
    chosen = random.Random(seed)
    return " ".join(f"word{chosen.randint(0, 999)}" for _ in range(count))


def agent_loop(calls: int) -> list[dict[str, Any]]:
    """A chat, then one user request the agent works on for ``calls`` tool calls."""
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Start the project."},
        {"role": "assistant", "content": "Sure."},
    ]
    for turn in range(4):
        history += [
            {"role": "user", "content": f"question {turn}: {words(turn, 40)}"},
            {"role": "assistant", "content": f"answer {turn}: {words(100 + turn, 40)}"},
        ]
    history.append({"role": "user", "content": "Now please investigate the files."})
    for n in range(calls):
        history += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{n}",
                        "type": "function",
                        "function": {"name": "read", "arguments": f'{{"n": {n}}}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"call_{n}", "content": words(1000 + n, 250)},
        ]
    return history


async def test_a_pinned_request_stays_where_it_was_once_it_is_no_longer_the_latest() -> None:
    """The latest user message of a long agent loop is kept beside the summary; when the
    user writes again it is no longer protected, yet the next request, at the same cut,
    renders the summary exactly as before: the prefix does not move."""
    summarizer = Scripted("loop")
    pipeline = isolated(summarizer, ModelCatalog())
    first_history = agent_loop(16)
    first = await pipeline.compact(
        {"model": "gpt-4o", "messages": first_history}, policy=Policy(max_input=6_000), now=1_000.0
    )
    assert details(first)["path"] == "summarised"
    out = first.request["messages"]
    assert {"role": "user", "content": "Now please investigate the files."} in out
    second_history = [
        *first_history,
        {"role": "assistant", "content": "Done investigating."},
        {"role": "user", "content": "Thanks, what next?"},
    ]
    second = await pipeline.compact(
        {"model": "gpt-4o", "messages": second_history},
        policy=Policy(max_input=6_000),
        state=first.state.answered(at=999.0),
        now=1_000.0,
    )
    if not second.report.is_event_after(first.report):
        assert second.request["messages"][: len(out) - 1] == out[:-1]
    assert details(second)["path"] == "checkpoint reused"


class PlainStore:
    """A store with the protocol's two operations only (no ``touch``)."""

    def __init__(self) -> None:
        self.inner = MemoryStore()

    async def put(self, namespace: str, content: bytes, *, ttl: int) -> str:
        return await self.inner.put(namespace, content, ttl=ttl)

    async def get(self, namespace: str, ref: str) -> bytes | None:
        return await self.inner.get(namespace, ref)


async def test_a_store_without_touch_still_reuses_its_checkpoint() -> None:
    store = PlainStore()
    history = long_history()

    async def once(summarizer: Scripted, state: Any = None) -> Any:
        return await Pipeline(store=store, summarizer=summarizer).compact(
            {"model": "gpt-4o", "messages": history},
            policy=Policy(max_input=6_000),
            state=state,
            now=1_000.0,
        )

    first = await once(Scripted("first"))
    assert details(first)["path"] == "summarised"
    again = Scripted("second")
    result = await once(again, first.state.answered(at=999.0))
    assert details(result)["path"] == "checkpoint reused"
    assert again.calls == []
    assert result.request == first.request


async def test_without_background_work_a_summary_is_extended_when_the_cut_moves() -> None:
    """The library has no background: when compress moves its cut past what the
    checkpoint covers, the new part is merged in on the spot (not left in notes)."""
    summarizer = Scripted("first", "merged")
    pipeline = isolated(summarizer, ModelCatalog())
    state = None
    paths = []
    for history in turns():
        result = await pipeline.compact(
            {"model": "gpt-4o", "messages": history},
            policy=Policy(max_input=4_000),
            state=state,
            now=1_000.0,
        )
        state = result.state.answered(at=999.0)
        paths.append(details(result).get("path"))
    assert "summarised" in paths
    assert "merged" in paths
    assert summarizer.calls[1]["previous"]["user_goal"] == "goal (first)"
    covers = details(result)["covers"]
    assert covers[1] == result.state.checkpoint["cut"] or covers[1] > 12


async def test_a_record_from_before_kept_was_recorded_keeps_the_pinned_request() -> None:
    """A checkpoint in a record written without ``kept`` (an older replica) is reused
    with the protected messages of now: the latest user request is still sent as is."""
    import dataclasses

    pipeline = isolated(Scripted("loop"), ModelCatalog())
    history = agent_loop(16)
    first = await pipeline.compact(
        {"model": "gpt-4o", "messages": history}, policy=Policy(max_input=6_000), now=1_000.0
    )
    ask = {"role": "user", "content": "Now please investigate the files."}
    assert ask in first.request["messages"]
    older = {k: v for k, v in first.state.checkpoint.items() if k != "kept"}
    state = dataclasses.replace(first.state, checkpoint=older).answered(at=999.0)
    again = await pipeline.compact(
        {"model": "gpt-4o", "messages": history},
        policy=Policy(max_input=6_000),
        state=state,
        now=1_000.0,
    )
    assert details(again)["path"] == "checkpoint reused"
    assert ask in again.request["messages"]


async def test_the_summary_moves_the_prefix_only_when_compress_moves_its_cut() -> None:
    """Replays of the longest trajectories over a range of budgets, background work done
    between turns, the cache warm: whenever compress keeps its cut (and no emergency
    shortening acts), the outgoing request starts with the previous one; the summary
    never swaps itself for notes or another checkpoint in between."""
    longest = sorted(json.loads(TRACES.read_text()), key=lambda t: -len(t["traj"]))[:3]
    breaks: list[Any] = []
    paths: list[Any] = []
    for trajectory in longest:
        for budget in range(4_000, 10_001, 250):
            service = Service(Scripted())
            pipeline = isolated(None, ModelCatalog())
            pipeline.store = STORE
            state, previous = None, None
            for history in requests_of(trajectory["traj"]):
                result = await pipeline.compact(
                    {"model": "gpt-4o", "messages": history},
                    policy=Policy(max_input=budget),
                    state=state,
                    now=1_000.0,
                    summaries=service,
                )
                state = result.state.answered(at=999.0)
                out = result.request["messages"]
                compress = result.report.stage("compress")
                assert compress is not None
                now = {k: compress.details.get(k) for k in ("level", "cut", "span_start")}
                emergency = "emergency_shortened" in compress.details
                paths.append(details(result).get("path"))
                if previous is not None:
                    before, was, was_emergency = previous
                    same = now == was and not (emergency or was_emergency)
                    if same and out[: len(before) - 1] != before[:-1]:
                        breaks.append((budget, len(history), paths[-1]))
                previous = (out, now, emergency)
                await service.drain()
    assert breaks == []
    assert paths.count("checkpoint reused") > 100  # summaries were there to break it


async def test_without_summaries_a_once_pinned_request_stays_whole_at_the_same_cut() -> None:
    """Compress alone: the request that was the latest user message, kept whole inside
    the span, stays whole when the user writes again and the cut does not move (held by
    anti-thrashing or chosen again): the prefix moves only at a recorded event. Over a
    grid of message sizes."""
    import dataclasses
    import itertools

    moves = checked = 0
    for ask, reply, extra, size in itertools.product(
        (20, 300, 500, 800), (10, 200, 400, 700), (0, 1, 2, 4), (5, 60, 200)
    ):
        pipeline = isolated(None, ModelCatalog())
        policy = Policy(max_input=6_000, mode="truncate")
        history = agent_loop(16)
        history[11] = {"role": "user", "content": "Now please investigate: " + words(55, ask)}
        first = await pipeline.compact({"model": "gpt-4o", "messages": history}, policy=policy)
        if "cut" not in first.report.stage("compress").details:  # type: ignore[union-attr]
            continue
        state = dataclasses.replace(first.state, thin_compactions=2).answered(at=time.time())
        grown = [
            *history,
            {"role": "assistant", "content": "Done."},
            {"role": "user", "content": "more: " + words(7, reply)},
        ]
        for n in range(extra):
            grown += agent_loop(100 + n + 1)[-2:]  # one more call and its output
            grown[-2]["tool_calls"][0]["id"] = grown[-1]["tool_call_id"] = f"extra_{n}"
            grown[-1]["content"] = words(2000 + n, size)
        again = await pipeline.compact(
            {"model": "gpt-4o", "messages": grown}, policy=policy, state=state
        )
        out = first.request["messages"]
        checked += 1
        if not again.report.is_event_after(first.report):
            moves += again.request["messages"][: len(out) - 1] != out[:-1]
    assert checked > 50
    assert moves == 0
