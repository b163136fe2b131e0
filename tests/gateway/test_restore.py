"""Answering one restore call: whole when small, in line ranges when large, and clear
answers for bad arguments, unknown refs and an unavailable store."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest

from gateway.restore import RESTORE_TOKENS, Restorer, add_usage, with_restore_tool
from gateway.store import MemoryStore
from pipelines import StoreError, TokenCounter
from tests.pipelines.stages.conftest import FailingStore

BIG = "".join(
    f"line {i}: flight HAT{i:03d} departs 08:{i % 60:02d}, gate B{i % 20}\n" for i in range(2_000)
)


def call(**arguments: Any) -> dict[str, Any]:
    return {
        "id": "r1",
        "type": "function",
        "function": {"name": "context_restore", "arguments": orjson.dumps(arguments).decode()},
    }


async def restorer_with(content: str) -> tuple[Restorer, str]:
    store = MemoryStore()
    ref = await store.put("ns", content.encode(), ttl=60)
    return Restorer(store, "ns", TokenCounter()), ref


async def test_a_large_object_comes_in_ranges_within_the_budget() -> None:
    restorer, ref = await restorer_with(BIG)
    counter = TokenCounter()
    first = (await restorer.answer(call(ref=ref)))["content"]
    header, body = first.split("\n", 1)
    assert header.startswith(f"[{ref}: lines 1-")
    assert "of 2000. Call again with start_line=" in header
    assert counter.count_text(body) <= RESTORE_TOKENS
    assert BIG.startswith(body)
    shown = body.count("\n")
    lines = BIG.splitlines(keepends=True)
    following = (await restorer.answer(call(ref=ref, start_line=shown + 1)))["content"]
    assert following.startswith(f"[{ref}: lines {shown + 1}-")
    assert following.split("\n", 1)[1].startswith(lines[shown])
    exact = (await restorer.answer(call(ref=ref, start_line=5, end_line=6)))["content"]
    assert exact == (
        f"[{ref}: lines 5-6 of 2000. Call again with start_line=7 for more.]\n"
        + "".join(lines[4:6])
    )
    small, ref = await restorer_with("just this\n")
    assert (await small.answer(call(ref=ref)))["content"] == "just this\n"


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ("not json", "not valid JSON"),
        ('{"ref": "nope"}', "pass the ref"),
        ('{"ref": "ctx_AAAAAAAAAAAAAAAAAAAAAAAA"}', "nothing is stored"),
        ('{"ref": "%s", "start_line": 0}', "whole numbers"),
        ('{"ref": "%s", "start_line": 5000}', "are not in it"),
        ('{"ref": "%s", "start_line": true}', "whole numbers"),
    ],
)
async def test_bad_calls_get_an_answer_the_model_can_act_on(arguments: str, says: str) -> None:
    restorer, ref = await restorer_with(BIG)
    bad = {
        "id": "r1",
        "type": "function",
        "function": {"name": "context_restore", "arguments": arguments.replace("%s", ref)},
    }
    assert says in (await restorer.answer(bad))["content"]


async def test_an_unavailable_store_is_said_so() -> None:
    class Down(FailingStore):
        async def get(self, namespace: str, ref: str) -> bytes | None:
            raise StoreError("down")

    restorer = Restorer(Down(), "ns", TokenCounter())
    content = (await restorer.answer(call(ref="ctx_" + "A" * 24)))["content"]
    assert "unavailable" in content


def test_the_tool_is_appended_and_never_doubled() -> None:
    mine = {"type": "function", "function": {"name": "search"}}
    request = {"model": "m", "messages": [], "tools": [mine]}
    tooled = with_restore_tool(request)
    assert tooled is not None
    assert [t["function"]["name"] for t in tooled["tools"]] == ["search", "context_restore"]
    assert with_restore_tool(tooled) is None
    assert with_restore_tool({"model": "m", "messages": [], "functions": [{"name": "f"}]}) is None


def test_usage_adds_up_field_by_field() -> None:
    one = {
        "prompt_tokens": 10,
        "completion_tokens": 2,
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    two = {
        "prompt_tokens": 30,
        "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 20},
    }
    total = add_usage(add_usage(None, one), two)
    assert total == {
        "prompt_tokens": 40,
        "completion_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 24},
    }
    assert one["prompt_tokens"] == 10  # inputs untouched


async def test_a_200_kb_output_comes_back_exactly_range_by_range() -> None:
    """Following the "call again with start_line" hints until the end gives back the
    original bytes exactly."""
    output = "".join(
        f"{i:06d} event=checkout status=ok latency_ms={i % 700}\n" for i in range(4_500)
    )
    assert len(output) > 200_000
    restorer, ref = await restorer_with(output)
    pieces, start, calls = [], 1, 0
    while True:
        answer = (await restorer.answer(call(ref=ref, start_line=start)))["content"]
        calls += 1
        header, body = answer.split("\n", 1)
        pieces.append(body)
        found = re.search(r"start_line=(\d+)", header)
        if found is None:
            break
        start = int(found.group(1))
    assert "".join(pieces) == output
    assert calls > 10


async def test_a_restored_image_is_given_back_as_an_image() -> None:
    part = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    restorer, ref = await restorer_with(orjson.dumps(part).decode())
    messages = await restorer.answer_all([call(ref=ref)])
    assert messages[0]["role"] == "tool"
    assert "follows in the next message" in messages[0]["content"]
    assert messages[1]["role"] == "user"
    assert messages[1]["content"][1] == part
