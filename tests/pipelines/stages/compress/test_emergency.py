"""compress's emergency: tool-call arguments cut and still valid JSON, by their long
strings or by structure; and a request too big even after everything, refused."""

from __future__ import annotations

import orjson
import pytest

from gateway.store import MemoryStore
from pipelines import Pipeline, Policy, RequestRejected
from tests.openai_schema import assert_valid_request
from tests.pipelines.stages.compress.samples import REF
from tests.pipelines.stages.test_normalize import assert_valid


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


async def test_huge_tool_call_arguments_are_cut_and_stay_valid_json() -> None:
    """In an emergency, a tool call carrying a whole file in its arguments keeps its
    shape: the arguments parse, short fields are untouched, the long one keeps its head
    and tail and names the ref of the original calls, which restores them exactly."""
    text = "".join(f"line {i}: print('value {i}')\n" for i in range(3_000))
    call = {
        "id": "call_w",
        "type": "function",
        "function": {
            "name": "write_file",
            "arguments": orjson.dumps({"path": "src/app.py", "content": text}).decode(),
        },
    }
    history = [
        {"role": "system", "content": "You edit files."},
        {"role": "user", "content": "Write the app."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_w", "content": "written"},
    ]
    store = MemoryStore()
    result = await Pipeline(store=store).compact(
        {"model": "gpt-4o", "messages": history}, policy=Policy(max_input=4_000)
    )
    assert result.report.tokens_after <= 4_000
    sent = result.request["messages"][2]["tool_calls"][0]
    assert sent["id"] == "call_w"
    arguments = orjson.loads(sent["function"]["arguments"])
    assert arguments["path"] == "src/app.py"
    assert arguments["content"].startswith(text[:200])
    assert arguments["content"].endswith(text[-50:])
    ref = REF.search(arguments["content"]).group()  # type: ignore[union-attr]
    assert orjson.loads(await store.get("", ref)) == [call]  # type: ignore[arg-type]
    assert_valid(result.request["messages"])
    assert_valid_request(result.request)


async def test_arguments_made_of_many_short_values_are_cut_by_structure() -> None:
    """A call whose arguments are a long array of short strings has no long string to
    cut: the array is cut by structure instead, still valid JSON, and the message says
    where the original is."""
    lines = [f"row {i}" for i in range(4_000)]
    call = {
        "id": "call_b",
        "type": "function",
        "function": {"name": "bulk_insert", "arguments": orjson.dumps({"lines": lines}).decode()},
    }
    history = [
        {"role": "user", "content": "Insert the rows."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_b", "content": "inserted"},
    ]
    store = MemoryStore()
    result = await Pipeline(store=store).compact(
        {"model": "gpt-4o", "messages": history}, policy=Policy(max_input=4_000)
    )
    assert result.report.tokens_after <= 4_000
    message = result.request["messages"][1]
    arguments = orjson.loads(message["tool_calls"][0]["function"]["arguments"])
    assert arguments["lines"][:3] == lines[:3]
    assert arguments["lines"][-3:] == lines[-3:]
    ref = REF.search(message["content"]).group()  # type: ignore[union-attr]
    assert orjson.loads(await store.get("", ref)) == [call]  # type: ignore[arg-type]
