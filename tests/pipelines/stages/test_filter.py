"""filter: oversized tool outputs offloaded whole, behind a deterministic preview."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from gateway.store import MemoryStore
from pipelines import Pipeline, Policy, TokenCounter
from pipelines.compact_json import compact_json
from pipelines.stages.filter import Filter
from tests.pipelines.stages.conftest import FailingStore

TRACES = Path(__file__).resolve().parents[3] / "bench" / "data" / "tau-bench-gpt-4o-airline.json"
REF = re.compile(r"ctx_[A-Za-z0-9_-]{22,}")


def with_output(output: str) -> list[dict[str, Any]]:
    call = {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}}
    return [
        {"role": "user", "content": "Find flights"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "name": "search", "content": output},
    ]


async def compact(messages: list[dict[str, Any]], store: Any, **policy: Any) -> Any:
    return await Pipeline(stages=[Filter()], store=store).compact(
        {"model": "gpt-4o", "messages": messages}, policy=Policy(**policy)
    )


BIG_JSON = json.dumps(
    [
        {
            "flight": f"HAT{i:03d}",
            "origin": "JFK",
            "destination": "SFO",
            "price": 100 + i,
            "seats": {"economy": i % 9},
        }
        for i in range(2_000)
    ]
)


async def test_big_output_is_offloaded_behind_a_preview() -> None:
    """A tool output over the limit becomes a header with its ref plus a preview; the ref
    restores the exact original; the call/result pairing is untouched; tokens drop."""
    store = MemoryStore()
    result = await compact(with_output(BIG_JSON), store)
    out = result.request["messages"][2]
    assert out["tool_call_id"] == "c1"
    assert out["name"] == "search"
    assert out["content"].startswith("[Tool output offloaded: ")
    assert "showing " in out["content"]
    assert "of 2000 items" in out["content"]
    ref = REF.search(out["content"]).group()  # type: ignore[union-attr]
    assert await store.get("", ref) == BIG_JSON.encode()
    assert result.report.tokens_after < result.report.tokens_before / 20
    assert result.report.stages[0].details["refs"] == [ref]


async def test_same_output_same_preview_bytes() -> None:
    """The same output always gives the same replacement, byte for byte."""
    store = MemoryStore()
    first = await compact(with_output(BIG_JSON), store)
    second = await compact(with_output(BIG_JSON), store)
    assert first.request == second.request


async def test_small_outputs_and_other_messages_untouched() -> None:
    """Outputs at or under the limit, and long user or assistant text, are left alone."""
    store = MemoryStore()
    assert not (await compact(with_output("short result"), store)).changed
    long_user = [{"role": "user", "content": "word " * 20_000}]
    assert not (await compact(long_user, store)).changed


async def test_output_kept_when_it_cannot_be_stored() -> None:
    """Without a store, or with a failing one, the output stays whole (as compact JSON:
    what it says, character for character, without the whitespace between values)."""

    for store, failed in ((None, 0), (FailingStore(), 1)):
        result = await compact(with_output(BIG_JSON), store)
        assert result.request["messages"][2]["content"] == compact_json(BIG_JSON)
        assert result.report.stages[0].details["kept_without_store"] == 1
        assert result.report.store_failures == failed
        assert result.report.as_dict()["store_failures"] == failed


async def test_real_traces_with_a_low_limit() -> None:
    """On the tau-bench traces with filter-tokens=300, every tool output over the limit is
    replaced, every replacement's ref restores its original, nothing else changes but
    JSON outputs sent as compact JSON, and the tokens reported are those of what is sent."""
    store = MemoryStore()
    counter = TokenCounter()
    trajectories = json.loads(TRACES.read_text())
    replaced = 0
    for trajectory in trajectories[:40]:
        messages = trajectory["traj"]
        result = await compact(messages, store, filter_tokens=300)
        assert result.report.tokens_after == counter.count_messages(result.request["messages"])
        for before, after in zip(messages, result.request["messages"], strict=True):
            if before == after:
                continue
            assert before["role"] == "tool"
            assert after["tool_call_id"] == before["tool_call_id"]
            found = REF.search(after["content"])
            if found is None:
                assert after["content"] == compact_json(before["content"])
                continue
            assert await store.get("", found.group()) == before["content"].encode()
            replaced += 1
    assert replaced > 20
