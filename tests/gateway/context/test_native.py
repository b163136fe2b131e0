"""gateway.context.native: which of honour, polyfill or nothing a request's
``context_management`` gets, the policy stepped back from it, and the answer's account of
the edits the gateway applied (a message or completion, a Messages stream, a chat
stream); with the app in process for the chat route's polyfill to Claude and to an
OpenAI-compatible model."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any

import httpx
import httpx2
import orjson
import pytest

from gateway.context.native import (
    FIELD,
    applied_chunks,
    applied_events,
    plan,
    planned_policy,
    with_applied_edits,
    without_field,
)
from gateway.errors import InvalidRequest
from pipelines import Policy
from pipelines.native import CLEAR_TOOL_USES, COMPACT, NativeEdits, NativePlan, parse_edits
from tests.in_process import in_process
from tests.mock_upstream import chat_completion, events_of

CLEAR: dict[str, Any] = {
    "edits": [
        {
            "type": CLEAR_TOOL_USES,
            "trigger": {"type": "tool_uses", "value": 2},
            "keep": {"type": "tool_uses", "value": 1},
        }
    ]
}
INVALID: dict[str, Any] = {
    "edits": [{"type": CLEAR_TOOL_USES, "keep": {"type": "tool_uses", "value": -1}}]
}
APPLIED = [{"type": CLEAR_TOOL_USES, "cleared_tool_uses": 3, "cleared_input_tokens": 1_234}]


def body(management: Any = CLEAR) -> dict[str, Any]:
    request: dict[str, Any] = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Hi"}]}
    if management is not None:
        request[FIELD] = management
    return request


# -- plan -----------------------------------------------------------------------------------


def test_no_field_or_policy_off_means_no_plan() -> None:
    """A request without context_management, or under native=off, gets no plan at all."""
    assert plan(body(None), Policy(), upstream_applies=False, upstream="x") is None
    for applies in (False, True):
        assert plan(body(), Policy(native="off"), upstream_applies=applies, upstream="x") is None


def test_an_upstream_that_applies_the_edits_is_left_to_apply_them() -> None:
    """When the upstream applies them, the plan honours them and says why."""
    got = plan(body(), Policy(), upstream_applies=True, upstream="Anthropic")
    assert got is not None
    assert got.mode == "honour"
    assert not got.polyfilled
    assert got.edits == parse_edits(CLEAR)
    assert "Anthropic" in got.reason


def test_an_upstream_that_cannot_gets_the_gateways_polyfill() -> None:
    """Elsewhere the gateway applies them itself."""
    got = plan(body(), Policy(native="prefer"), upstream_applies=False, upstream="the upstream")
    assert got is not None
    assert got.mode == "polyfill"
    assert got.polyfilled
    assert got.edits.clear_tool_uses is not None
    assert got.edits.clear_tool_uses.keep == 1
    assert got.reason


def test_an_invalid_edit_is_a_400_on_the_polyfill_path_only() -> None:
    """What the API would refuse is refused by the gateway, naming the field, when the
    gateway applies it; an upstream that applies it is left to refuse it itself."""
    with pytest.raises(InvalidRequest) as refused:
        plan(body(INVALID), Policy(), upstream_applies=False, upstream="x")
    assert refused.value.status == 400
    assert refused.value.type == "invalid_request_error"
    assert refused.value.param == "context_management.edits.0.keep.value"
    assert "context_management.edits.0.keep.value" in refused.value.message
    assert plan(body(INVALID), Policy(), upstream_applies=True, upstream="Anthropic") is None


# -- planned_policy -------------------------------------------------------------------------


def test_no_plan_leaves_the_policy() -> None:
    policy = Policy(trigger=0.6)
    assert planned_policy(policy, None, blocks=True) is policy


def test_tool_clearing_asked_stops_the_filter() -> None:
    """A plan that clears tool uses steps the filter and the prunes back."""
    native = NativePlan("polyfill", parse_edits(CLEAR), "r")
    got = planned_policy(Policy(), native, blocks=False)
    assert (got.filter_tokens, got.soft_ratio, got.hard_ratio) == (1_000_000, 1.0, 1.0)


def test_compaction_for_a_client_that_takes_blocks_waits_for_the_edge() -> None:
    """A Messages client asking for compaction: the gateway's own waits for emergency."""
    native = NativePlan(
        "polyfill", NativeEdits(compact=parse_edits({"edits": [{"type": COMPACT}]}).compact), "r"
    )
    policy = Policy()
    got = planned_policy(policy, native, blocks=True)
    assert (got.prepare, got.light, got.trigger) == (policy.emergency,) * 3
    assert got.max_input is None


