"""Provider-native context management: the edits a client asks the provider's API to make
to its context, read once, and what the pipeline does about them.

Anthropic's ``context_management.edits`` (beta ``context-management-2025-06-27`` and
``compact-2026-01-12``) name up to three edits, each applied by the API before the model
reads the request:

- ``clear_tool_uses_20250919``: once the request is over its ``trigger`` (input tokens, or
  tool uses; default 100,000 input tokens), the results of every tool use but the latest
  ``keep`` (default 3) are cleared, oldest first, except the uses of ``exclude_tools``;
  ``clear_tool_inputs`` clears the cleared uses' inputs too (all, or those of the tools it
  lists); with ``clear_at_least``, nothing is cleared unless that many tokens would be.
- ``clear_thinking_20251015``: the thinking of every assistant turn but the latest
  ``keep`` thinking turns (default 1; ``"all"`` keeps every one) is dropped.
- ``compact_20260112``: once the request reaches its ``trigger`` (default 150,000 input
  tokens), the conversation is summarised into a ``compaction`` block that begins the
  answer; the client sends it back and the API drops what precedes it.

What the pipeline does with them is a ``NativePlan``, decided by the host, which knows the
upstream, under the policy's ``native`` key:

- ``honour``: the upstream applies them. The request goes up with them as sent, and the
  pipeline steps back from what the client delegated (``stepped_back``): no compaction or
  pruning of its own below the budget's edge when the client asked for compaction, no tool output
  filtered or pruned when it asked for tool uses to be cleared, no thinking dropped when it
  asked for thinking to be cleared. Hygiene and the budget guards stay on.
- ``polyfill``: the upstream cannot apply them, so the gateway does: the clearing edits
  in the ``native_edits`` stage, the tool results and inputs it clears offloaded first
  behind placeholders naming their refs (cleared thinking is dropped, as the API drops
  it), the compaction in the host (``gateway.context.native_request``). The pipeline
  steps back as for ``honour``. The answer reports the edits applied in the API's own
  shape.
- ``prefer``: the client asked for none, and the gateway asks the provider for its
  compaction instead of writing its own summary (the host adds the edit); the pipeline
  steps back as for ``honour``.
With the policy's ``native=off`` there is no plan: the gateway ignores them (the request
still carries what the client sent).

Everything here is pure: parsing (``parse_edits``, which raises ``NativeEditError`` naming
the offending field, as the API's 400 would) and the policy adjustment.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

from pipelines.policy import Policy

__all__ = [
    "CLEAR_THINKING",
    "CLEAR_TOOL_USES",
    "COMPACT",
    "ClearThinking",
    "ClearToolUses",
    "Compact",
    "NativeEditError",
    "NativeEdits",
    "NativePlan",
    "on_demand",
    "parse_edits",
    "stepped_back",
]

CLEAR_TOOL_USES: Final = "clear_tool_uses_20250919"
CLEAR_THINKING: Final = "clear_thinking_20251015"
COMPACT: Final = "compact_20260112"

DEFAULT_CLEAR_TRIGGER: Final = 100_000
DEFAULT_KEEP_TOOL_USES: Final = 3
DEFAULT_KEEP_THINKING: Final = 1
DEFAULT_COMPACT_TRIGGER: Final = 150_000

PlanMode = Literal["honour", "polyfill", "prefer", "off"]


class NativeEditError(ValueError):
    """A ``context_management`` the API would refuse: ``param`` names the field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


@dataclass(frozen=True, slots=True)
class ClearToolUses:
    trigger_kind: Literal["input_tokens", "tool_uses"] = "input_tokens"
    trigger: int = DEFAULT_CLEAR_TRIGGER
    keep: int = DEFAULT_KEEP_TOOL_USES
    clear_at_least: int = 0
    exclude_tools: frozenset[str] = frozenset()
    clear_inputs: bool | frozenset[str] = False
    """``True``: every cleared use's input; a set: the inputs of these tools only."""

    def clears_input(self, tool: str) -> bool:
        inputs = self.clear_inputs
        return inputs if isinstance(inputs, bool) else tool in inputs


@dataclass(frozen=True, slots=True)
class ClearThinking:
    keep: int | None = DEFAULT_KEEP_THINKING
    """Thinking turns kept, newest first; ``None``: all of them."""
    given: bool = True
    """Whether the client gave ``keep``: without it, the model's default applies (a model
    that keeps earlier turns' thinking keeps all of them, another the latest turn's)."""


