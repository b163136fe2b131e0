"""Anthropic's server-side context management as ``tests.anthropic_edits`` applies it, and
as the mock Claude (``tests.mock_models.ClaudeModel``) plays it: edits refused without
their beta, applied before the model reads the request, reported in the answer (whole and
streamed) in shapes the anthropic SDK's beta types parse, and a compaction the client sends
back taking the place of what came before it."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from typing import Any

import anthropic
import orjson
import pydantic
import pytest
from anthropic.types.beta import BetaMessage, BetaMessageTokensCount, BetaRawMessageStreamEvent

from tests.anthropic_edits import (
    COMPACT_BETA,
    CONTEXT_MANAGEMENT_BETA,
    PLACEHOLDER,
    apply_edits,
    drop_before_compaction,
    json_tokens,
)
from tests.mock_models import ClaudeModel
from tests.mock_upstream import JSONReply, MockUpstream, Received, SSEReply

STREAM_EVENT: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(BetaRawMessageStreamEvent)
MODEL = "claude-sonnet-4-6"


def chars(value: Any) -> int:
    """A counter a test can do sums with: one token per character of JSON."""
    return len(orjson.dumps(value))


def conversation(uses: Sequence[str], request: str = "Look around.") -> list[dict[str, Any]]:
    """A user request, then one tool use of each named tool and its result, in turns."""
    turns: list[dict[str, Any]] = [{"role": "user", "content": request}]
    for number, name in enumerate(uses):
        use = {"type": "tool_use", "id": f"toolu_{number}", "name": name}
        turns.append({"role": "assistant", "content": [use | {"input": {"n": number}}]})
        result = {"type": "tool_result", "tool_use_id": f"toolu_{number}"}
        turns.append({"role": "user", "content": [result | {"content": f"output {number}" * 20}]})
    return turns


def body_of(messages: list[dict[str, Any]], *edits: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": 1024,
        "messages": messages,
        "context_management": {"edits": list(edits)},
    }


def results(messages: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {
        block["tool_use_id"]: block["content"]
        for turn in messages
        if isinstance(turn["content"], list)
        for block in turn["content"]
        if block["type"] == "tool_result"
    }


def inputs(messages: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {
        block["id"]: block["input"]
        for turn in messages
        if isinstance(turn["content"], list)
        for block in turn["content"]
        if block["type"] == "tool_use"
    }


def thinking_turn(number: int) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": f"Thought {number}.", "signature": f"sig{number}"},
            {"type": "redacted_thinking", "data": f"secret{number}"},
            {"type": "text", "text": f"Answer {number}."},
        ],
    }


def compaction(summary: str | None) -> dict[str, Any]:
    return {"type": "compaction", "content": summary, "encrypted_content": "opaque"}


# -- the rules -------------------------------------------------------------------------------


def test_clearing_keeps_the_latest_uses_and_the_excluded_tools() -> None:
    messages = conversation(["Bash", "Read", "Bash", "Grep", "Bash", "Bash"])
    body = body_of(
        messages,
        {
            "type": "clear_tool_uses_20250919",
            "trigger": {"type": "tool_uses", "value": 5},
            "keep": {"type": "tool_uses", "value": 2},
            "exclude_tools": ["Read"],
            "clear_tool_inputs": ["Bash"],
        },
    )
    sent = copy.deepcopy(body)
    applied = apply_edits(body, chars)
    assert body == sent  # the request is left as it came
    assert applied.cleared_tool_use_ids == ["toolu_0", "toolu_2", "toolu_3"]
    after, before = results(applied.messages), results(messages)
    assert [after[f"toolu_{n}"] == PLACEHOLDER for n in range(6)] == [
        True,
        False,
        True,
        True,
        False,
        False,
    ]
    # Only Bash's inputs are cleared, and only those of the uses cleared.
    assert inputs(applied.messages) == {
        "toolu_0": {},
        "toolu_1": {"n": 1},
        "toolu_2": {},
        "toolu_3": {"n": 3},
        "toolu_4": {"n": 4},
        "toolu_5": {"n": 5},
    }
    saved = sum(len(orjson.dumps(before[f"toolu_{n}"])) for n in (0, 2, 3))
    saved -= 3 * len(orjson.dumps(PLACEHOLDER))
    saved += 2 * (len(orjson.dumps({"n": 0})) - len(orjson.dumps({})))
    assert applied.applied_edits == [
        {"type": "clear_tool_uses_20250919", "cleared_tool_uses": 3, "cleared_input_tokens": saved}
    ]


def test_clearing_waits_for_its_trigger_and_for_enough_to_clear() -> None:
    messages = conversation(["Bash"] * 5)
    tokens = apply_edits(body_of(messages), chars).input_tokens
    at_trigger = {"type": "input_tokens", "value": tokens}
    edit = {"type": "clear_tool_uses_20250919", "trigger": at_trigger}
    assert apply_edits(body_of(messages, edit), chars).applied_edits == []  # not over it
    over = edit | {"trigger": {"type": "input_tokens", "value": tokens - 1}}
    done = apply_edits(body_of(messages, over), chars)
    assert done.cleared_tool_use_ids == ["toolu_0", "toolu_1"]  # all but the default 3
    saved = done.applied_edits[0]["cleared_input_tokens"]
    assert done.input_tokens == tokens - saved
    enough = over | {"clear_at_least": {"type": "input_tokens", "value": saved}}
    assert apply_edits(body_of(messages, enough), chars).applied_edits == done.applied_edits
    too_much = over | {"clear_at_least": {"type": "input_tokens", "value": saved + 1}}
    kept = apply_edits(body_of(messages, too_much), chars)
    assert (kept.applied_edits, kept.messages) == ([], messages)
    # The default trigger, 100,000 input tokens, is far off; every input goes with true.
    default = apply_edits(body_of(messages, {"type": "clear_tool_uses_20250919"}))
    assert default.applied_edits == []
    everything = over | {"keep": {"type": "tool_uses", "value": 0}, "clear_tool_inputs": True}
    cleared = apply_edits(body_of(messages, everything), chars).messages
    assert set(results(cleared).values()) == {PLACEHOLDER}
    assert list(inputs(cleared).values()) == [{}] * 5


def test_thinking_is_kept_for_the_latest_turns() -> None:
    messages = [{"role": "user", "content": "Hi."}]
    for number in range(3):
        messages += [thinking_turn(number), {"role": "user", "content": f"More {number}."}]

    def thinking_left(keep: Any) -> list[int]:
        edit = {"type": "clear_thinking_20251015"} | ({} if keep is None else {"keep": keep})
        applied = apply_edits(body_of(messages, edit), chars)
        return [
            sum(b["type"] in ("thinking", "redacted_thinking") for b in turn["content"])
            for turn in applied.messages
            if turn["role"] == "assistant"
        ]

    assert thinking_left(None) == [0, 0, 2]  # the default keeps one turn's
    assert thinking_left({"type": "thinking_turns", "value": 2}) == [0, 2, 2]
    assert thinking_left({"type": "thinking_turns", "value": 0}) == [0, 0, 0]
    assert thinking_left("all") == thinking_left({"type": "all"}) == [2, 2, 2]
    edit = {"type": "clear_thinking_20251015"}
    applied = apply_edits(body_of(messages, edit), chars)
    saved = sum(chars(messages[i]) - chars(applied.messages[i]) for i in (1, 3))
    assert applied.applied_edits == [
        {
            "type": "clear_thinking_20251015",
            "cleared_thinking_turns": 2,
            "cleared_input_tokens": saved,
        }
    ]
    keep_all = body_of(messages, {"type": "clear_thinking_20251015", "keep": "all"})
    assert apply_edits(keep_all).applied_edits == []  # Claude Code's: nothing cleared


def test_compaction_is_due_over_its_trigger_and_pauses_when_asked() -> None:
    messages = conversation(["Bash"] * 3)
    tokens = json_tokens({"messages": messages})
    edit: dict[str, Any] = {"type": "compact_20260112"}
    assert not apply_edits(body_of(messages, edit)).compaction_due  # 150,000 by default
    edit["trigger"] = {"type": "input_tokens", "value": tokens}
    assert not apply_edits(body_of(messages, edit)).compaction_due
    edit["trigger"]["value"] = tokens - 1
    due = apply_edits(body_of(messages, edit))
    assert (due.compaction_due, due.pause_after_compaction) == (True, False)
    assert due.applied_edits == []  # compaction is reported by its block, not here
    paused = apply_edits(body_of(messages, edit | {"pause_after_compaction": True}))
    assert (paused.compaction_due, paused.pause_after_compaction) == (True, True)


def test_what_precedes_the_latest_compaction_block_is_dropped() -> None:
    messages = conversation(["Bash"] * 2)
    later = {"role": "user", "content": "And now?"}
    messages += [
        {"role": "assistant", "content": [compaction("First."), {"type": "text", "text": "A"}]},
        {"role": "user", "content": "Go on."},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Before."},
                compaction("Second."),
                {"type": "text", "text": "After."},
                compaction(None),  # a failed compaction: no-op
            ],
        },
        later,
    ]
    kept = drop_before_compaction(messages)
    after = [compaction("Second."), {"type": "text", "text": "After."}, compaction(None)]
    assert kept == [{"role": "assistant", "content": after}, later]
    applied = apply_edits({"messages": messages})  # any request, edits or none
    assert (applied.messages, applied.dropped_turns) == (kept, len(messages) - 2)
    assert drop_before_compaction(messages[:5]) == messages[:5]  # no compaction yet


# -- the mock Claude -------------------------------------------------------------------------


def post(model: ClaudeModel, body: dict[str, Any], *betas: str, path: str = "/v1/messages") -> Any:
    """The mock's reply to ``body`` sent with ``betas``."""
    lines = [("content-type", "application/json")]
    if betas:
        lines.append(("anthropic-beta", ",".join(betas)))
    received = Received("POST", path, dict(lines), orjson.dumps(body), 0.0, lines)
    return model(received)


