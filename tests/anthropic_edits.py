"""Anthropic's server-side context management (beta), applied to a Messages request as
the API applies it: the reference the mock Claude answers with, and that a replay test can
compare a gateway's polyfill against.

A request's ``context_management.edits`` are applied in the order given, each to the
messages the edits before it left, after the API has dropped everything before the
latest ``compaction`` block the client sent back (``drop_before_compaction``):

- ``clear_tool_uses_20250919``: when the request is over its ``trigger`` (input tokens,
  or tool uses; by default 100,000 input tokens), the results of every tool use but the
  latest ``keep`` (default 3) become ``PLACEHOLDER``, oldest first, except the uses of
  ``exclude_tools``; ``clear_tool_inputs`` empties the cleared uses' inputs too (all of
  them, or those of the tools it names). With ``clear_at_least``, nothing is cleared
  unless the clearing would remove that many tokens.
- ``clear_thinking_20251015``: every assistant turn with thinking but the latest
  ``keep`` (default 1 thinking turn; ``"all"`` keeps them all) loses its thinking and
  redacted thinking blocks.
- ``compact_20260112``: when the request is over its ``trigger`` (default 150,000 input
  tokens), the answer begins with a ``compaction`` block; with ``pause_after_compaction``
  the answer is that block alone, stopped for ``"compaction"``.

A clearing edit is reported (``applied_edits``) only when it cleared something. Tokens are
counted by a ``Count`` given by the caller (a gateway's own counter, say), on the
request's prompt (``input_tokens``) and on what an edit changes: a tool result or use
block by block, thinking turn by turn, each before less after. Nothing here changes the
request it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

__all__ = [
    "CLEAR_THINKING",
    "CLEAR_TOOL_USES",
    "COMPACT",
    "COMPACT_BETA",
    "CONTEXT_MANAGEMENT_BETA",
    "PLACEHOLDER",
    "Applied",
    "Count",
    "EditError",
    "apply_edits",
    "clear_thinking",
    "clear_tool_uses",
    "compaction_due",
    "drop_before_compaction",
    "edits_of",
    "input_tokens",
    "json_tokens",
    "missing_beta",
]

Count = Callable[[Any], int]
"""The tokens of a JSON value."""

CLEAR_TOOL_USES: Final = "clear_tool_uses_20250919"
CLEAR_THINKING: Final = "clear_thinking_20251015"
COMPACT: Final = "compact_20260112"
CONTEXT_MANAGEMENT_BETA: Final = "context-management-2025-06-27"
COMPACT_BETA: Final = "compact-2026-01-12"
PLACEHOLDER: Final = "[cleared to save context]"
"""What a cleared tool result's content becomes."""

DEFAULT_CLEAR_TRIGGER: Final = 100_000
DEFAULT_KEEP_TOOL_USES: Final = 3
DEFAULT_KEEP_THINKING: Final = 1
DEFAULT_COMPACT_TRIGGER: Final = 150_000
THINKING_BLOCKS: Final = frozenset({"thinking", "redacted_thinking"})
PROMPT_FIELDS: Final = ("system", "tools")
"""The request's fields counted with its messages as its input tokens."""


class EditError(ValueError):
    """A ``context_management`` the API refuses with a 400: ``param`` names the field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


@dataclass(frozen=True, slots=True)
class Applied:
    """What the API made of one request's edits."""

    messages: list[dict[str, Any]]
    """The messages the model reads: after the drop before a compaction block and every
    edit."""
    applied_edits: list[dict[str, Any]] = field(default_factory=list)
    """The clearing edits that cleared something, in the answer's
    ``context_management.applied_edits`` shape, in the order applied."""
    compaction_due: bool = False
    """Whether the answer begins with a ``compaction`` block."""
    pause_after_compaction: bool = False
    """Whether that block is the whole answer (only when ``compaction_due``)."""
    instructions: str | None = None
    """The compact edit's instructions for its summary, if it gave any."""
    cleared_tool_use_ids: list[str] = field(default_factory=list)
    """The ids of the tool uses cleared, oldest first."""
    dropped_turns: int = 0
    """The turns dropped whole before the latest compaction block."""
    original_input_tokens: int = 0
    """The request's input tokens as sent."""
    input_tokens: int = 0
    """The input tokens of the prompt the model reads."""


def json_tokens(value: Any) -> int:
    """A rough token count of a JSON value: a quarter of its JSON's length."""
    return len(orjson.dumps(value)) // 4


def input_tokens(
    body: Mapping[str, Any], messages: Sequence[Any], count: Count = json_tokens
) -> int:
    """The input tokens of ``body`` with ``messages`` as its messages: ``count`` of an
    object holding its ``system`` and ``tools`` (those it has) and the messages."""
    prompt = {name: body[name] for name in PROMPT_FIELDS if name in body}
    prompt["messages"] = list(messages)
    return count(prompt)


