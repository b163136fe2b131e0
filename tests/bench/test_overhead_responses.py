"""bench.overhead_responses: the requests it sends on each route, how it times a stream's
events, and its mock's answers (bench.responses_upstream), against the mock in-thread."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
from websockets.asyncio.client import connect

from bench.overhead_responses import (
    COMPLETED,
    KINDS,
    Figures,
    Paths,
    Size,
    Timings,
    ended,
    figures,
    table,
)
from bench.responses_upstream import Answers
from tests.mock_upstream import MockUpstream

HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": "You are an airline agent."},
    {"role": "user", "content": "Cancel my booking."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_reservation", "arguments": '{"id": "X1"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "name": "get_reservation", "content": '{"ok": 1}'},
    {"role": "assistant", "content": "It is cancelled."},
]


def test_the_responses_form_carries_the_history_without_reasoning() -> None:
    """The system prompt as instructions; the user message, the call, its output and the
    answer as items; no reasoning item (the chat history has none to match it)."""
    body = Size("h", "gpt-4o", HISTORY, numbered=False).responses(0)
    assert body["instructions"] == "You are an airline agent."
    assert [item["type"] for item in body["input"]] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]
    call, output = body["input"][1], body["input"][2]
    assert call["call_id"] == output["call_id"] == "c1"
    assert call["arguments"] == '{"id": "X1"}'
    assert output["output"] == '{"ok": 1}'
    assert body["input"][3]["role"] == "assistant"


def test_each_kind_sends_the_same_history_and_a_numbered_size_a_new_turn() -> None:
    """Five bodies a round; a numbered size ends both forms with that round's turn, an
    unnumbered one sends the same bytes every round."""
    numbered = Size("n", "gpt-4.1", HISTORY, numbered=True)
    first, second = numbered.bodies(1), numbered.bodies(2)
    assert set(first) == set(KINDS)
    chat = orjson.loads(first["chat"])
    assert chat["messages"][:-1] == HISTORY
    assert chat["messages"][-1]["content"].endswith("number 1?")
    assert chat["stream"] is False
    assert orjson.loads(first["chat_stream"])["stream"] is True
    create = orjson.loads(first["socket"])
    assert create["type"] == "response.create"
    assert "stream" not in create
    assert create["input"][-1]["content"][0]["text"].endswith("number 1?")
    assert orjson.loads(first["responses_stream"])["stream"] is True
    assert first["responses"] != second["responses"]
    plain = Size("p", "gpt-4o", HISTORY, numbered=False)
    assert plain.bodies(1) == plain.bodies(2)


def test_events_are_counted_across_chunk_boundaries() -> None:
    """An event split over two chunks ends once, in the second; two in one chunk end
    together."""
    count, pending = ended(b"", b"data: {1}\n\ndata: {")
    assert (count, pending) == (1, b"data: {")
    count, pending = ended(pending, b"2}\n\ndata: {3}\n\n")
    assert (count, pending) == (2, b"")


def test_overhead_is_the_difference_of_the_medians_event_by_event() -> None:
    timings = Timings()
    for times in ([1.0, 5.0], [2.0, 6.0], [3.0, 7.0]):
        timings.add("chat_stream", "direct", times)
    for times in ([2.0, 7.0], [3.0, 8.0], [4.0, 9.0]):
        timings.add("chat_stream", "gateway", times)
    found = figures(timings, "chat_stream")
    assert found.first == (2.0, 3.0)
    assert found.last == (6.0, 8.0)
    assert found.added_first == 1.0
    assert found.added_last == 2.0
    assert found.per_event == 1.5
    timings.add("chat_stream", "gateway", [1.0])
    with pytest.raises(RuntimeError):
        figures(timings, "chat_stream")


def test_the_table_compares_each_responses_figure_with_the_chat_one() -> None:
    """A ratio per row, from the runs' medians; over 1.10 misses the target."""
    json_chat = Figures((1.0, 3.0), (1.0, 3.0), 2.0, 1)
    json_responses = Figures((1.0, 3.1), (1.0, 3.1), 2.1, 1)
    stream = Figures((1.0, 2.0), (40.0, 41.0), 1.0, 34)
    slow = Figures((1.0, 3.0), (40.0, 43.0), 2.5, 34)
    run = {
        "h": {
            "chat": json_chat,
            "responses": json_responses,
            "chat_stream": stream,
            "responses_stream": stream,
            "socket": slow,
        }
    }
    rows = table([run, run])
    assert len(rows) == 2 + 7
    assert "| h | HTTP JSON | whole answer | 1.00 | 2.00 | 1.00 | 2.10 | **1.05** |" in rows[2]
    assert rows[2].endswith("| 1.05, 1.05 | yes |")
    assert "**2.00**" in rows[6]
    assert rows[6].endswith("| no |")


async def test_every_path_is_timed_against_the_mock() -> None:
    """Against the bench's mock in-thread: a JSON answer is one time; each stream's 34
    events are timed in order, the WebSocket's up to ``response.completed``."""
    answers = Answers()
    assert len(answers.chat_stream.events) == 34
    assert len(answers.response_stream.events) == 34
    last = answers.socket.events[-1]
    assert isinstance(last, bytes)
    assert last.startswith(COMPLETED.encode())
    bodies = Size("h", "gpt-4o", HISTORY, numbered=False).bodies(0)
    with MockUpstream(record=False) as mock:
        mock.handler = answers
        async with (
            httpx.AsyncClient() as client,
            connect(mock.ws_url, compression=None, max_size=None, proxy=None) as socket,
        ):
            paths = Paths(client, {"direct": mock.base_url}, {"direct": socket})
            for kind in KINDS:
                times = await paths.send(kind, "direct", bodies[kind])
                assert len(times) == (1 if kind in ("chat", "responses") else 34), kind
                assert times == sorted(times)