def events(reply: SSEReply) -> list[dict[str, Any]]:
    parsed = [orjson.loads(event.split(b"data: ", 1)[1]) for event in reply.events]
    for event in parsed:
        STREAM_EVENT.validate_python(event)
    return parsed


@pytest.fixture
def claude(upstream: MockUpstream) -> ClaudeModel:
    upstream.handler = model = ClaudeModel()
    return model


@pytest.fixture
def client(upstream: MockUpstream) -> Iterator[anthropic.Anthropic]:
    base = upstream.base_url.removesuffix("/v1")
    with anthropic.Anthropic(base_url=base, api_key="sk-ant-test", max_retries=0) as sdk:
        yield sdk


def test_the_mock_refuses_edits_without_their_beta() -> None:
    model = ClaudeModel()
    clearing = body_of(conversation(["Bash"]), {"type": "clear_tool_uses_20250919"})
    refused = post(model, clearing)
    assert isinstance(refused, JSONReply)
    assert refused.status == 400
    assert refused.body["error"]["type"] == "invalid_request_error"
    assert CONTEXT_MANAGEMENT_BETA in model.refusals[-1]
    assert post(model, clearing, COMPACT_BETA).status == 400  # not the compact beta
    assert post(model, clearing, "other-beta", CONTEXT_MANAGEMENT_BETA).status == 200
    compact = body_of(conversation(["Bash"]), {"type": "compact_20260112"})
    assert post(model, compact).status == 400
    assert post(model, compact, COMPACT_BETA).status == 200
    unknown = body_of(conversation(["Bash"]), {"type": "clear_everything"})
    assert post(model, unknown, CONTEXT_MANAGEMENT_BETA).status == 400
    assert len(model.requests) == len(model.applied) == len(model.edited) == 2
    plain = post(model, {"model": MODEL, "max_tokens": 9, "messages": conversation(["Bash"])})
    assert "context_management" not in plain.body  # as before, without edits


