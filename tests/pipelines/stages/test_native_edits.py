"""native_edits: the client's clear_tool_uses and clear_thinking applied by the gateway
(a polyfill plan), what it clears offloaded first and named by a ref in its placeholder,
and reported in the API's ``applied_edits`` shape."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest

from gateway.store import MemoryStore
from pipelines import CompactResult, Pipeline, Policy
from pipelines.native import CLEAR_THINKING, CLEAR_TOOL_USES, NativePlan, parse_edits
from pipelines.stages.native_edits import NativeEdits
from tests.pipelines.stages.conftest import FailingStore

REF = re.compile(r"ctx_[A-Za-z0-9_-]{22,}")
PLACEHOLDER = re.compile(
    r"^\[Tool result of (?P<name>\S*) cleared to save context \((?P<size>[\d,]+) characters\),"
    r" stored as (?P<ref>ctx_[A-Za-z0-9_-]{22,})\. Restore it if it is needed again; do not"
    r" guess its content\.\]$"
)


def output(i: int) -> str:
    """A tool result of about 600 tokens, different for each ``i``."""
    return f"result {i}\n" + "".join(f"line {i}.{j}: status ok, size {j * 37}\n" for j in range(60))


def history(names: list[str], out: Any = output, note: str = "") -> list[dict[str, Any]]:
    """A user turn, then one tool use (its arguments a path and ``note``) and its result
    per name, then a user turn."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Investigate the outage."}]
    for i, name in enumerate(names):
        arguments = orjson.dumps({"path": f"logs/{i}.txt", "note": f"{i} {note}"}).decode()
        call = {
            "id": f"c{i}",
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "name": name, "content": out(i)})
    messages.append({"role": "user", "content": "What did you find?"})
    return messages


LONG_NOTE = "the arguments of a call worth clearing: longer than their placeholder " * 2
"""Arguments shorter than the placeholder that would name their ref are left as they are
(clearing them would add tokens)."""


def clear_tool_uses(**fields: Any) -> dict[str, Any]:
    return {"edits": [{"type": CLEAR_TOOL_USES, **fields}]}


def uses(value: int) -> dict[str, Any]:
    return {"type": "tool_uses", "value": value}


def tokens(value: int) -> dict[str, Any]:
    return {"type": "input_tokens", "value": value}


async def run(
    messages: list[dict[str, Any]],
    management: dict[str, Any],
    *,
    store: Any = None,
    mode: str = "polyfill",
    stage: NativeEdits | None = None,
    policy: Policy | None = None,
) -> CompactResult:
    """The stage alone over ``messages`` under a plan of ``mode`` for ``management``."""
    plan = NativePlan(mode, parse_edits(management), "test")  # type: ignore[arg-type]
    pipeline = Pipeline(stages=[stage or NativeEdits()], store=store)
    request = {"model": "gpt-4o", "messages": messages}
    return await pipeline.compact(request, policy=policy, native=plan)


def results(result: CompactResult) -> list[str]:
    return [m["content"] for m in result.request["messages"] if m["role"] == "tool"]


def cleared_at(result: CompactResult) -> list[int]:
    """Which tool results (by their order) went as placeholders."""
    return [i for i, content in enumerate(results(result)) if PLACEHOLDER.match(content)]


# -- clear_tool_uses: when --------------------------------------------------------------


async def test_tool_uses_trigger_clears_only_when_strictly_over() -> None:
    """With 4 tool uses a trigger of 4 clears nothing and of 3 clears all but the kept one."""
    messages = history(["read"] * 4)
    at = await run(messages, clear_tool_uses(trigger=uses(4), keep=uses(1)), store=MemoryStore())
    assert not at.changed
    assert at.request["messages"] == messages
    assert at.report.applied_edits == []
    over = await run(messages, clear_tool_uses(trigger=uses(3), keep=uses(1)), store=MemoryStore())
    assert cleared_at(over) == [0, 1, 2]
    assert results(over)[3] == output(3)


async def test_input_tokens_trigger_clears_only_when_strictly_over() -> None:
    """The input-token trigger compares the request's tokens: equal to them, nothing is
    cleared; one token under them, the older results are."""
    messages = history(["read"] * 4)
    measured = (await run(messages, {"edits": []})).report.tokens_before
    at = await run(messages, clear_tool_uses(trigger=tokens(measured)), store=MemoryStore())
    assert at.request["messages"] == messages
    assert at.report.applied_edits == []
    over = await run(messages, clear_tool_uses(trigger=tokens(measured - 1)), store=MemoryStore())
    assert cleared_at(over) == [0]  # the default keep: the latest 3


