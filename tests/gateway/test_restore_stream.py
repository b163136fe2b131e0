"""The streamed restore loop on hand-made streams: the shapes providers really send
(text in the finish chunk, running usage totals, a call's name arriving late, no index)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from gateway.context import restore
from gateway.context.restore import RESTORE_TOOL_NAME, Restorer, with_restore_tool
from gateway.http.sse import event_data
from gateway.store import MemoryStore
from gateway.store.stores import Deadlined
from pipelines import StoreError, TokenCounter

BASE = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}


def chunk(
    delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any
) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {**BASE, "choices": choices, **extra}


async def events(*chunks: dict[str, Any]) -> AsyncIterator[bytes]:
    for item in chunks:
        yield b"data: " + orjson.dumps(item) + b"\n\n"
    yield b"data: [DONE]\n\n"


async def run(rounds: list[list[dict[str, Any]]]) -> tuple[list[dict[str, Any]], int, list[Any]]:
    """Relay ``rounds`` (the first is the answer, the rest answer each resend); the
    chunks the client got, the number of [DONE]s, and what each resend appended."""
    store = MemoryStore()
    ref = await store.put("ns", b"the stored text\n", ttl=60)
    restorer = Restorer(store, "ns", TokenCounter())
    resent: list[Any] = []
    later = iter(rounds[1:])

    async def resend(extra: list[dict[str, Any]]) -> tuple[bytes, AsyncIterator[bytes]]:
        resent.append(extra)
        stream = events(*next(later))
        return await stream.__anext__(), stream

    rounds = [[_with_ref(c, ref) for c in r] for r in rounds]
    first_stream = events(*rounds[0])
    first = await first_stream.__anext__()
    out, done = [], 0
    async for event in restore.stream(first, first_stream, restorer, resend):
        data = event_data(event)
        if data == b"[DONE]":
            done += 1
        else:
            out.append(orjson.loads(data))
    return out, done, resent


def _with_ref(item: dict[str, Any], ref: str) -> dict[str, Any]:
    return orjson.loads(orjson.dumps(item).replace(b"REF", ref.encode()))


def restore_delta(
    index: int | None = 0, name: bool = True, arguments: str = '{"ref": "REF"}'
) -> dict[str, Any]:
    part: dict[str, Any] = {"id": "r1", "type": "function", "function": {"arguments": arguments}}
    if name:
        part["function"]["name"] = RESTORE_TOOL_NAME
    if index is not None:
        part["index"] = index
    return part


def text_of(out: list[dict[str, Any]]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in out if c.get("choices"))


def tool_names(out: list[dict[str, Any]]) -> list[str]:
    return [
        part["function"]["name"]
        for c in out
        for choice in c.get("choices", [])
        for part in choice["delta"].get("tool_calls") or []
        if part.get("function", {}).get("name")
    ]


async def test_text_in_the_finish_chunk_of_a_restore_round_is_not_lost() -> None:
    out, done, resent = await run(
        [
            [chunk({"content": "Let me check. ", "tool_calls": [restore_delta()]}, "tool_calls")],
            [chunk({"content": "Answer."}), chunk({}, "stop")],
        ]
    )
    assert text_of(out) == "Let me check. Answer."
    assert done == 1
    assert [
        c["choices"][0]["finish_reason"]
        for c in out
        if c.get("choices") and c["choices"][0]["finish_reason"]
    ] == ["stop"]
    assert resent[0][-1]["content"] == "the stored text\n"


async def test_running_usage_totals_are_not_added_up_within_a_round() -> None:
    usage = {"prompt_tokens": 100, "completion_tokens": 1, "total_tokens": 101}
    out, _, _ = await run(
        [
            [
                chunk({"content": "a"}, usage=usage),
                chunk({"content": "b"}, usage=usage),
                chunk({}, "stop", usage=usage),
            ],
        ]
    )
    totals = [c["usage"] for c in out if c.get("usage")]
    assert totals == [usage]


async def test_usage_stays_where_the_upstream_put_it() -> None:
    """Usage the upstream put on its finish chunk (unasked, as some providers do) comes back
    on the finish chunk, with no chunk without choices the client did not ask for; usage
    the upstream sent in a chunk of its own (``include_usage``) comes back so."""
    usage = {"prompt_tokens": 100, "completion_tokens": 1, "total_tokens": 101}
    on_finish, _, _ = await run([[chunk({"content": "a"}), chunk({}, "stop", usage=usage)]])
    assert all(c["choices"] for c in on_finish)
    assert on_finish[-1]["usage"] == usage
    assert on_finish[-1]["choices"][0]["finish_reason"] == "stop"
    apart, _, _ = await run([[chunk({"content": "a"}), chunk({}, "stop"), chunk(usage=usage)]])
    assert apart[-1] == {**BASE, "choices": [], "usage": usage}


async def test_a_call_whose_name_comes_late_is_still_recognised() -> None:
    out, _, resent = await run(
        [
            [
                chunk(
                    {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "r1",
                                "type": "function",
                                "function": {"arguments": ""},
                            }
                        ]
                    }
                ),
                chunk(
                    {
                        "tool_calls": [
                            {
                                "index": 0,
                                "function": {
                                    "name": RESTORE_TOOL_NAME,
                                    "arguments": '{"ref": "REF"}',
                                },
                            }
                        ]
                    }
                ),
                chunk({}, "tool_calls"),
            ],
            [chunk({"content": "Done."}), chunk({}, "stop")],
        ]
    )
    assert RESTORE_TOOL_NAME not in tool_names(out)
    assert not any(c["choices"][0]["delta"].get("tool_calls") for c in out if c.get("choices"))
    assert text_of(out) == "Done."
    assert len(resent) == 1


async def test_calls_without_an_index_are_kept_apart() -> None:
    client_call = {
        "id": "k1",
        "type": "function",
        "function": {"name": "search", "arguments": "{}"},
    }
    out, _, resent = await run(
        [
            [chunk({"tool_calls": [client_call, restore_delta(index=None)]}, "tool_calls")],
        ]
    )
    assert tool_names(out) == ["search"]
    assert resent == []  # a client call is in the answer: it goes to the client


def test_several_choices_get_no_restore_tool() -> None:
    assert with_restore_tool({"model": "m", "messages": [], "n": 2}) is None
    assert with_restore_tool({"model": "m", "messages": [], "n": 1}) is not None


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


async def test_a_slow_store_costs_a_request_at_most_its_deadline() -> None:
    class Slow(MemoryStore):
        async def put(self, namespace: str, content: bytes, *, ttl: int) -> str:
            import asyncio

            await asyncio.sleep(0.1)
            return await super().put(namespace, content, ttl=ttl)

    store = Deadlined(Slow(), 0.25)
    started = time.monotonic()
    stored = failed = 0
    for n in range(10):
        try:
            await store.put("ns", f"object {n}".encode(), ttl=60)
            stored += 1
        except StoreError:
            failed += 1
    assert time.monotonic() - started < 0.4
    assert stored == 2
    assert failed == 8


async def test_only_time_in_the_store_counts_against_its_deadline() -> None:
    """A request that waits for something else (a summary made on the spot) still has
    its store time afterwards."""
    import asyncio

    store = Deadlined(MemoryStore(), 0.05)
    await asyncio.sleep(0.1)
    ref = await store.put("ns", b"after waiting for a summary", ttl=60)
    assert await store.get("ns", ref) == b"after waiting for a summary"


@pytest.mark.parametrize("value", ["²", "9" * 5_000, "-1", "0"])
def test_odd_line_numbers_are_refused(value: str) -> None:
    from gateway.errors import InvalidRequest
    from gateway.routes.objects import _line_param

    with pytest.raises(InvalidRequest):
        _line_param(value, "start_line")