def test_the_mock_reads_the_cleared_request_and_reports_the_edits() -> None:
    model = ClaudeModel(count=chars)
    edit = {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "tool_uses", "value": 1},
        "keep": {"type": "tool_uses", "value": 1},
    }
    messages = conversation(["Bash"] * 3, "RUN: a\nRUN: b\nRUN: c")
    reply = post(model, body_of(messages, edit), CONTEXT_MANAGEMENT_BETA)
    message = BetaMessage.model_validate(reply.body)
    assert message.context_management is not None
    [applied] = message.context_management.applied_edits
    assert (applied.type, getattr(applied, "cleared_tool_uses", None)) == (
        "clear_tool_uses_20250919",
        2,
    )
    assert model.applied == [[applied.model_dump()]]
    assert model.requests == [body_of(messages, edit)]  # as sent
    assert results(model.edited[0]) == {
        "toolu_0": PLACEHOLDER,
        "toolu_1": PLACEHOLDER,
        "toolu_2": messages[-1]["content"][0]["content"],
    }
    assert message.content[0].type == "text"  # all three commands ran
    # The model read the cleared request: its prompt is shorter than the whole one.
    whole = ClaudeModel()
    post(whole, {k: v for k, v in body_of(messages).items() if k != "context_management"})
    assert sum(model.usages[0].values()) < sum(whole.usages[0].values())
    counted = post(
        model, body_of(messages, edit), CONTEXT_MANAGEMENT_BETA, path="/v1/messages/count_tokens"
    )
    tokens = BetaMessageTokensCount.model_validate(counted.body)
    assert tokens.context_management is not None
    assert tokens.input_tokens == sum(model.usages[0].values())
    assert tokens.context_management.original_input_tokens == sum(whole.usages[0].values())