async def test_the_default_trigger_is_100000_input_tokens() -> None:
    """Without a trigger a short history is left alone."""
    result = await run(history(["read"] * 6), clear_tool_uses(keep=uses(0)), store=MemoryStore())
    assert not result.changed
    assert result.report.applied_edits == []


# -- clear_tool_uses: what ----------------------------------------------------------------


@pytest.mark.parametrize(
    "keep",
    [
        0,
        1,
        3,
        4,
        5,
        7,
        8,
        20,
    ],
)
async def test_keep_leaves_the_latest_tool_uses(keep: int) -> None:
    """Every result but the latest ``keep`` is cleared, oldest first; a keep of as many
    uses as there are, or more, clears nothing."""
    messages = history(["read"] * 4)
    result = await run(
        messages, clear_tool_uses(trigger=uses(1), keep=uses(keep)), store=MemoryStore()
    )
    expected = list(range(max(0, 4 - keep)))
    assert cleared_at(result) == expected
    assert results(result)[len(expected) :] == [output(i) for i in range(len(expected), 4)]
    applied = result.report.applied_edits
    if expected:
        assert applied[0]["cleared_tool_uses"] == len(expected)
    else:
        assert applied == []
        assert result.request["messages"] == messages


async def test_excluded_tools_are_never_cleared() -> None:
    """Uses of exclude_tools keep their results; the others before the kept ones go."""
    messages = history(["read", "memory", "read", "memory", "read"])
    result = await run(
        messages,
        clear_tool_uses(trigger=uses(1), keep=uses(1), exclude_tools=["memory"]),
        store=MemoryStore(),
    )
    assert cleared_at(result) == [0, 2]
    assert results(result)[1] == output(1)
    assert results(result)[3] == output(3)
    assert result.report.applied_edits[0]["cleared_tool_uses"] == 2


async def test_a_cleared_result_keeps_its_pairing_and_names_its_tool() -> None:
    """A cleared tool message still answers its call (same id and name); the placeholder
    names the tool and the size of what was cleared."""
    messages = history(["grep", "read"])
    result = await run(
        messages, clear_tool_uses(trigger=uses(1), keep=uses(1)), store=MemoryStore()
    )
    sent = result.request["messages"]
    assert sent[1] == messages[1]
    assert (sent[2]["role"], sent[2]["tool_call_id"], sent[2]["name"]) == ("tool", "c0", "grep")
    found = PLACEHOLDER.match(sent[2]["content"])
    assert found is not None
    assert found["name"] == "grep"
    assert found["size"] == f"{len(output(0)):,}"


async def test_the_placeholder_gives_the_size_in_characters() -> None:
    """A result of non-ASCII text is described by its length in characters, as the
    placeholder says."""
    text = "température relevée — 21 °C\n" * 50
    result = await run(
        history(["read", "read"], out=lambda i: text),
        clear_tool_uses(trigger=uses(1), keep=uses(1)),
        store=MemoryStore(),
    )
    found = PLACEHOLDER.match(results(result)[0])
    assert found is not None
    assert found["size"] == f"{len(text):,}"


async def test_every_cleared_result_is_restored_byte_for_byte() -> None:
    """Each placeholder's ref gives back the result exactly as the client sent it
    (whitespace, non-ASCII text and JSON untouched)."""

    def varied(i: int) -> str:
        if i == 0:
            return '{ "rows" : [1, 2,  3],\n  "note": "café ☕" }'
        if i == 1:
            return "  indented\n\ttabbed\r\nwindows line\n" * 40
        return output(i)

    messages = history(["read"] * 4, out=varied)
    store = MemoryStore()
    result = await run(messages, clear_tool_uses(trigger=uses(1), keep=uses(1)), store=store)
    placeholders = [PLACEHOLDER.match(c) for c in results(result)[:3]]
    refs = [p["ref"] for p in placeholders if p is not None]
    assert len(set(refs)) == 3
    for i, ref in enumerate(refs):
        assert await store.get("", ref) == varied(i).encode()


async def test_a_result_the_store_does_not_take_stays_in_place() -> None:
    """When the store fails, nothing is cleared (no placeholder names a ref it never
    wrote), no edit is reported, and the failures are counted."""
    messages = history(["read"] * 4)
    result = await run(
        messages, clear_tool_uses(trigger=uses(1), keep=uses(1)), store=FailingStore()
    )
    assert result.request["messages"] == messages
    assert result.report.applied_edits == []
    assert result.report.stages[0].details["store_failures"] == 3


