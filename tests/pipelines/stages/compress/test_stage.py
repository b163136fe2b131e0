"""compress as a whole: deterministic compaction that fits, keeps tool pairs valid, loses
nothing and keeps the outgoing prefix stable between compaction events. Replayed on real
traces."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from bench.compaction import Session, requests_of
from gateway.store import MemoryStore
from pipelines import Pipeline, Policy, TokenCounter
from pipelines.cache_break import without_markers
from tests.openai_schema import assert_valid_request
from tests.pipelines.stages.compress.samples import REF, TRACES
from tests.pipelines.stages.conftest import BoundaryProbe, boundary_at, probed
from tests.pipelines.stages.test_normalize import assert_valid


@pytest.mark.parametrize("model", ["gpt-4o", "claude-sonnet-4-5"])
@pytest.mark.parametrize("max_input", [4_000, 8_000, 16_000])
async def test_replayed_traces_fit_stay_valid_and_stable(max_input: int, model: str) -> None:
    """Replaying tau-bench trajectories turn by turn under a small max-input: every request
    fits and is (its cache markers aside) a valid CreateChatCompletionRequest, tool pairs
    stay valid, the system prompt and latest user message are unchanged, tokens never grow,
    every ref restores, the same request gives the same bytes, and turn k+1's request
    starts with turn k's (cache markers aside: they are not cache content) unless the
    report records a compaction event (a stage moved a cut, compress changed level or cut,
    an emergency acted). The client is sometimes idle past the cache TTL, so the cache-TTL
    prune acts too."""
    store = MemoryStore()
    pipeline = Pipeline(store=store)
    policy = Policy(max_input=max_input)
    counter = TokenCounter()
    events = 0
    for trajectory in json.loads(TRACES.read_text()):
        previous: tuple[list[dict[str, Any]], Any] | None = None
        session = Session(pipeline, policy, model=model)
        for turn, history in enumerate(requests_of(trajectory["traj"])):
            request = {"model": model, "messages": history}
            state = session.state
            # now and then the user is away longer than the cache lives (gpt-4o: 600 s)
            result = await session.send(history, after=700.0 if turn % 7 == 6 else 5.0)
            out = without_markers(result.request["messages"])
            report = result.report
            assert report.tokens_after <= report.budget
            assert report.tokens_after == counter.count_messages(out)
            assert report.tokens_after <= report.tokens_before
            assert_valid(out)
            assert_valid_request(without_markers(result.request))
            assert out[0] == history[0]
            compress = report.stage("compress")
            if compress is None or "emergency_shortened" not in compress.details:
                assert out[1] == history[1]  # the first user message (the anchor)
            latest_user = max(i for i, m in enumerate(history) if m["role"] == "user")
            assert history[latest_user] in out
            for ref in REF.findall(orjson.dumps(out).decode()):
                assert await store.get("", ref) is not None
            again = await pipeline.compact(request, policy=policy, state=state, now=session.now)
            assert orjson.dumps(again.request) == orjson.dumps(result.request)
            if previous is not None:
                before_out, before_report = previous
                if report.is_event_after(before_report):
                    events += 1
                else:
                    assert out[: len(before_out)] == before_out
            previous = (out, report)
    assert events > 0


async def test_the_end_of_the_compacted_span_is_named_the_compaction_boundary() -> None:
    """When compress cuts, the last message of what it made of the span (a removal note
    here) is handed to the later stages as the compaction boundary: the received tail
    follows it untouched."""
    trajectory = max(json.loads(TRACES.read_text()), key=lambda t: len(t["traj"]))
    history = requests_of(trajectory["traj"])[-1]
    probe = BoundaryProbe()
    pipeline = Pipeline(stages=probed(probe), store=MemoryStore())
    result = await pipeline.compact(
        {"model": "gpt-4o", "messages": history}, policy=Policy(max_input=4_000, mode="truncate")
    )
    assert "compress" in result.report.actions
    index = boundary_at(probe, history)
    assert result.request["messages"][index]["content"].startswith("[Context note:")


async def test_below_the_light_threshold_nothing_changes() -> None:
    """A conversation well inside its budget passes compress untouched."""
    trajectory = json.loads(TRACES.read_text())[0]["traj"]
    result = await Pipeline(store=MemoryStore()).compact(
        {"model": "gpt-4o", "messages": trajectory}, policy=Policy(max_input=100_000)
    )
    assert "compress" not in result.report.actions