def test_the_mock_keeps_claude_codes_thinking_untouched() -> None:
    model = ClaudeModel()
    keep_all = {"type": "clear_thinking_20251015", "keep": "all"}
    thinking = {"thinking": {"type": "enabled", "budget_tokens": 1024}}
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Hi."}]
    first = post(model, body_of(messages, keep_all) | thinking, CONTEXT_MANAGEMENT_BETA)
    messages += [
        {"role": "assistant", "content": first.body["content"]},
        {"role": "user", "content": "Again."},
    ]
    body = body_of(messages, keep_all) | thinking | {"stream": True}
    streamed = events(post(model, body, CONTEXT_MANAGEMENT_BETA))
    [delta] = [e for e in streamed if e["type"] == "message_delta"]
    assert delta["context_management"] == {"applied_edits": []}
    assert "context_management" not in streamed[0]["message"]
    assert model.edited[-1] == messages
    assert model.applied == [[], []]


def test_the_mock_compacts_and_pauses() -> None:
    model = ClaudeModel()
    messages = conversation(["Bash"], "RUN: a\nRUN: b")
    edit = {
        "type": "compact_20260112",
        "trigger": {"type": "input_tokens", "value": 10},
        "pause_after_compaction": True,
    }
    reply = post(model, body_of(messages, edit), COMPACT_BETA)
    message = BetaMessage.model_validate(reply.body)
    assert message.stop_reason == "compaction"
    [block] = message.content
    assert block.type == "compaction"
    assert block.content is not None
    assert "RUN: a\nRUN: b" in block.content
    assert block.encrypted_content
    assert message.usage.iterations is not None
    assert [i.type for i in message.usage.iterations] == ["compaction"]
    assert message.context_management is not None
    assert message.context_management.applied_edits == []
    assert model.compacted == [True]
    streamed = events(post(model, body_of(messages, edit) | {"stream": True}, COMPACT_BETA))
    assert [e["type"] for e in streamed] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert streamed[1]["content_block"] == compaction(None) | {"encrypted_content": None}
    assert streamed[2]["delta"]["type"] == "compaction_delta"
    assert streamed[2]["delta"]["content"] == block.content
    assert streamed[4]["delta"]["stop_reason"] == "compaction"
    assert streamed[4]["context_management"] == {"applied_edits": []}
    assert [i["type"] for i in streamed[4]["usage"]["iterations"]] == ["compaction"]
    # The client sends the block back, and the model goes on from it.
    back = [*messages, {"role": "assistant", "content": [block.model_dump(exclude_none=True)]}]
    calm = body_of(back, edit | {"trigger": {"type": "input_tokens", "value": 100_000}})
    reply = post(model, calm, COMPACT_BETA)
    assert model.edited[-1] == [back[-1]]
    assert reply.body["content"][0]["input"]["command"] == "b"


