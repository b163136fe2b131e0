"""Answering one restore call: whole when small, in line ranges when large, media as the
part it was (OpenAI or Anthropic form), and clear answers for bad arguments, unknown refs
and an unavailable store; the calls of one round sharing the room left."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest

from gateway.codecs.chat_anthropic import to_messages
from gateway.context.restore import (
    RESTORE_TOKENS,
    RESTORE_TOOL_NAME,
    Restorer,
)
from gateway.store import MemoryStore
from pipelines import Pipeline, Policy, StoreError, TokenCounter
from pipelines.stages.media import Media
from tests.gateway.context.restore.samples import DOCUMENT, PDF, PNG, spec_and_screenshots
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


async def test_an_offloaded_pdf_document_is_restored_as_a_document() -> None:
    """A PDF the media stage took out of an older message comes back, when restored, as
    the document block it was (in the turn Claude is asked with), not as its JSON."""
    store = MemoryStore()
    messages = spec_and_screenshots()
    request = {"model": "claude-sonnet-4", "messages": messages}
    result = await Pipeline(stages=[Media()], store=store).compact(request, policy=Policy())
    placeholder = result.request["messages"][0]["content"][0]["text"]
    found = re.search(r"ctx_[A-Za-z0-9_-]{22,}", placeholder)
    assert found is not None
    restorer = Restorer(store, "", TokenCounter())
    answers = await restorer.answer_all([call(ref=found.group())])
    assert "is a document part" in answers[0]["content"]
    assert answers[1]["content"][1] == DOCUMENT
    turn = to_messages({"messages": answers})["messages"][0]["content"]
    assert turn[-1] == DOCUMENT


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        # The payload before the type, and longer than a first glance at the bytes.
        {"source": {"data": PDF * 10, "media_type": "application/pdf", "type": "base64"}}
        | {"type": "document", "cache_control": {"type": "ephemeral"}},
        {"type": "file", "file": {"file_data": f"data:application/pdf;base64,{PDF}"}},
    ],
)
async def test_a_stored_media_part_in_either_form_is_restored_as_media(
    part: dict[str, Any],
) -> None:
    """Anthropic image and document blocks and OpenAI file parts, whatever the order of
    their keys, come back as the part, not as text."""
    restorer, ref = await restorer_with(orjson.dumps(part).decode())
    messages = await restorer.answer_all([call(ref=ref)])
    assert messages[1]["content"][1] == part


async def test_a_tool_output_that_only_looks_like_a_document_comes_back_as_text() -> None:
    """A search tool's JSON result with a ``document`` type is text the model reads."""
    hit = '{"type": "document", "source": "wikipedia", "title": "Oslo", "text": "Oslo is..."}'
    restorer, ref = await restorer_with(hit)
    messages = await restorer.answer_all([call(ref=ref)])
    assert messages == [{"role": "tool", "tool_call_id": "r1", "content": hit}]


async def test_a_round_shares_what_room_is_left() -> None:
    store = MemoryStore()
    text = "".join(f"line {i}: a fairly ordinary log line with some words\n" for i in range(500))
    refs = [await store.put("ns", f"{n}\n{text}".encode(), ttl=60) for n in range(4)]
    counter = TokenCounter()
    restorer = Restorer(store, "ns", counter, room=800)
    calls = [
        {
            "id": f"r{n}",
            "type": "function",
            "function": {
                "name": RESTORE_TOOL_NAME,
                "arguments": orjson.dumps({"ref": ref}).decode(),
            },
        }
        for n, ref in enumerate(refs)
    ]
    answers = await restorer.answer_all(calls)
    assert sum(counter.count_text(m["content"]) for m in answers) <= 800 + 4 * 60


async def test_a_single_long_line_comes_back_whole_piece_by_piece() -> None:
    line = orjson.dumps(
        {"rows": [{"id": i, "name": f"passenger {i}"} for i in range(4_000)]}
    ).decode()
    store = MemoryStore()
    ref = await store.put("ns", line.encode(), ttl=60)
    restorer = Restorer(store, "ns", TokenCounter())
    pieces, arguments = [], {"ref": ref}
    for _ in range(200):
        call = {
            "id": "r",
            "type": "function",
            "function": {"name": RESTORE_TOOL_NAME, "arguments": orjson.dumps(arguments).decode()},
        }
        answer = (await restorer.answer(call))["content"]
        header, body = answer.split("\n", 1)
        pieces.append(body)
        if "start_char=" not in header:
            break
        arguments = {
            "ref": ref,
            "start_line": 1,
            "start_char": int(header.rsplit("start_char=", 1)[1].split()[0]),
        }
    assert "".join(pieces) == line
