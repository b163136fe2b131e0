"""summarize: the compacted span replaced by one recalled-context summary, reused while
the span is the same, merged when it grows, and the notes kept whenever that fails."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.compaction import requests_of
from gateway.store import MemoryStore
from pipelines import ConversationState, Pipeline, Policy
from pipelines.summary import FIELDS, LIST_FIELDS, Summary, SummaryFailed
from tests.openai_schema import assert_valid_request
from tests.pipelines.stages.test_normalize import assert_valid

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
        policy=Policy(max_input=6_000, **policy),
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
    assert all(ref in summaries[0]["content"] for ref in checkpoint["refs"])
    assert summarizer.calls[0]["model"] == "gpt-4o"
    assert summarizer.calls[0]["previous"] is None
    assert any(m.get("role") == "tool" for m in summarizer.calls[0]["messages"])
    assert details(result)["path"] == "summarised"
    assert_valid(out)
    assert_valid_request(result.request)
    assert result.report.tokens_after <= result.report.budget


async def test_the_same_span_reuses_the_checkpoint_without_a_call() -> None:
    history = long_history()
    first = await run(Scripted("first"), history)
    again = Scripted("second")
    state = first.state.answered(at=999.0)
    result = await run(again, history, state=state)
    assert again.calls == []
    assert details(result)["path"] == "checkpoint reused"
    assert result.request == first.request


async def test_a_grown_span_is_merged_into_the_previous_summary() -> None:
    history = long_history()
    first = await run(Scripted("first"), history)
    checkpoint = first.state.checkpoint
    older = {
        "refs": checkpoint["refs"][:1],
        "summary": {**checkpoint["summary"], "user_goal": "older"},
    }
    merging = Scripted("merged")
    result = await run(merging, history, state=ConversationState(checkpoint=older))
    assert details(result)["path"] == "merged"
    assert merging.calls[0]["previous"]["user_goal"] == "older"
    assert "goal (merged)" in str(result.request["messages"])


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
