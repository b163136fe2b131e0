"""compress's cut: it stays put while the request fits under the trigger, and moves only
for a saving worth the cache break."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import pytest

from bench.compaction import Session, requests_of
from gateway.store import MemoryStore
from pipelines import Pipeline, Policy, Report
from pipelines.stages.compress import MAX_MIN_SAVING, MIN_SAVING_FLOOR, Compress
from tests.pipelines.stages.compress.samples import TRACES


async def test_a_cut_saving_less_than_the_room_left_waits() -> None:
    """Just over the trigger with room left under the budget, a cut that would save less
    than that room is not worth breaking the cached prefix: the request goes as it is.
    Closer to the budget, the same cut is taken."""
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You look things up."},
        {"role": "user", "content": "Find order 1."},
        {"role": "assistant", "content": "Looking."},
    ]
    for n in range(40):
        call = {
            "id": f"c{n}",
            "type": "function",
            "function": {"name": "lookup", "arguments": "{}"},
        }
        history.append({"role": "assistant", "content": None, "tool_calls": [call]})
        history.append({"role": "tool", "tool_call_id": f"c{n}", "content": f"row {n} " * 60})
    history.append({"role": "user", "content": "And order 2?"})
    pipeline = Pipeline(stages=[Compress()], store=MemoryStore())
    request = {"model": "gpt-4o", "messages": history}
    tokens = (await pipeline.compact(request, policy=Policy(mode="off"))).report.tokens_before

    def details(result: Any) -> dict[str, Any]:
        return next(s.details for s in result.report.stages if s.name == "compress")

    roomy = await pipeline.compact(request, policy=Policy(max_input=int(tokens / 0.72)))
    assert details(roomy)["level"] == "full"
    assert details(roomy)["skipped_saving"] < details(roomy)["minimum_saving"]
    assert "compress" not in roomy.report.actions
    tight = await pipeline.compact(request, policy=Policy(max_input=int(tokens / 0.88)))
    assert "cut" in details(tight)
    assert tight.report.tokens_after < tokens


class Turn(NamedTuple):
    """Two consecutive requests of a session whose first was cut, neither shortened in
    an emergency."""

    before: Report
    after: Report
    sent_before: list[dict[str, Any]]
    sent_after: list[dict[str, Any]]
    kept: int
    """Tokens the second request would have with the first one's cut: at most what the
    first sent plus the history's growth (later stages only ever shrink new messages)."""


async def turns_after_cuts(max_input: int, trajectories: int) -> list[Turn]:
    """Tau-bench trajectories chained into one long agent session and replayed turn by
    turn through the default pipeline, the record carried; refs come from a fixed
    secret, so the token counts are the same on every run."""
    traces = json.loads(TRACES.read_text())[:trajectories]
    chained = [traces[0]["traj"][0]] + [m for t in traces for m in t["traj"][1:]]
    session = Session(Pipeline(store=MemoryStore(secret=b"turns")), Policy(max_input=max_input))
    turns: list[Turn] = []
    previous: tuple[Report, list[dict[str, Any]]] | None = None
    for history in requests_of(chained):
        result = await session.send(history)
        report, sent = result.report, result.request["messages"]
        assert report.tokens_after <= report.budget
        if previous is not None and previous[0].compaction()[1] is not None:
            before, sent_before = previous
            if not before.compaction()[-1] and not report.compaction()[-1]:
                kept = before.tokens_after + report.tokens_before - before.tokens_before
                turns.append(Turn(before, report, sent_before, sent, kept))
        previous = report, sent
    return turns


@pytest.mark.parametrize(("max_input", "trajectories"), [(8_000, 8), (16_000, 12)])
async def test_a_cut_stays_put_while_the_request_fits_under_the_trigger(
    max_input: int, trajectories: int
) -> None:
    """Once a request of a long agent session is cut, the next ones keep that cut, and so
    the provider's cached prefix, for as long as the grown history fits under ``trigger``
    with it, even when the cut sits off compress's grid and a grid point appears just
    after it: no compaction event, the outgoing prefix unchanged."""
    turns = await turns_after_cuts(max_input, trajectories)
    fitting = [t for t in turns if t.kept <= Policy().trigger * t.after.budget]
    assert len(fitting) > 10
    assert any(t.after.is_event_after(t.before) for t in turns)
    for turn in fitting:
        assert not turn.after.is_event_after(turn.before)
        assert turn.sent_after[: len(turn.sent_before)] == turn.sent_before


@pytest.mark.parametrize(("max_input", "trajectories"), [(8_000, 8), (16_000, 12)])
async def test_a_cut_moves_only_for_a_saving_worth_the_cache_break(
    max_input: int, trajectories: int
) -> None:
    """When the grown history no longer fits under ``trigger`` with the previous cut but
    still fits the budget, the cut moves only if the move saves at least the room left
    under the budget (clamped to 500-3,000 tokens) compared with keeping it: a move
    saving a few hundred tokens is not worth a cache break every other request."""
    turns = await turns_after_cuts(max_input, trajectories)
    moves = 0
    for turn in turns:
        budget = turn.after.budget
        if turn.after.is_event_after(turn.before) and turn.kept <= budget:
            moves += 1
            minimum = min(MAX_MIN_SAVING, max(MIN_SAVING_FLOOR, budget - turn.kept))
            assert turn.kept - turn.after.tokens_after >= minimum
    assert moves > 2