def test_compaction_for_a_chat_client_is_the_gateways_from_the_clients_trigger() -> None:
    """A chat client (no compaction blocks) asking for compaction from 60,000 tokens gets
    the gateway's own compaction from there: the budget capped so that the policy's
    trigger falls at 60,000; a tighter cap of the policy's own stays."""
    management = {
        "edits": [{"type": COMPACT, "trigger": {"type": "input_tokens", "value": 60_000}}]
    }
    native = NativePlan("polyfill", parse_edits(management), "r")
    policy = Policy()
    got = planned_policy(policy, native, blocks=False)
    assert got.max_input == math.ceil(60_000 / policy.trigger)
    assert got.trigger == policy.trigger
    tight = planned_policy(Policy(max_input=50_000), native, blocks=False)
    assert tight.max_input == 50_000


# -- the field and the answer ---------------------------------------------------------------


def test_without_field_drops_only_the_field() -> None:
    """The field is dropped for an upstream that has none; a request without it is the
    same object."""
    request = body()
    assert without_field(request) == body(None)
    assert FIELD in request
    plain = body(None)
    assert without_field(plain) is plain


def test_an_answer_gets_the_applied_edits() -> None:
    """A message or completion gets context_management.applied_edits; everything else
    in it stays."""
    completion = chat_completion("Hello")
    got = orjson.loads(with_applied_edits(orjson.dumps(completion), APPLIED))
    assert got == {**completion, FIELD: {"applied_edits": APPLIED}}


@pytest.mark.parametrize("data", [b'{"id": "x"}', b"not json", b"[1, 2]", b'"text"'])
def test_no_edits_or_no_object_leaves_the_answer_as_it_came(data: bytes) -> None:
    """Without edits, or with a body that is not a JSON object, the bytes are unchanged."""
    assert with_applied_edits(data, []) is data
    if data != b'{"id": "x"}':
        assert with_applied_edits(data, APPLIED) == data


async def collect(events: AsyncIterator[bytes]) -> list[bytes]:
    return [event async for event in events]


async def stream_of(events: list[bytes]) -> AsyncIterator[bytes]:
    for event in events:
        yield event


def sse(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


MESSAGE_EVENTS = [
    sse("message_start", {"type": "message_start", "message": {"id": "msg_1", "content": []}}),
    sse(
        "content_block_delta",
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": "a message_delta in the text"},
        },
    ),
    sse(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": 3},
        },
    ),
    sse("message_stop", {"type": "message_stop"}),
]


async def test_a_messages_stream_carries_the_edits_in_message_delta() -> None:
    """Only the message_delta event changes: it carries the edits, its other fields
    kept; an event that merely mentions message_delta is left as it came."""
    got = await collect(applied_events(stream_of(MESSAGE_EVENTS), APPLIED))
    assert len(got) == 4
    assert [got[0], got[1], got[3]] == [MESSAGE_EVENTS[0], MESSAGE_EVENTS[1], MESSAGE_EVENTS[3]]
    assert got[2].startswith(b"event: message_delta\ndata: ")
    data = orjson.loads(got[2].split(b"data: ", 1)[1])
    assert data == {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn"},
        "usage": {"output_tokens": 3},
        FIELD: {"applied_edits": APPLIED},
    }
    unchanged = await collect(applied_events(stream_of(MESSAGE_EVENTS), []))
    assert unchanged == MESSAGE_EVENTS