def test_the_sdk_gets_the_applied_edits(claude: ClaudeModel, client: anthropic.Anthropic) -> None:
    messages: Any = conversation(["Bash"] * 4, "RUN: a\nRUN: b\nRUN: c\nRUN: d\nRUN: e")
    response = client.beta.messages.create(
        model=MODEL,
        max_tokens=1024,
        messages=messages,
        betas=[CONTEXT_MANAGEMENT_BETA],
        context_management={
            "edits": [
                {
                    "type": "clear_tool_uses_20250919",
                    "trigger": {"type": "tool_uses", "value": 2},
                    "keep": {"type": "tool_uses", "value": 2},
                    "clear_tool_inputs": True,
                }
            ]
        },
    )
    assert response.context_management is not None
    [applied] = response.context_management.applied_edits
    assert applied.model_dump() == claude.applied[0][0]
    assert applied.type == "clear_tool_uses_20250919"
    assert applied.cleared_tool_uses == 2
    assert applied.cleared_input_tokens > 0
    assert response.content[0].type == "tool_use"
    assert response.content[0].input == {"command": "e", "description": "Step 5"}
    with pytest.raises(anthropic.BadRequestError):
        client.beta.messages.create(
            model=MODEL,
            max_tokens=1024,
            messages=messages,
            context_management={"edits": [{"type": "clear_tool_uses_20250919"}]},
        )


def test_the_sdk_streams_the_compaction_and_goes_on_from_it(
    claude: ClaudeModel, client: anthropic.Anthropic
) -> None:
    messages: Any = [{"role": "user", "content": "RUN: a\nRUN: b"}]
    management: Any = {
        "edits": [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 5}}]
    }
    answers = []
    for _ in range(3):
        with client.beta.messages.stream(
            model=MODEL,
            max_tokens=1024,
            messages=messages,
            betas=[COMPACT_BETA],
            context_management=management,
        ) as stream:
            kinds = [event.type for event in stream]
            final = stream.get_final_message()
        assert "compaction" in kinds  # the SDK's event for a compaction delta
        answers.append(final)
        content = [block.model_dump(exclude_none=True) for block in final.content]
        messages = [*messages, {"role": "assistant", "content": content}]
        if final.stop_reason == "tool_use":
            result = {"type": "tool_result", "tool_use_id": content[-1]["id"], "content": "ok"}
            messages.append({"role": "user", "content": [result]})
    for final in answers:
        assert final.content[0].type == "compaction"
        assert final.content[0].content
        assert final.usage.iterations is not None
        assert [i.type for i in final.usage.iterations] == ["compaction", "message"]
        assert final.context_management is not None
        assert final.context_management.applied_edits == []
    assert [a.content[1].type for a in answers] == ["tool_use", "tool_use", "text"]
    assert [getattr(a.content[1], "input", {}).get("command") for a in answers[:2]] == ["a", "b"]
    last = answers[2].content[1]
    assert last.type == "text"
    assert last.text.startswith("Done after 2 commands")
    assert claude.compacted == [True, True, True]
    # Each later request was read from its latest compaction block on.
    assert [turns[0]["role"] for turns in claude.edited] == ["user", "assistant", "assistant"]
    assert claude.edited[2][0]["content"][0] == answers[1].content[0].model_dump(exclude_none=True)