@dataclass(frozen=True, slots=True)
class Compact:
    trigger: int = DEFAULT_COMPACT_TRIGGER
    instructions: str | None = None
    pause_after_compaction: bool = False


@dataclass(frozen=True, slots=True)
class NativeEdits:
    """The edits of one request's ``context_management``, at most one of each kind."""

    clear_tool_uses: ClearToolUses | None = None
    clear_thinking: ClearThinking | None = None
    compact: Compact | None = None

    @property
    def kinds(self) -> tuple[str, ...]:
        """The edits' wire names, in the API's order."""
        named = (
            (CLEAR_THINKING, self.clear_thinking),
            (CLEAR_TOOL_USES, self.clear_tool_uses),
            (COMPACT, self.compact),
        )
        return tuple(name for name, edit in named if edit is not None)

    def __bool__(self) -> bool:
        return bool(self.kinds)


@dataclass(frozen=True, slots=True)
class NativePlan:
    """What the pipeline does about one request's native context management."""

    mode: PlanMode
    edits: NativeEdits
    reason: str
    """Why this mode, in a sentence for the dry run's report."""
    api: Literal["anthropic", "openai"] = "anthropic"
    """Whose context management: Anthropic's edits, or the Responses API's compaction."""
    host_tools: frozenset[str] = frozenset()
    """Tools the host adds to the client's request (the gateway's restore tool): not the
    client's, so not counted against its input-tokens triggers."""

    @property
    def polyfilled(self) -> bool:
        return self.mode == "polyfill" and bool(self.edits)

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "api": self.api,
            "edits": list(self.edits.kinds),
            "reason": self.reason,
        }


def parse_edits(management: Any) -> NativeEdits:
    """The edits of an Anthropic ``context_management`` object (``None`` or absent: none),
    checked as the API checks them."""
    if management is None:
        return NativeEdits()
    if not isinstance(management, Mapping):
        raise NativeEditError("context_management", "must be an object")
    edits = management.get("edits")
    if edits is None:
        return NativeEdits()
    if not isinstance(edits, list):
        raise NativeEditError("context_management.edits", "must be an array")
    found: dict[str, Any] = {}
    for index, edit in enumerate(edits):
        where = f"context_management.edits.{index}"
        if not isinstance(edit, Mapping):
            raise NativeEditError(where, "must be an object")
        kind = edit.get("type")
        if not isinstance(kind, str):
            raise NativeEditError(f"{where}.type", "must be a string naming the edit")
        if kind in found:
            raise NativeEditError(f"{where}.type", f"{kind} is given more than once")
        if kind == CLEAR_TOOL_USES:
            found[kind] = _clear_tool_uses(edit, where)
        elif kind == CLEAR_THINKING:
            if index != 0:
                raise NativeEditError(
                    f"{where}.type", f"{CLEAR_THINKING} must be the first edit when given"
                )
            found[kind] = _clear_thinking(edit, where)
        elif kind == COMPACT:
            found[kind] = _compact(edit, where)
        else:
            known = ", ".join((CLEAR_TOOL_USES, CLEAR_THINKING, COMPACT))
            raise NativeEditError(f"{where}.type", f"unknown edit {kind!r}; known: {known}")
    return NativeEdits(found.get(CLEAR_TOOL_USES), found.get(CLEAR_THINKING), found.get(COMPACT))


def on_demand(compaction: Any) -> Compact | None:
    """The compaction a Messages request's top-level ``compaction`` asks for now (beta
    ``compact-2026-09-04``: ``{"type": "summarize", "instructions": ...}``): at once,
    the block alone in the answer; ``None`` when it asks none."""
    if compaction is None:
        return None
    if not isinstance(compaction, Mapping) or compaction.get("type") != "summarize":
        raise NativeEditError("compaction.type", "must be 'summarize'")
    instructions = compaction.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise NativeEditError("compaction.instructions", "must be a string")
    text = instructions.strip() if isinstance(instructions, str) else ""
    return Compact(trigger=0, instructions=text or None, pause_after_compaction=True)