def chunk(content: str | None, finish: str | None = None) -> dict[str, Any]:
    delta = {"content": content} if content is not None else {}
    return {
        "id": "chatcmpl-7",
        "object": "chat.completion.chunk",
        "created": 17,
        "model": "gpt-4o-2024-08-06",
        "system_fingerprint": "fp_1",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


async def test_a_chat_stream_ends_with_a_chunk_carrying_the_edits() -> None:
    """A chunk with no choices and the edits goes right before [DONE], named as the
    stream's first chunk; the chunks before it are as they came."""
    events = events_of([chunk("Hel"), chunk("lo"), chunk(None, "stop")])
    got = await collect(applied_chunks(stream_of(events), APPLIED))
    assert got[:3] == events[:3]
    assert got[-1] == events[-1]
    assert got[-1].strip() == b"data: [DONE]"
    assert len(got) == len(events) + 1
    last = orjson.loads(got[-2].removeprefix(b"data: "))
    assert last == {
        "id": "chatcmpl-7",
        "object": "chat.completion.chunk",
        "created": 17,
        "model": "gpt-4o-2024-08-06",
        "choices": [],
        FIELD: {"applied_edits": APPLIED},
    }
    assert await collect(applied_chunks(stream_of(events), [])) == events


# -- in process: the chat route ---------------------------------------------------------------


def chat_history() -> list[Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Why did it fail?"}]
    for i in range(4):
        call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "read", "arguments": "{}"},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        text = "".join(f"log {i}.{j}: retry {j} after {j * 13} ms\n" for j in range(80))
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": text})
    messages.append({"role": "user", "content": "Well?"})
    return messages


CLAUDE_ANSWER: dict[str, Any] = {
    "id": "msg_01",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-6",
    "content": [{"type": "text", "text": "A timeout."}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 20, "output_tokens": 3},
}


async def test_chat_to_claude_is_polyfilled_too() -> None:
    """The chat API has no context_management, so a chat request to Claude is cleared by
    the gateway: Anthropic gets the placeholders, no field and no beta for it, and the
    completion reports the edit."""
    async with in_process(anthropic=lambda _: httpx2.Response(200, json=CLAUDE_ANSWER)) as app:
        completion = await app.openai().chat.completions.create(
            model="claude-sonnet-4-6", messages=chat_history(), extra_body={FIELD: CLEAR}
        )
        (sent,) = app.anthropic_received
    extra = completion.model_extra or {}
    assert extra[FIELD]["applied_edits"][0]["cleared_tool_uses"] == 3
    assert completion.choices[0].message.content == "A timeout."
    request = orjson.loads(sent.content)
    assert FIELD not in request
    assert "context-management" not in sent.headers.get("anthropic-beta", "")
    results = [
        block["content"]
        for turn in request["messages"]
        if isinstance(turn["content"], list)
        for block in turn["content"]
        if block["type"] == "tool_result"
    ]
    texts = [r if isinstance(r, str) else orjson.dumps(r).decode() for r in results]
    assert [t.startswith("[Tool result of read cleared") for t in texts] == [
        True,
        True,
        True,
        False,
    ]


async def test_chat_under_native_off_sends_the_field_as_it_came() -> None:
    """Under native=off the gateway neither applies nor removes the edits: the field goes
    up as the client sent it and the completion reports nothing."""
    async with in_process(lambda _: httpx.Response(200, json=chat_completion("ok"))) as app:
        completion = await app.openai().chat.completions.create(
            model="gpt-4o",
            messages=chat_history(),
            extra_body={FIELD: CLEAR},
            extra_headers={"x-contextgate-policy": "native=off"},
        )
        (sent,) = app.received
    assert FIELD not in (completion.model_extra or {})
    request = orjson.loads(sent.content)
    assert request[FIELD] == CLEAR
    assert [m["content"] for m in request["messages"]] == [m["content"] for m in chat_history()]


def test_only_the_claude_models_that_compact_are_asked_to() -> None:
    """``native=prefer`` asks Anthropic's compaction of Opus and Sonnet from 4.6 and of
    every 5.x, dated or not; never of 4.0 (whose dated ids hold a 20...), 4.5 or Haiku 4.5."""
    from gateway.context.native import compacts_server_side

    yes = ["claude-opus-4-6", "claude-sonnet-4-6-20260201", "claude-opus-4-10", "claude-opus-5-5"]
    no = [
        "claude-sonnet-4-20250514",
        "claude-opus-4-20250514",
        "claude-sonnet-4-5-20250929",
        "claude-haiku-4-5",
        "gpt-4o",
    ]
    assert [m for m in yes if compacts_server_side(m)] == yes
    assert [m for m in no if compacts_server_side(m)] == []
