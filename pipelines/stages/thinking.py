"""Stage 2: reasoning cleanup, by the model's thinking style in the catalog.

- ``anthropic``: ``thinking`` and ``redacted_thinking`` blocks (signatures and all) are
  kept where the model keeps them. A request that asks for its own thinking cleanup
  (Anthropic's ``context_management`` edit ``clear_thinking_20251015``, as Claude Code
  sends with ``keep: "all"``) has every block kept as sent: the API applies the edit.
  Otherwise the model's default decides (the catalog's ``keeps_thinking``): a model that
  keeps earlier turns' thinking (Claude Opus 4.5 and later) is sent every block; another
  only those of the current turn (after the last user message, where the API needs them
  during tool use; a user message right after tool results is part of their user turn on
  the wire, not a new one), the older ones dropped, which the API would ignore. The blocks
  come either as content parts or, as the gateway's Anthropic codec carries them, in an
  assistant message's ``thinking_blocks`` list; both are treated alike.
  ``reasoning_content`` (an OpenAI-compatible field) is dropped so that it is not counted:
  no Anthropic wire carries it, so that alone changes nothing that goes up and is no
  action (``StageContext.off_the_wire``).
- ``reasoning_echo`` (DeepSeek, Kimi, MiMo): ``reasoning_content`` is dropped from assistant
  messages before the last user message, except on those with ``tool_calls``, which the
  APIs reject without it; an assistant tool-call message lacking it gets a short non-empty
  placeholder (an empty string is refused by some routes). Thinking blocks are dropped.
- anything else: both are dropped (content parts and ``thinking_blocks`` alike).

Each rewrite depends only on the message and on which side of the last user message it
is, so a message is rewritten the same way on every request until a new user message
arrives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from pipelines.conversation import Conversation
from pipelines.messages import Message
from pipelines.stage import StageContext

__all__ = ["CLEAR_THINKING", "REASONING_PLACEHOLDER", "Thinking"]

REASONING_PLACEHOLDER: Final = "(reasoning not retained)"
CLEAR_THINKING: Final = "clear_thinking_20251015"
"""Anthropic's context-management edit that clears earlier thinking."""
_THINKING_PARTS: Final = frozenset({"thinking", "redacted_thinking"})


@dataclass(frozen=True, slots=True)
class Thinking:
    name: str = "thinking"

    async def __call__(self, conversation: Conversation, ctx: StageContext) -> Conversation:
        style = ctx.model.thinking
        keep_blocks = style == "anthropic" and (
            ctx.model.keeps_thinking or _edits_thinking(conversation)
        )
        messages = conversation.messages
        for message in messages:  # a loop: any() over a generator costs twice as much
            if _may_change(message, style):
                break
        else:
            return conversation
        last_user = _last_user_turn(messages, joined=style == "anthropic")
        rewritten: list[Message] = []
        reasoning_dropped = blocks_dropped = backfilled = 0
        for index, message in enumerate(messages):
            if message.get("role") != "assistant":
                rewritten.append(message)
                continue
            current_turn = index > last_user
            new = message
            has_reasoning = "reasoning_content" in message
            keep_reasoning = style == "reasoning_echo" and (
                current_turn or bool(message.get("tool_calls"))
            )
            if has_reasoning and not keep_reasoning:
                new = {k: v for k, v in new.items() if k != "reasoning_content"}
                reasoning_dropped += 1
            if not (keep_blocks or (style == "anthropic" and current_turn)):
                stripped = _without_thinking_blocks(new)
                if stripped is not new:
                    new, blocks_dropped = stripped, blocks_dropped + 1
            if (
                style == "reasoning_echo"
                and new.get("tool_calls")
                and not (isinstance(new.get("reasoning_content"), str) and new["reasoning_content"])
            ):
                new = {**new, "reasoning_content": REASONING_PLACEHOLDER}
                backfilled += 1
            rewritten.append(new)
        if not (reasoning_dropped or blocks_dropped or backfilled):
            return conversation
        ctx.record(
            reasoning_dropped=reasoning_dropped,
            thinking_blocks_dropped=blocks_dropped,
            reasoning_backfilled=backfilled,
        )
        # No Anthropic wire carries ``reasoning_content``: dropping it only stops it being
        # counted; what goes up is the same.
        ctx.off_the_wire = style == "anthropic" and not blocks_dropped
        return conversation.with_messages(rewritten)


def _edits_thinking(conversation: Conversation) -> bool:
    """Whether the request asks the API to clear thinking itself (a
    ``clear_thinking_20251015`` edit in its ``context_management``)."""
    management = conversation.get("context_management")
    edits = management.get("edits") if isinstance(management, Mapping) else None
    return isinstance(edits, list) and any(
        isinstance(edit, Mapping) and edit.get("type") == CLEAR_THINKING for edit in edits
    )


def _last_user_turn(messages: Sequence[Message], *, joined: bool) -> int:
    """The index of the last user message; with ``joined`` (Anthropic's wire, where user
    messages right after tool results join the results' user turn), of the last one that
    starts a user turn of its own: the assistant messages after it are the current turn."""
    last, after_results = -1, False
    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            after_results = True
        elif role == "user":
            if not (joined and after_results):
                last = index
        elif role == "assistant":
            after_results = False
    return last


def _may_change(message: Message, style: str) -> bool:
    """A cheap first look: could this message need any rewrite at all?"""
    if message.get("role") != "assistant":
        return False
    return (
        "reasoning_content" in message
        or "thinking_blocks" in message
        or type(message.get("content")) is list
        or (style == "reasoning_echo" and bool(message.get("tool_calls")))
    )


def _without_thinking_blocks(message: Message) -> Message:
    if "thinking_blocks" in message:
        message = {k: v for k, v in message.items() if k != "thinking_blocks"}
    content = message.get("content")
    if not isinstance(content, list):
        return message
    kept = [
        part
        for part in content
        if not (isinstance(part, dict) and part.get("type") in _THINKING_PARTS)
    ]
    if len(kept) == len(content):
        return message
    if not kept:
        return {**message, "content": None if message.get("tool_calls") else ""}
    return {**message, "content": kept}