def edits_of(body: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    """The edits of the request ``body`` (``None`` when it has no ``context_management``),
    checked as far as the API's 400s go: known types, each given once, the thinking edit
    first."""
    management = body.get("context_management")
    if management is None:
        return None
    if not isinstance(management, Mapping):
        raise EditError("context_management", "Input should be an object")
    edits = management.get("edits") or []
    if not isinstance(edits, list):
        raise EditError("context_management.edits", "Input should be a valid list")
    seen: set[str] = set()
    for index, edit in enumerate(edits):
        where = f"context_management.edits.{index}"
        if not isinstance(edit, Mapping):
            raise EditError(where, "Input should be an object")
        kind = edit.get("type")
        if kind not in (CLEAR_TOOL_USES, CLEAR_THINKING, COMPACT):
            raise EditError(f"{where}.type", f"unknown edit type {kind!r}")
        if kind in seen:
            raise EditError(f"{where}.type", f"{kind} is given more than once")
        if kind == CLEAR_THINKING and index:
            raise EditError(f"{where}.type", f"{CLEAR_THINKING} must be the first edit")
        seen.add(kind)
    return list(edits)


def missing_beta(edits: Sequence[Mapping[str, Any]], betas: Collection[str]) -> str | None:
    """Why the API refuses ``edits`` under the ``anthropic-beta`` names ``betas``, or
    ``None``: a clearing edit needs ``CONTEXT_MANAGEMENT_BETA``, a compact edit that or
    ``COMPACT_BETA``, and ``context_management`` without edits either."""
    if not edits and not {CONTEXT_MANAGEMENT_BETA, COMPACT_BETA} & set(betas):
        return f"context_management: requires the anthropic-beta {CONTEXT_MANAGEMENT_BETA}"
    for index, edit in enumerate(edits):
        kind = edit.get("type")
        allowed = {CONTEXT_MANAGEMENT_BETA} | ({COMPACT_BETA} if kind == COMPACT else set())
        if not allowed & set(betas):
            wanted = COMPACT_BETA if kind == COMPACT else CONTEXT_MANAGEMENT_BETA
            return f"context_management.edits.{index}: {kind} requires the anthropic-beta {wanted}"
    return None


def drop_before_compaction(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` from the latest compaction block of an assistant turn on: that turn
    from the block on, then every later turn. A block without content (a failed
    compaction) drops nothing, as the API treats it."""
    for at in range(len(messages) - 1, -1, -1):
        turn = messages[at]
        content = turn.get("content")
        if turn.get("role") != "assistant" or not isinstance(content, list):
            continue
        for block_at in range(len(content) - 1, -1, -1):
            block = content[block_at]
            if block.get("type") == "compaction" and block.get("content") is not None:
                head = {**turn, "content": list(content[block_at:])}
                return [head, *(dict(t) for t in messages[at + 1 :])]
    return [dict(turn) for turn in messages]


def clear_thinking(
    messages: Sequence[Mapping[str, Any]], edit: Mapping[str, Any], count: Count = json_tokens
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """``messages`` with the thinking of every assistant turn but the latest ``keep``
    thinking turns removed, and the applied edit (``None`` when none was cleared). A turn
    that held only thinking is left with no content."""
    out = [dict(turn) for turn in messages]
    keep = _thinking_kept(edit.get("keep"))
    if keep is None:
        return out, None
    turns = [at for at, turn in enumerate(out) if _thinks(turn)]
    older = turns[: max(0, len(turns) - keep)]
    tokens = 0
    for at in older:
        before = out[at]
        after = {**before, "content": [b for b in before["content"] if not _is_thinking(b)]}
        tokens += count(before) - count(after)
        out[at] = after
    if not older:
        return out, None
    applied = {
        "type": CLEAR_THINKING,
        "cleared_thinking_turns": len(older),
        "cleared_input_tokens": max(0, tokens),
    }
    return out, applied


def clear_tool_uses(
    body: Mapping[str, Any],
    messages: Sequence[Mapping[str, Any]],
    edit: Mapping[str, Any],
    count: Count = json_tokens,
) -> tuple[list[dict[str, Any]], dict[str, Any] | None, list[str]]:
    """``messages`` (those of ``body``, as the edits before left them) with the tool uses
    the edit clears cleared, the applied edit (``None`` when none was) and the ids of the
    cleared uses, oldest first."""
    out = [dict(turn) for turn in messages]
    uses = [
        (at, block_at, block)
        for at, turn in enumerate(out)
        if turn.get("role") == "assistant" and isinstance(turn.get("content"), list)
        for block_at, block in enumerate(turn["content"])
        if block.get("type") == "tool_use"
    ]
    trigger_kind, trigger = _amount(edit.get("trigger"), ("input_tokens", DEFAULT_CLEAR_TRIGGER))
    measure = len(uses) if trigger_kind == "tool_uses" else input_tokens(body, out, count)
    if measure <= trigger:
        return out, None, []
    _, keep = _amount(edit.get("keep"), ("tool_uses", DEFAULT_KEEP_TOOL_USES))
    _, least = _amount(edit.get("clear_at_least"), ("input_tokens", 0))
    exclude = set(edit.get("exclude_tools") or ())
    inputs = edit.get("clear_tool_inputs")
    results = {
        block.get("tool_use_id"): (at, block_at)
        for at, turn in enumerate(out)
        if turn.get("role") == "user" and isinstance(turn.get("content"), list)
        for block_at, block in enumerate(turn["content"])
        if block.get("type") == "tool_result"
    }
    changes: list[tuple[int, int, dict[str, Any]]] = []
    """(turn, block, the block cleared) for every block the clearing changes."""
    cleared: list[str] = []
    tokens = 0
    for at, block_at, use in uses[: max(0, len(uses) - keep)]:
        name = use.get("name")
        if name in exclude:
            continue
        changed = False
        where = results.get(use.get("id"))
        if where is not None:
            result = out[where[0]]["content"][where[1]]
            if result.get("content") != PLACEHOLDER:
                new = {**result, "content": PLACEHOLDER}
                tokens += count(result) - count(new)
                changes.append((*where, new))
                changed = True
        clears_input = inputs is True or (isinstance(inputs, list) and name in inputs)
        if clears_input and use.get("input") != {}:
            new = {**use, "input": {}}
            tokens += count(use) - count(new)
            changes.append((at, block_at, new))
            changed = True
        if changed:
            cleared.append(str(use.get("id")))
    if not cleared or tokens < least:
        return out, None, []
    for at, block_at, new in changes:
        content = list(out[at]["content"])
        content[block_at] = new
        out[at] = {**out[at], "content": content}
    applied = {
        "type": CLEAR_TOOL_USES,
        "cleared_tool_uses": len(cleared),
        "cleared_input_tokens": max(0, tokens),
    }
    return out, applied, cleared


def compaction_due(
    body: Mapping[str, Any],
    messages: Sequence[Mapping[str, Any]],
    edit: Mapping[str, Any],
    count: Count = json_tokens,
) -> bool:
    """Whether the compact ``edit`` compacts ``body`` with ``messages``: its input tokens
    are over the edit's trigger."""
    _, trigger = _amount(edit.get("trigger"), ("input_tokens", DEFAULT_COMPACT_TRIGGER))
    return input_tokens(body, messages, count) > trigger


def apply_edits(body: Mapping[str, Any], count: Count = json_tokens) -> Applied:
    """The request ``body``'s ``context_management.edits`` applied to its messages, as the
    API applies them before the model reads them (raises ``EditError`` for edits the API
    refuses; without edits, only the drop before a compaction block)."""
    sent = [turn for turn in body.get("messages") or () if isinstance(turn, Mapping)]
    messages = drop_before_compaction(sent)
    dropped = len(sent) - len(messages)
    applied: list[dict[str, Any]] = []
    cleared: list[str] = []
    due = pause = False
    instructions: str | None = None
    for edit in edits_of(body) or ():
        kind = edit.get("type")
        if kind == CLEAR_THINKING:
            messages, done = clear_thinking(messages, edit, count)
        elif kind == CLEAR_TOOL_USES:
            messages, done, ids = clear_tool_uses(body, messages, edit, count)
            cleared += ids
        else:
            done = None
            due = compaction_due(body, messages, edit, count)
            pause = due and bool(edit.get("pause_after_compaction"))
            instructions = edit.get("instructions") or None
        if done is not None:
            applied.append(done)
    return Applied(
        messages=messages,
        applied_edits=applied,
        compaction_due=due,
        pause_after_compaction=pause,
        instructions=instructions,
        cleared_tool_use_ids=cleared,
        dropped_turns=dropped,
        original_input_tokens=input_tokens(body, sent, count),
        input_tokens=input_tokens(body, messages, count),
    )


def _amount(value: Any, default: tuple[str, int]) -> tuple[str, int]:
    """A ``{"type": kind, "value": n}`` object's kind and ``n``; ``default`` when absent."""
    if not isinstance(value, Mapping):
        return default
    return str(value.get("type", default[0])), int(value.get("value", default[1]))


def _thinking_kept(keep: Any) -> int | None:
    """The thinking turns a ``keep`` keeps; ``None`` for all of them."""
    if keep is None:
        return DEFAULT_KEEP_THINKING
    if keep == "all" or (isinstance(keep, Mapping) and keep.get("type") == "all"):
        return None
    return _amount(keep, ("thinking_turns", DEFAULT_KEEP_THINKING))[1]


def _thinks(turn: Mapping[str, Any]) -> bool:
    content = turn.get("content")
    return (
        turn.get("role") == "assistant"
        and isinstance(content, list)
        and any(map(_is_thinking, content))
    )


def _is_thinking(block: Any) -> bool:
    return isinstance(block, Mapping) and block.get("type") in THINKING_BLOCKS
