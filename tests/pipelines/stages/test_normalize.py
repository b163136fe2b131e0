"""normalize: valid tool-call structure, with nothing the client sent dropped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from pipelines.stages.normalize import INTERRUPTED_RESULT, OPENING_MESSAGE, Normalize
from tests.pipelines.stages.conftest import run_stage

TRACES = Path(__file__).resolve().parents[3] / "bench" / "data" / "tau-bench-gpt-4o-airline.json"


def call(call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "f", "arguments": "{}"}}


def assert_valid(messages: list[dict[str, Any]]) -> None:
    """Every call answered in the block after it; every tool message answers such a call;
    the first non-system message is a user message."""
    first = next((m for m in messages if m["role"] not in ("system", "developer")), None)
    assert first is None or first["role"] == "user"
    index = 0
    while index < len(messages):
        message = messages[index]
        assert message["role"] != "tool", f"orphan tool message at {index}"
        index += 1
        if message["role"] == "assistant" and message.get("tool_calls"):
            expected = [c["id"] for c in message["tool_calls"]]
            answered = []
            while index < len(messages) and messages[index]["role"] == "tool":
                answered.append(messages[index]["tool_call_id"])
                index += 1
            assert sorted(answered) == sorted(expected)


async def test_dangling_call_gets_an_interrupted_result() -> None:
    """A call without a result gets a synthetic one after the results it has."""
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [call("a"), call("b")]},
        {"role": "tool", "tool_call_id": "a", "content": "A"},
        {"role": "user", "content": "and?"},
    ]
    out = (await run_stage(Normalize(), messages)).request["messages"]
    assert out[3] == {"role": "tool", "tool_call_id": "b", "content": INTERRUPTED_RESULT}
    assert out[4] == messages[3]
    assert_valid(out)


async def test_orphan_result_becomes_a_user_message_with_its_content() -> None:
    """A tool result whose call is gone is kept, as a user message that says what it is."""
    messages = [
        {"role": "user", "content": "go"},
        {"role": "tool", "tool_call_id": "zz", "name": "lookup", "content": "HAT170 on time"},
        {"role": "assistant", "content": "ok"},
    ]
    out = (await run_stage(Normalize(), messages)).request["messages"]
    assert out[1]["role"] == "user"
    assert "zz" in out[1]["content"]
    assert "lookup" in out[1]["content"]
    assert out[1]["content"].endswith("HAT170 on time")
    assert_valid(out)


async def test_leading_assistant_gets_an_opening_user_message() -> None:
    """A conversation whose first non-system message is not a user's gets one before it."""
    messages = [
        {"role": "system", "content": "s"},
        {"role": "assistant", "content": "Hi!"},
        {"role": "user", "content": "hello"},
    ]
    out = (await run_stage(Normalize(), messages)).request["messages"]
    assert out[1] == {"role": "user", "content": OPENING_MESSAGE}
    assert out[2:] == messages[1:]


async def test_real_traces_pass_through_unchanged() -> None:
    """Every tau-bench trajectory, at every turn, is already valid and is left as it is."""
    trajectories = json.loads(TRACES.read_text())
    for trajectory in trajectories[:60]:
        messages = trajectory["traj"]
        for end in range(2, len(messages) + 1):
            if messages[end - 1]["role"] == "assistant" and messages[end - 1].get("tool_calls"):
                continue  # a turn never ends on a call awaiting its results
            result = await run_stage(Normalize(), messages[:end])
            assert not result.changed


message = st.one_of(
    st.builds(lambda t: {"role": "user", "content": t}, st.text(max_size=5)),
    st.builds(lambda t: {"role": "assistant", "content": t}, st.text(max_size=5)),
    st.builds(
        lambda ids: {"role": "assistant", "content": None, "tool_calls": [call(i) for i in ids]},
        st.lists(st.sampled_from("abc"), min_size=1, max_size=3, unique=True),
    ),
    st.builds(
        lambda i, t: {"role": "tool", "tool_call_id": i, "content": t},
        st.sampled_from("abcd"),
        st.text(max_size=5),
    ),
)
conversations = st.tuples(st.booleans(), st.lists(message, max_size=12)).map(
    lambda pair: ([{"role": "system", "content": "sys"}] if pair[0] else []) + pair[1]
)


@given(conversations)
async def test_any_conversation_comes_out_valid_and_whole(messages: list[dict[str, Any]]) -> None:
    """Whatever the order of calls and results, the output is valid, every original
    message's content is still in it, and normalizing again changes nothing."""
    if not messages:
        return
    out = (await run_stage(Normalize(), messages)).request["messages"]
    assert_valid(out)
    kept = [orjson.dumps(m.get("content")).decode()[1:-1] for m in out]
    for original in messages:
        content = original.get("content")
        if content:
            needle = orjson.dumps(content).decode()[1:-1]
            assert any(needle in text for text in kept)
    again = await run_stage(Normalize(), out)
    assert not again.changed