async def test_without_a_store_nothing_is_cleared() -> None:
    """A pipeline without a store cannot offload, so it leaves every result as it is."""
    messages = history(["read"] * 4)
    result = await run(messages, clear_tool_uses(trigger=uses(1), keep=uses(1)))
    assert result.request["messages"] == messages
    assert result.report.applied_edits == []
    assert result.report.stages[0].details["skipped"] == "no store"


async def test_the_same_request_is_cleared_to_the_same_bytes() -> None:
    """The same history, cleared on two requests (by the same stage or a new one on the
    same store), goes out byte for byte the same, so the provider's prefix cache holds."""
    messages = history(["read"] * 5)
    management = clear_tool_uses(trigger=uses(2), keep=uses(2), clear_tool_inputs=True)
    store, stage = MemoryStore(), NativeEdits()
    first = await run(messages, management, store=store, stage=stage)
    second = await run(messages, management, store=store, stage=stage)
    third = await run(messages, management, store=store)
    assert cleared_at(first) == [0, 1, 2]
    assert orjson.dumps(second.request) == orjson.dumps(first.request)
    assert orjson.dumps(third.request) == orjson.dumps(first.request)


async def test_clear_tool_inputs_true_clears_every_cleared_uses_arguments() -> None:
    """With clear_tool_inputs, a cleared use's arguments become a ref that restores them;
    the kept uses keep theirs; the saved tokens are reported."""
    messages = history(["read", "grep", "read"], note="look for the timeout " * 40)
    store = MemoryStore()
    plain = await run(messages, clear_tool_uses(trigger=uses(1), keep=uses(1)), store=store)
    result = await run(
        messages,
        clear_tool_uses(trigger=uses(1), keep=uses(1), clear_tool_inputs=True),
        store=store,
    )
    sent = result.request["messages"]
    for at, i in ((1, 0), (3, 1)):
        arguments = orjson.loads(sent[at]["tool_calls"][0]["function"]["arguments"])
        assert list(arguments) == ["cleared_to_save_context"]
        restored = await store.get("", arguments["cleared_to_save_context"])
        assert restored == messages[at]["tool_calls"][0]["function"]["arguments"].encode()
        assert sent[at]["tool_calls"][0]["id"] == f"c{i}"
        assert (
            sent[at]["tool_calls"][0]["function"]["name"]
            == messages[at]["tool_calls"][0]["function"]["name"]
        )
    assert sent[5] == messages[5]
    assert cleared_at(result) == [0, 1]
    edit = result.report.applied_edits[0]
    assert edit["cleared_tool_uses"] == 2
    assert edit["cleared_input_tokens"] > plain.report.applied_edits[0]["cleared_input_tokens"]


async def test_clear_tool_inputs_list_clears_only_those_tools_arguments() -> None:
    """A list in clear_tool_inputs clears the arguments of the tools it names only."""
    messages = history(["read", "grep", "read"], note=LONG_NOTE)
    result = await run(
        messages,
        clear_tool_uses(trigger=uses(1), keep=uses(1), clear_tool_inputs=["grep"]),
        store=MemoryStore(),
    )
    sent = result.request["messages"]
    assert sent[1] == messages[1]
    assert "cleared_to_save_context" in sent[3]["tool_calls"][0]["function"]["arguments"]
    assert cleared_at(result) == [0, 1]


async def test_arguments_shorter_than_their_placeholder_stay() -> None:
    """Clearing arguments shorter than the placeholder naming their ref would add tokens:
    they stay as sent, while the results are cleared."""
    messages = history(["read", "read", "read"])
    result = await run(
        messages,
        clear_tool_uses(trigger=uses(1), keep=uses(1), clear_tool_inputs=True),
        store=MemoryStore(),
    )
    sent = result.request["messages"]
    assert [sent[i]["tool_calls"] for i in (1, 3)] == [messages[i]["tool_calls"] for i in (1, 3)]
    assert cleared_at(result) == [0, 1]