def stepped_back(policy: Policy, edits: NativeEdits) -> Policy:
    """``policy`` without what the client delegated to the provider: the gateway's own
    compaction (and its pruning of old tool outputs on a cold cache) waits for the
    budget's edge (``emergency``) when the client asked for compaction; tool outputs are
    neither filtered nor pruned when it asked for tool uses to be cleared (the edit
    decides what goes, and when)."""
    changes: dict[str, Any] = {}
    if edits.compact is not None:
        edge = policy.emergency
        if edge > policy.target:  # else the policy's own trigger is as late as it gets
            changes.update(prepare=edge, light=edge, trigger=edge)
        changes.update(soft_ratio=1.0, hard_ratio=1.0)
    if edits.clear_tool_uses is not None:
        changes.update(filter_tokens=1_000_000, soft_ratio=1.0, hard_ratio=1.0)
    return replace(policy, **changes) if changes else policy


def _clear_tool_uses(edit: Mapping[str, Any], where: str) -> ClearToolUses:
    _only(edit, where, {"trigger", "keep", "clear_at_least", "exclude_tools", "clear_tool_inputs"})
    trigger_kind, trigger = _count(
        edit.get("trigger"),
        f"{where}.trigger",
        ("input_tokens", "tool_uses"),
        ("input_tokens", DEFAULT_CLEAR_TRIGGER),
    )
    _, keep = _count(
        edit.get("keep"),
        f"{where}.keep",
        ("tool_uses",),
        ("tool_uses", DEFAULT_KEEP_TOOL_USES),
        zero=True,
    )
    _, least = _count(
        edit.get("clear_at_least"),
        f"{where}.clear_at_least",
        ("input_tokens",),
        ("input_tokens", 0),
        zero=True,
    )
    exclude = _names(edit.get("exclude_tools"), f"{where}.exclude_tools")
    inputs = edit.get("clear_tool_inputs")
    clear_inputs: bool | frozenset[str]
    if inputs is None or isinstance(inputs, bool):
        clear_inputs = bool(inputs)
    else:
        clear_inputs = _names(inputs, f"{where}.clear_tool_inputs")
    kind: Literal["input_tokens", "tool_uses"] = (
        "tool_uses" if trigger_kind == "tool_uses" else "input_tokens"
    )
    return ClearToolUses(kind, trigger, keep, least, exclude, clear_inputs)


def _clear_thinking(edit: Mapping[str, Any], where: str) -> ClearThinking:
    _only(edit, where, {"keep"})
    keep = edit.get("keep")
    if keep is None:
        return ClearThinking(given=False)
    if keep == "all" or (isinstance(keep, Mapping) and keep.get("type") == "all"):
        return ClearThinking(None)
    _, value = _count(keep, f"{where}.keep", ("thinking_turns",), ("thinking_turns", 1), zero=True)
    return ClearThinking(value)


def _compact(edit: Mapping[str, Any], where: str) -> Compact:
    _only(edit, where, {"trigger", "instructions", "pause_after_compaction"})
    _, trigger = _count(
        edit.get("trigger"),
        f"{where}.trigger",
        ("input_tokens",),
        ("input_tokens", DEFAULT_COMPACT_TRIGGER),
    )
    instructions = edit.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise NativeEditError(f"{where}.instructions", "must be a string")
    pause = edit.get("pause_after_compaction", False)
    if not isinstance(pause, bool):
        raise NativeEditError(f"{where}.pause_after_compaction", "must be a boolean")
    return Compact(trigger, instructions or None, pause)


def _only(edit: Mapping[str, Any], where: str, allowed: set[str]) -> None:
    extra = sorted(set(edit) - allowed - {"type"})
    if extra:
        raise NativeEditError(f"{where}.{extra[0]}", "Extra inputs are not permitted")


def _count(
    value: Any,
    where: str,
    kinds: Sequence[str],
    default: tuple[str, int],
    *,
    zero: bool = False,
) -> tuple[str, int]:
    """A ``{"type": kind, "value": n}`` object's kind and whole ``n`` (``default`` when
    ``value`` is absent)."""
    if value is None:
        return default
    if not isinstance(value, Mapping):
        raise NativeEditError(where, "must be an object with type and value")
    kind, number = value.get("type"), value.get("value")
    if kind not in kinds:
        raise NativeEditError(f"{where}.type", f"must be one of {', '.join(kinds)}")
    if isinstance(number, bool) or not isinstance(number, int) or number < (0 if zero else 1):
        low = 0 if zero else 1
        raise NativeEditError(f"{where}.value", f"must be a whole number >= {low}")
    return str(kind), number


def _names(value: Any, where: str) -> frozenset[str]:
    if value is None:
        return frozenset()
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise NativeEditError(where, "must be an array of tool names")
    return frozenset(value)
