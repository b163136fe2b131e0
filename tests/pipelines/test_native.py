"""pipelines.native: Anthropic's ``context_management.edits`` read and checked as the API
checks them (errors name the field), their defaults, and the policy stepped back from what
the client delegated."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.store import MemoryStore
from pipelines import Pipeline, Policy
from pipelines.native import (
    CLEAR_THINKING,
    CLEAR_TOOL_USES,
    COMPACT,
    ClearThinking,
    ClearToolUses,
    Compact,
    NativeEditError,
    NativeEdits,
    NativePlan,
    parse_edits,
    stepped_back,
)
from pipelines.stages.filter import Filter


def edits(*given: dict[str, Any]) -> dict[str, Any]:
    return {"edits": list(given)}


@pytest.mark.parametrize("management", [None, {}, {"edits": None}, {"edits": []}])
def test_no_edits_asked_means_none(management: Any) -> None:
    """A request without edits (no field, no list, an empty list) asks for nothing."""
    parsed = parse_edits(management)
    assert parsed == NativeEdits()
    assert not parsed
    assert parsed.kinds == ()


def test_clear_tool_uses_defaults_are_the_apis() -> None:
    """A bare clear_tool_uses clears from 100,000 input tokens, keeps the latest 3 tool
    uses, has no floor, excludes no tool and leaves inputs alone."""
    parsed = parse_edits(edits({"type": CLEAR_TOOL_USES}))
    assert parsed.clear_tool_uses == ClearToolUses(
        trigger_kind="input_tokens",
        trigger=100_000,
        keep=3,
        clear_at_least=0,
        exclude_tools=frozenset(),
        clear_inputs=False,
    )
    assert parsed.clear_thinking is None
    assert parsed.compact is None
    assert parsed.kinds == (CLEAR_TOOL_USES,)


def test_clear_thinking_and_compact_defaults_are_the_apis() -> None:
    """A bare clear_thinking keeps the model's default (1 thinking turn, or all of them on
    a model that keeps earlier thinking); a bare compact triggers at 150,000 input
    tokens, without instructions, and does not pause."""
    parsed = parse_edits(edits({"type": CLEAR_THINKING}, {"type": COMPACT}))
    assert parsed.clear_thinking == ClearThinking(keep=1, given=False)
    assert parsed.compact == Compact(
        trigger=150_000, instructions=None, pause_after_compaction=False
    )


def test_every_clear_tool_uses_field_is_read() -> None:
    """Trigger by tool uses, keep, clear_at_least, exclude_tools and a list of tools
    whose inputs are cleared are all read as given."""
    parsed = parse_edits(
        edits(
            {
                "type": CLEAR_TOOL_USES,
                "trigger": {"type": "tool_uses", "value": 7},
                "keep": {"type": "tool_uses", "value": 0},
                "clear_at_least": {"type": "input_tokens", "value": 5_000},
                "exclude_tools": ["memory", "web_search"],
                "clear_tool_inputs": ["Bash"],
            }
        )
    )
    edit = parsed.clear_tool_uses
    assert edit == ClearToolUses(
        trigger_kind="tool_uses",
        trigger=7,
        keep=0,
        clear_at_least=5_000,
        exclude_tools=frozenset({"memory", "web_search"}),
        clear_inputs=frozenset({"Bash"}),
    )
    assert edit.clears_input("Bash")
    assert not edit.clears_input("Read")


@pytest.mark.parametrize(
    ("given", "bash", "read"),
    [(True, True, True), (False, False, False), (None, False, False), (["Read"], False, True)],
)
def test_clear_tool_inputs_all_none_or_named(given: Any, bash: bool, read: bool) -> None:
    """clear_tool_inputs true clears every cleared use's input, false or absent none, a
    list only those of the tools it names."""
    edit: dict[str, Any] = {"type": CLEAR_TOOL_USES}
    if given is not None:
        edit["clear_tool_inputs"] = given
    parsed = parse_edits(edits(edit)).clear_tool_uses
    assert parsed is not None
    assert (parsed.clears_input("Bash"), parsed.clears_input("Read")) == (bash, read)


@pytest.mark.parametrize(
    ("keep", "kept"),
    [
        ({"type": "thinking_turns", "value": 4}, 4),
        ({"type": "thinking_turns", "value": 0}, 0),
        ("all", None),
        ({"type": "all"}, None),
    ],
)
def test_clear_thinking_keep(keep: Any, kept: int | None) -> None:
    """keep names how many thinking turns stay (0 allowed), or all of them."""
    parsed = parse_edits(edits({"type": CLEAR_THINKING, "keep": keep}))
    assert parsed.clear_thinking == ClearThinking(keep=kept)


def test_compact_fields_are_read() -> None:
    """compact's trigger, instructions and pause are read; empty instructions are none."""
    parsed = parse_edits(
        edits(
            {
                "type": COMPACT,
                "trigger": {"type": "input_tokens", "value": 60_000},
                "instructions": "Keep file paths.",
                "pause_after_compaction": True,
            }
        )
    )
    assert parsed.compact == Compact(60_000, "Keep file paths.", True)
    assert parse_edits(edits({"type": COMPACT, "instructions": ""})).compact == Compact()


