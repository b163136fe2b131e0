"""compress's span: what is removed becomes notes whose refs restore it exactly, and a long
chat of short turns still fits."""

from __future__ import annotations

import json
from typing import Any

import orjson

from bench.compaction import requests_of
from gateway.store import MemoryStore
from pipelines import Pipeline, Policy
from tests.pipelines.stages.compress.samples import REF, TRACES


async def original_of(store: MemoryStore, message: dict[str, Any]) -> dict[str, Any]:
    """``message`` with a tool output an earlier stage archived or trimmed restored."""
    content = message.get("content")
    if message.get("role") == "tool" and isinstance(content, str) and content.startswith("["):
        found = REF.search(content.split("]", 1)[0])
        if found:
            stored = await store.get("", found.group())
            assert stored is not None
            return {**message, "content": stored.decode()}
    return message


async def test_removed_messages_restore_exactly() -> None:
    """The note left for removed messages names a ref whose content is exactly the removed
    messages, in order (tool outputs an earlier stage trimmed restore through their own
    refs)."""
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
        removed = [await original_of(store, m) for m in removed]
        start = history.index(removed[0])
        assert history[start : start + len(removed)] == removed


async def test_a_long_chat_of_short_turns_fits() -> None:
    """Hundreds of short exchanges: once the user messages alone outgrow the span's
    share, the oldest go into notes too (restorable), so the request fits, quickly."""
    history: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for n in range(1_000):
        history += [
            {"role": "user", "content": f"What is {n} squared?"},
            {"role": "assistant", "content": f"{n * n}."},
        ]
    history.append({"role": "user", "content": "And 1000 squared?"})
    store = MemoryStore()
    result = await Pipeline(store=store).compact(
        {"model": "gpt-4o", "messages": history}, policy=Policy(max_input=4_000)
    )
    out = result.request["messages"]
    assert result.report.tokens_after <= 4_000
    assert out[0] == history[0]
    assert out[-1] == history[-1]
    assert result.report.ms < 5_000
    kept_or_stored = set()
    for message in out:
        found = REF.search(str(message.get("content")))
        if message.get("role") == "user" and found and "were removed" in message["content"]:
            stored = await store.get("", found.group())
            assert stored is not None
            kept_or_stored.update(m["content"] for m in orjson.loads(stored) if m["role"] == "user")
        elif message.get("role") == "user":
            kept_or_stored.add(message["content"])
    assert kept_or_stored == {m["content"] for m in history if m["role"] == "user"}
