"""Groups, priorities and protection: the units compaction will work on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipelines.groups import (
    ANSWER,
    CALL_OR_ERROR,
    OTHER_ASSISTANT,
    TOOL_RESULT,
    USER,
    goal_terms,
    protect,
    split_groups,
)
from pipelines.tokens import TokenCounter

TRACES = Path(__file__).resolve().parents[2] / "bench" / "data" / "tau-bench-gpt-4o-airline.json"
COUNTER = TokenCounter()


def call(call_id: str, name: str = "f", arguments: str = "{}") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_priorities() -> None:
    """Users 0, answers 1, failed tool groups 2, interim assistant text 3, successful tool
    groups 4; a group mentioning a goal term is raised one level."""
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "Cancel reservation ZFA04Y please"},
        {"role": "assistant", "content": "Let me look."},
        {"role": "assistant", "content": None, "tool_calls": [call("a")]},
        {"role": "tool", "tool_call_id": "a", "content": "Error: not found"},
        {"role": "assistant", "content": None, "tool_calls": [call("b")]},
        {"role": "tool", "tool_call_id": "b", "content": '{"ok": true}'},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [call("c", "get", '{"id": "ZFA04Y"}')],
        },
        {"role": "tool", "tool_call_id": "c", "content": '{"ok": true}'},
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "Thanks"},
    ]
    terms = goal_terms(messages)
    assert "ZFA04Y" in terms
    groups = split_groups(messages, terms)
    assert [(g.start, g.end) for g in groups] == [
        (0, 1),
        (1, 2),
        (2, 3),
        (3, 5),
        (5, 7),
        (7, 9),
        (9, 10),
        (10, 11),
    ]
    assert [g.priority for g in groups][1:] == [
        USER,
        OTHER_ASSISTANT,
        CALL_OR_ERROR,
        TOOL_RESULT,
        TOOL_RESULT - 1,
        ANSWER,
        USER,
    ]


def test_groups_partition_real_traces_without_splitting_calls() -> None:
    """On every tau-bench trajectory the groups cover each message once, and every tool
    message sits in the group of the call it answers."""
    for trajectory in json.loads(TRACES.read_text()):
        messages = trajectory["traj"]
        groups = split_groups(messages, goal_terms(messages))
        assert [i for g in groups for i in range(g.start, g.end)] == list(range(len(messages)))
        for group in groups:
            ids = {c["id"] for c in messages[group.start].get("tool_calls") or ()}
            for message in messages[group.start + 1 : group.end]:
                assert message["tool_call_id"] in ids


def test_protection_on_real_traces() -> None:
    """System prompt, anchor, latest user message and a tail of whole groups (at least two
    messages, at most 1.5x the tail budget unless reaching two messages takes more) are
    protected."""
    for trajectory in json.loads(TRACES.read_text())[:50]:
        messages = trajectory["traj"]
        groups = split_groups(messages)
        protection = protect(
            messages, groups, budget=8_000, tail_ratio=0.2, tokens_of=COUNTER.count_message
        )
        assert 0 in protection.indices
        assert 1 in protection.indices
        latest_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
        assert latest_user in protection.indices
        assert len(messages) - protection.tail_start >= 2
        assert any(g.start == protection.tail_start for g in groups)
        tail = sum(COUNTER.count_message(m) for m in messages[protection.tail_start :])
        minimal_start = next(g.start for g in reversed(groups) if len(messages) - g.start >= 2)
        minimal = sum(COUNTER.count_message(m) for m in messages[minimal_start:])
        assert tail <= max(1.5 * 0.2 * 8_000, minimal)


def test_huge_pins_release_the_anchor() -> None:
    """When the first and latest user messages take over half the budget, the anchor is
    released and only the latest user message stays pinned."""
    messages = [
        {"role": "user", "content": "word " * 3_000},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "more " * 3_000},
        {"role": "assistant", "content": "fine"},
        {"role": "user", "content": "last"},
    ]
    groups = split_groups(messages)
    relaxed = protect(
        messages, groups, budget=100_000, tail_ratio=0.0, tokens_of=COUNTER.count_message
    )
    tight = protect(messages, groups, budget=5_000, tail_ratio=0.0, tokens_of=COUNTER.count_message)
    assert {0, 1, 4} <= relaxed.indices
    assert 0 not in tight.indices
    assert 4 in tight.indices


def claude_code_history(turns: int) -> list[dict[str, Any]]:
    """Claude Code's shape: a system turn after the first user message (its environment),
    and one shown only until the next user turn after each later user message."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are Claude Code."},
        {"role": "user", "content": "Fix the build."},
        {"role": "system", "system_turn": True, "content": "Environment: Linux."},
        {"role": "assistant", "content": "On it."},
    ]
    for n in range(turns):
        messages.append({"role": "user", "content": f"Step {n}?"})
        messages.append(
            {
                "role": "system",
                "system_turn": True,
                "clear_at": "next_user_message",
                "content": f"Reminder {n}. " * 200,
            }
        )
        messages.append({"role": "assistant", "content": f"Did step {n}."})
    return messages


def test_the_anchors_reply_is_found_past_a_system_turn() -> None:
    """The reply to the first user message stays protected when the client put a system
    turn between them (Claude Code's environment message)."""
    messages = claude_code_history(3)
    protection = protect(
        messages,
        split_groups(messages),
        budget=100_000,
        tail_ratio=0.0,
        tokens_of=COUNTER.count_message,
    )
    assert {0, 1, 2, 3} <= protection.indices


def test_system_turns_no_longer_shown_are_the_least_of_the_history() -> None:
    """A system turn shown only until the next user turn, once one followed, is neither
    protected nor ranked as a system message: compaction may take it first. The current
    one, and every other system message, stay protected."""
    messages = claude_code_history(3)
    groups = split_groups(messages)
    protection = protect(
        messages, groups, budget=100_000, tail_ratio=0.0, tokens_of=COUNTER.count_message
    )
    stale = [5, 8]
    current = len(messages) - 2
    assert not set(stale) & protection.indices
    assert {0, 2, current} <= protection.indices
    priorities = {g.start: g.priority for g in groups}
    assert [priorities[i] for i in stale] == [TOOL_RESULT, TOOL_RESULT]