def test_kinds_are_in_the_apis_order() -> None:
    """The edits' names come in the API's order (thinking first), whatever else was given."""
    parsed = parse_edits(
        edits({"type": CLEAR_THINKING}, {"type": COMPACT}, {"type": CLEAR_TOOL_USES})
    )
    assert parsed.kinds == (CLEAR_THINKING, CLEAR_TOOL_USES, COMPACT)
    assert parsed


CTU = "context_management.edits.0"


@pytest.mark.parametrize(
    ("management", "param"),
    [
        ([], "context_management"),
        ("clear", "context_management"),
        ({"edits": {"type": CLEAR_TOOL_USES}}, "context_management.edits"),
        ({"edits": ["clear"]}, CTU),
        (edits({"type": "clear_everything"}), f"{CTU}.type"),
        (edits({}), f"{CTU}.type"),
        (
            edits({"type": CLEAR_TOOL_USES}, {"type": CLEAR_TOOL_USES}),
            "context_management.edits.1.type",
        ),
        (
            edits({"type": CLEAR_TOOL_USES}, {"type": CLEAR_THINKING}),
            "context_management.edits.1.type",
        ),
        (edits({"type": CLEAR_TOOL_USES, "keep_last": 3}), f"{CTU}.keep_last"),
        (
            edits({"type": CLEAR_TOOL_USES, "keep": {"type": "tool_uses", "value": -1}}),
            f"{CTU}.keep.value",
        ),
        (
            edits({"type": CLEAR_TOOL_USES, "keep": {"type": "tool_uses", "value": "3"}}),
            f"{CTU}.keep.value",
        ),
        (
            edits({"type": CLEAR_TOOL_USES, "keep": {"type": "tool_uses", "value": True}}),
            f"{CTU}.keep.value",
        ),
        (
            edits({"type": CLEAR_TOOL_USES, "keep": {"type": "tool_uses", "value": 2.5}}),
            f"{CTU}.keep.value",
        ),
        (edits({"type": CLEAR_TOOL_USES, "keep": {"type": "tool_uses"}}), f"{CTU}.keep.value"),
        (
            edits({"type": CLEAR_TOOL_USES, "keep": {"type": "input_tokens", "value": 3}}),
            f"{CTU}.keep.type",
        ),
        (edits({"type": CLEAR_TOOL_USES, "keep": 3}), f"{CTU}.keep"),
        (
            edits({"type": CLEAR_TOOL_USES, "trigger": {"type": "turns", "value": 3}}),
            f"{CTU}.trigger.type",
        ),
        (
            edits({"type": CLEAR_TOOL_USES, "trigger": {"type": "tool_uses", "value": 0}}),
            f"{CTU}.trigger.value",
        ),
        (edits({"type": CLEAR_TOOL_USES, "trigger": 100}), f"{CTU}.trigger"),
        (
            edits({"type": CLEAR_TOOL_USES, "clear_at_least": {"type": "tool_uses", "value": 1}}),
            f"{CTU}.clear_at_least.type",
        ),
        (edits({"type": CLEAR_TOOL_USES, "exclude_tools": "memory"}), f"{CTU}.exclude_tools"),
        (edits({"type": CLEAR_TOOL_USES, "exclude_tools": ["memory", 3]}), f"{CTU}.exclude_tools"),
        (edits({"type": CLEAR_TOOL_USES, "clear_tool_inputs": "yes"}), f"{CTU}.clear_tool_inputs"),
        (edits({"type": CLEAR_THINKING, "keep": "some"}), f"{CTU}.keep"),
        (
            edits({"type": CLEAR_THINKING, "keep": {"type": "tool_uses", "value": 1}}),
            f"{CTU}.keep.type",
        ),
        (
            edits({"type": CLEAR_THINKING, "keep": {"type": "thinking_turns", "value": -2}}),
            f"{CTU}.keep.value",
        ),
        (
            edits({"type": CLEAR_THINKING, "trigger": {"type": "input_tokens", "value": 9}}),
            f"{CTU}.trigger",
        ),
        (
            edits({"type": COMPACT, "trigger": {"type": "tool_uses", "value": 9}}),
            f"{CTU}.trigger.type",
        ),
        (edits({"type": COMPACT, "instructions": ["be brief"]}), f"{CTU}.instructions"),
        (
            edits({"type": COMPACT, "pause_after_compaction": "yes"}),
            f"{CTU}.pause_after_compaction",
        ),
        (edits({"type": COMPACT, "keep": {"type": "tool_uses", "value": 1}}), f"{CTU}.keep"),
    ],
)
def test_an_edit_the_api_refuses_is_refused_naming_its_field(management: Any, param: str) -> None:
    """Every shape the API would refuse raises NativeEditError whose param (and message)
    names the offending field, as the API's 400 does."""
    with pytest.raises(NativeEditError) as refused:
        parse_edits(management)
    assert refused.value.param == param
    assert str(refused.value).startswith(f"{param}: ")
    assert isinstance(refused.value, ValueError)