async def test_parallel_calls_have_each_their_arguments_cleared() -> None:
    """Two uses in one assistant turn are two uses: both results and both arguments are
    cleared, each call keeping its own id."""
    calls = [
        {
            "id": f"p{i}",
            "type": "function",
            "function": {"name": "read", "arguments": f'{{"n": {i}, "note": "{LONG_NOTE}"}}'},
        }
        for i in range(2)
    ]
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Read both."},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "p0", "content": output(0)},
        {"role": "tool", "tool_call_id": "p1", "content": output(1)},
        *history(["read"])[1:],
    ]
    store = MemoryStore()
    result = await run(
        messages,
        clear_tool_uses(trigger=uses(2), keep=uses(1), clear_tool_inputs=True),
        store=store,
    )
    sent = result.request["messages"][1]["tool_calls"]
    assert [c["id"] for c in sent] == ["p0", "p1"]
    for i, call in enumerate(sent):
        ref = orjson.loads(call["function"]["arguments"])["cleared_to_save_context"]
        assert await store.get("", ref) == f'{{"n": {i}, "note": "{LONG_NOTE}"}}'.encode()
    assert cleared_at(result) == [0, 1]
    assert result.report.applied_edits[0]["cleared_tool_uses"] == 2


async def test_clear_at_least_clears_nothing_when_too_little_would_go() -> None:
    """With clear_at_least over what clearing would free, nothing is cleared; under it,
    the clearing happens."""
    messages = history(["read"] * 3)
    store = MemoryStore()
    freed = (
        await run(messages, clear_tool_uses(trigger=uses(1), keep=uses(1)), store=store)
    ).report.applied_edits[0]["cleared_input_tokens"]
    held = await run(
        messages,
        clear_tool_uses(trigger=uses(1), keep=uses(1), clear_at_least=tokens(freed * 3)),
        store=store,
    )
    assert held.request["messages"] == messages
    assert held.report.applied_edits == []
    done = await run(
        messages,
        clear_tool_uses(trigger=uses(1), keep=uses(1), clear_at_least=tokens(freed // 2)),
        store=store,
    )
    assert cleared_at(done) == [0, 1]


async def test_clear_at_least_is_what_the_clearing_frees() -> None:
    """When clear_at_least lets a clearing happen, at least that many tokens are freed:
    the request never grows and the report never says fewer."""
    messages = history(["read"] * 4, out=lambda i: f"ok {i} " + "apple " * 20)
    result = await run(
        messages,
        clear_tool_uses(trigger=uses(2), keep=uses(1), clear_at_least=tokens(50)),
        store=MemoryStore(),
    )
    report = result.report
    assert report.tokens_after <= report.tokens_before
    for edit in report.applied_edits:
        assert edit["cleared_input_tokens"] >= 50


async def test_applied_edit_reports_what_was_cleared() -> None:
    """The applied edit has the API's shape: its type, how many tool uses were cleared
    and the input tokens that freed, which is what the request lost."""
    messages = history(["read"] * 4)
    result = await run(
        messages, clear_tool_uses(trigger=uses(2), keep=uses(1)), store=MemoryStore()
    )
    report = result.report
    assert report.applied_edits == [
        {
            "type": CLEAR_TOOL_USES,
            "cleared_tool_uses": 3,
            "cleared_input_tokens": report.tokens_before - report.tokens_after,
        }
    ]
    assert report.applied_edits[0]["cleared_input_tokens"] > 1_000
    assert report.stages[0].name == "native_edits"
    assert report.stages[0].details["applied_edits"] == report.applied_edits


# -- clear_thinking -------------------------------------------------------------------------

THINK = {"type": "thinking", "thinking": "weighing the options " * 20, "signature": "sig"}
REDACTED = {"type": "redacted_thinking", "data": "opaque"}


def thinking_history(turns: int) -> list[dict[str, Any]]:
    """``turns`` assistant turns that each think, as reasoning_content or blocks."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Plan the migration."}]
    for i in range(turns):
        if i % 2:
            content: Any = [THINK, REDACTED, {"type": "text", "text": f"Step {i}."}]
            messages.append({"role": "assistant", "content": content})
        else:
            reasoning = f"thinking about step {i} " * 30
            turn = {"role": "assistant", "content": f"Step {i}.", "reasoning_content": reasoning}
            messages.append(turn)
        messages.append({"role": "user", "content": f"And then {i}?"})
    return messages


def thinks(message: dict[str, Any]) -> bool:
    content = message.get("content")
    blocks = isinstance(content, list) and any(
        part.get("type") in ("thinking", "redacted_thinking") for part in content
    )
    return blocks or bool(message.get("reasoning_content") or message.get("thinking_blocks"))


def thinking_kept(result: CompactResult) -> list[bool]:
    return [thinks(m) for m in result.request["messages"] if m["role"] == "assistant"]


def clear_thinking(keep: Any = None) -> dict[str, Any]:
    edit: dict[str, Any] = {"type": CLEAR_THINKING}
    if keep is not None:
        edit["keep"] = keep
    return {"edits": [edit]}


def turns(value: int) -> dict[str, Any]:
    return {"type": "thinking_turns", "value": value}


@pytest.mark.parametrize(
    ("keep", "kept"),
    [
        (None, [False, False, False, True]),
        (turns(0), [False, False, False, False]),
        (turns(2), [False, False, True, True]),
        (turns(4), [True, True, True, True]),
        (turns(5), [True, True, True, True]),
        (turns(9), [True, True, True, True]),
        ("all", [True, True, True, True]),
    ],
)
async def test_clear_thinking_keeps_the_latest_thinking_turns(keep: Any, kept: list[bool]) -> None:
    """Every thinking turn but the latest ``keep`` (default 1; "all": every one) loses
    its thinking; the turns' text stays."""
    messages = thinking_history(4)
    result = await run(messages, clear_thinking(keep))
    assert thinking_kept(result) == kept
    sent = [m for m in result.request["messages"] if m["role"] == "assistant"]
    for i, message in enumerate(sent):
        text = message["content"] if isinstance(message["content"], str) else message["content"][-1]
        assert text in (f"Step {i}.", {"type": "text", "text": f"Step {i}."})
    cleared = kept.count(False)
    if cleared:
        edit = result.report.applied_edits
        assert edit[0]["type"] == CLEAR_THINKING
        assert edit[0]["cleared_thinking_turns"] == cleared
        assert edit[0]["cleared_input_tokens"] > 0
    else:
        assert result.report.applied_edits == []
        assert result.request["messages"] == messages


async def test_clear_thinking_needs_no_store_and_no_trigger() -> None:
    """Thinking is dropped on every request, with or without a store, however short."""
    result = await run(thinking_history(2), clear_thinking())
    assert thinking_kept(result) == [False, True]


async def test_thinking_is_cleared_before_tool_uses_are_measured() -> None:
    """Edits apply in order: the input-token trigger of clear_tool_uses is measured on the
    request after clear_thinking, as the API does."""
    messages = [*thinking_history(4)[:-1], *history(["read"] * 2)[1:]]
    measured = (await run(messages, {"edits": []})).report.tokens_before
    thinking = await run(messages, clear_thinking())
    freed = thinking.report.applied_edits[0]["cleared_input_tokens"]
    management: dict[str, Any] = {
        "edits": [
            {"type": CLEAR_THINKING},
            {"type": CLEAR_TOOL_USES, "trigger": tokens(measured - freed // 2), "keep": uses(0)},
        ]
    }
    result = await run(messages, management, store=MemoryStore())
    assert [e["type"] for e in result.report.applied_edits] == [CLEAR_THINKING]
    assert cleared_at(result) == []
    lower = {**management["edits"][1], "trigger": tokens(measured - freed - 50)}
    both = await run(messages, {"edits": [management["edits"][0], lower]}, store=MemoryStore())
    assert [e["type"] for e in both.report.applied_edits] == [CLEAR_THINKING, CLEAR_TOOL_USES]
    assert cleared_at(both) == [0, 1]


# -- the plan -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["honour", "prefer", "off"])
async def test_nothing_happens_unless_the_plan_polyfills(mode: str) -> None:
    """Honoured, preferred or ignored edits are not the gateway's to apply: the request
    goes as received and no edit is reported."""
    messages = [*thinking_history(3)[:-1], *history(["read"] * 4)[1:]]
    management = {
        "edits": [
            {"type": CLEAR_THINKING, "keep": turns(0)},
            {"type": CLEAR_TOOL_USES, "trigger": uses(1), "keep": uses(0)},
        ]
    }
    result = await run(messages, management, store=MemoryStore(), mode=mode)
    assert not result.changed
    assert result.request["messages"] == messages
    assert result.report.applied_edits == []
    polyfilled = await run(messages, management, store=MemoryStore())
    assert polyfilled.changed
    assert len(polyfilled.report.applied_edits) == 2


async def test_no_plan_or_no_edits_means_nothing_happens() -> None:
    """A request without context management, or a polyfill plan with no edits, is left
    alone."""
    messages = history(["read"] * 4)
    bare = await Pipeline(stages=[NativeEdits()], store=MemoryStore()).compact(
        {"model": "gpt-4o", "messages": messages}
    )
    assert not bare.changed
    assert bare.report.applied_edits == []
    assert bare.report.native is None
    empty = await run(messages, {"edits": []}, store=MemoryStore())
    assert not empty.changed
    assert empty.report.native == {
        "mode": "polyfill",
        "api": "anthropic",
        "edits": [],
        "reason": "test",
    }
