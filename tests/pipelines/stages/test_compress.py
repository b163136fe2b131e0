"""compress: deterministic compaction that fits, keeps tool pairs valid, loses nothing and
keeps the outgoing prefix stable between compaction events. Replayed on real traces."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench.compaction import requests_of
from gateway.store import MemoryStore
from pipelines import Pipeline, Policy, RequestRejected
from tests.pipelines.stages.test_normalize import assert_valid

TRACES = Path(__file__).resolve().parents[3] / "bench" / "data" / "tau-bench-gpt-4o-airline.json"
REF = re.compile(r"ctx_[A-Za-z0-9_-]{22,}")


def compact_details(report: Any) -> dict[str, Any]:
    return next(s.details for s in report.stages if s.name == "compress")


@pytest.mark.parametrize("max_input", [4_000, 8_000, 16_000])
async def test_replayed_traces_fit_stay_valid_and_stable(max_input: int) -> None:
    """Replaying tau-bench trajectories turn by turn under a small max-input: every request
    fits, tool pairs stay valid, the system prompt and latest user message are unchanged,
    tokens never grow, every ref restores, the same request gives the same bytes, and turn
    k+1's request starts with turn k's unless the compaction level or cut changed or an
    emergency acted (a compaction event)."""
    store = MemoryStore()
    pipeline = Pipeline(store=store)
    policy = Policy(max_input=max_input)
    events = 0
    for trajectory in json.loads(TRACES.read_text())[:60]:
        previous: tuple[list[dict[str, Any]], Any] | None = None
        for history in requests_of(trajectory["traj"]):
            request = {"model": "gpt-4o", "messages": history}
            result = await pipeline.compact(request, policy=policy)
            out = result.request["messages"]
            report = result.report
            assert report.tokens_after <= report.budget
            assert report.tokens_after <= report.tokens_before
            assert_valid(out)
            assert out[0] == history[0]
            latest_user = max(i for i, m in enumerate(history) if m["role"] == "user")
            assert history[latest_user] in out
            for ref in REF.findall(orjson.dumps(out).decode()):
                assert await store.get("", ref) is not None
            again = await pipeline.compact(request, policy=policy)
            assert orjson.dumps(again.request) == orjson.dumps(result.request)
            details = compact_details(report)
            if previous is not None:
                before_out, before_details = previous
                moved = details.get("cut") != before_details.get("cut") or details.get(
                    "level"
                ) != before_details.get("level")
                emergency = "emergency_shortened" in details or (
                    "emergency_shortened" in before_details
                )
                if moved or emergency:
                    events += 1
                else:
                    assert out[: len(before_out)] == before_out
            previous = (out, details)
    assert events > 0


async def test_removed_messages_restore_exactly() -> None:
    """The note left for removed messages names a ref whose content is exactly the removed
    messages, in order."""
    store = MemoryStore()
    trajectory = max(json.loads(TRACES.read_text()), key=lambda t: len(t["traj"]))
    history = requests_of(trajectory["traj"])[-1]
    result = await Pipeline(store=store).compact(
        {"model": "gpt-4o", "messages": history}, policy=Policy(max_input=4_000)
    )
    notes = [m for m in result.request["messages"] if "were removed" in str(m.get("content"))]
    assert notes
    for note in notes:
        removed = orjson.loads(await store.get("", REF.search(note["content"]).group()))  # type: ignore[arg-type, union-attr]
        start = history.index(removed[0])
        assert history[start : start + len(removed)] == removed


async def test_below_the_light_threshold_nothing_changes() -> None:
    """A conversation well inside its budget passes compress untouched."""
    trajectory = json.loads(TRACES.read_text())[0]["traj"]
    result = await Pipeline(store=MemoryStore()).compact(
        {"model": "gpt-4o", "messages": trajectory}, policy=Policy(max_input=100_000)
    )
    assert "compress" not in result.report.actions


async def test_too_big_even_after_everything_is_refused() -> None:
    """When the system prompt and the latest user message alone exceed the budget, the
    request is refused with context_length_exceeded and the numbers."""
    messages = [
        {"role": "system", "content": "rules " * 5_000},
        {"role": "user", "content": "hello"},
    ]
    with pytest.raises(RequestRejected) as caught:
        await Pipeline(store=MemoryStore()).compact(
            {"model": "gpt-4o", "messages": messages}, policy=Policy(max_input=4_000)
        )
    assert caught.value.code == "context_length_exceeded"
    assert "4,000" in str(caught.value)


async def test_without_a_store_nothing_is_removed() -> None:
    """No store, no compaction: the gateway never drops what it cannot give back."""
    trajectory = max(json.loads(TRACES.read_text()), key=lambda t: len(t["traj"]))["traj"]
    history = requests_of(trajectory)[-1]
    with pytest.raises(RequestRejected):
        await Pipeline().compact(
            {"model": "gpt-4o", "messages": history}, policy=Policy(max_input=4_000)
        )