def test_clear_thinking_is_taken_first_only() -> None:
    """clear_thinking is accepted as the first edit, with others after it."""
    parsed = parse_edits(edits({"type": CLEAR_THINKING}, {"type": CLEAR_TOOL_USES}))
    assert parsed.kinds == (CLEAR_THINKING, CLEAR_TOOL_USES)


def test_a_plan_polyfills_only_in_polyfill_mode_and_with_edits() -> None:
    """Only a polyfill plan with edits asks the pipeline to apply them; the report's view
    of a plan names its mode, API, edits and reason."""
    some = parse_edits(edits({"type": CLEAR_THINKING}, {"type": CLEAR_TOOL_USES}))
    assert NativePlan("polyfill", some, "because").polyfilled
    assert not NativePlan("polyfill", NativeEdits(), "because").polyfilled
    for mode in ("honour", "prefer", "off"):
        assert not NativePlan(mode, some, "because").polyfilled
    assert NativePlan("polyfill", some, "no field upstream").as_dict() == {
        "mode": "polyfill",
        "api": "anthropic",
        "edits": [CLEAR_THINKING, CLEAR_TOOL_USES],
        "reason": "no field upstream",
    }


# -- stepped_back ---------------------------------------------------------------------------


def test_nothing_delegated_leaves_the_policy_as_it_is() -> None:
    """No edits, or thinking clearing alone, change nothing in the policy."""
    policy = Policy(filter_tokens=2_000, trigger=0.6)
    assert stepped_back(policy, NativeEdits()) is policy
    assert stepped_back(policy, parse_edits(edits({"type": CLEAR_THINKING}))) is policy


def test_compaction_delegated_waits_for_the_budgets_edge() -> None:
    """With compact asked of the provider, the gateway prepares, lightens and compacts only
    from its emergency level and does not prune old tool outputs; the filter stays."""
    policy = Policy(emergency=0.85, filter_tokens=2_000)
    back = stepped_back(policy, parse_edits(edits({"type": COMPACT})))
    assert (back.prepare, back.light, back.trigger) == (0.85, 0.85, 0.85)
    assert (back.emergency, back.target, back.filter_tokens) == (0.85, 0.45, 2_000)
    assert (back.soft_ratio, back.hard_ratio) == (1.0, 1.0)


def test_tool_clearing_delegated_stops_filtering_and_pruning() -> None:
    """With tool uses' clearing asked, tool outputs are neither filtered nor pruned; the
    compaction levels stay."""
    policy = Policy()
    back = stepped_back(policy, parse_edits(edits({"type": CLEAR_TOOL_USES})))
    assert (back.filter_tokens, back.soft_ratio, back.hard_ratio) == (1_000_000, 1.0, 1.0)
    assert (back.prepare, back.light, back.trigger) == (
        policy.prepare,
        policy.light,
        policy.trigger,
    )


def big_tool_history() -> list[dict[str, Any]]:
    call = {"id": "c1", "type": "function", "function": {"name": "export", "arguments": "{}"}}
    output = "".join(f"{i:05d} booking BK{i:06d} confirmed seat {i % 40}A\n" for i in range(2_000))
    return [
        {"role": "user", "content": "Export the bookings."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": output},
    ]


async def test_a_stepped_back_policy_leaves_a_big_tool_output_unfiltered() -> None:
    """The filter offloads a tool output over its limit under the policy, and leaves it
    as sent once the client delegated tool clearing."""
    messages = big_tool_history()
    request = {"model": "gpt-4o", "messages": messages}
    pipeline = Pipeline(stages=[Filter()], store=MemoryStore())
    policy = Policy()
    filtered = await pipeline.compact(request, policy=policy)
    assert filtered.report.tokens_before > policy.filter_tokens
    assert filtered.request["messages"][2]["content"] != messages[2]["content"]
    back = stepped_back(policy, parse_edits(edits({"type": CLEAR_TOOL_USES})))
    kept = await pipeline.compact(request, policy=back)
    assert kept.request["messages"] == messages
    assert kept.report.actions == []


def long_chat(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Start the audit."}]
    for i in range(turns):
        answer = " ".join(f"w{i}x{j}" for j in range(120))
        question = " ".join(f"q{i}y{j}" for j in range(120))
        messages.append({"role": "assistant", "content": f"Answer {i}: {answer}"})
        messages.append({"role": "user", "content": f"Question {i + 1}: {question}"})
    return messages


async def test_a_stepped_back_policy_does_not_compact_under_the_edge() -> None:
    """A conversation between the policy's trigger and its emergency level is compacted
    under the policy, and goes as sent once the client asked for compaction itself."""
    request: dict[str, Any] = {"model": "gpt-4o", "messages": long_chat(9)}
    policy = Policy(mode="truncate", max_input=10_000)
    pipeline = Pipeline(store=MemoryStore())
    compacted = await pipeline.compact(request, policy=policy)
    before = compacted.report.tokens_before
    assert policy.trigger * 10_000 < before < policy.emergency * 10_000
    assert "compress" in compacted.report.actions
    assert compacted.report.tokens_after < before
    back = stepped_back(policy, parse_edits(edits({"type": COMPACT})))
    kept = await pipeline.compact(request, policy=back)
    assert "compress" not in kept.report.actions
    assert kept.report.tokens_after == before
    assert [m["content"] for m in kept.request["messages"]] == [
        m["content"] for m in request["messages"]
    ]
