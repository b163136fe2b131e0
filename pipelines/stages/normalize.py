"""Stage 8: tool-call structure that every provider accepts, without losing anything.

- Every assistant ``tool_calls`` entry is answered by a ``tool`` message in the block that
  follows it; a call left without one (an interrupted run, or a result removed earlier) gets
  a synthetic result saying so, placed after the results it does have.
- Every ``tool`` message answers a call of the assistant message right before its block; one
  that does not (its call is gone, or it answers a call twice) becomes a user message that
  carries its content and says what it was, so nothing is dropped.
- The first message after the system messages is a user message; when it is not, a short
  user message is put before it (Anthropic requires one; others accept it).

Merging consecutive same-role messages is left to the provider codecs that need it.
Valid conversations pass through as the very same object.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from pipelines.conversation import Conversation
from pipelines.messages import Message
from pipelines.stage import StageContext

__all__ = ["INTERRUPTED_RESULT", "OPENING_MESSAGE", "Normalize"]

INTERRUPTED_RESULT: Final = "[No result was recorded for this tool call; it was interrupted.]"
OPENING_MESSAGE: Final = "(Continuing an earlier conversation.)"


@dataclass(frozen=True, slots=True)
class Normalize:
    name: str = "normalize"

    async def __call__(self, conversation: Conversation, ctx: StageContext) -> Conversation:
        if _valid(conversation.messages):
            return conversation
        messages = list(conversation.messages)
        out: list[Message] = []
        synthetic = orphans = 0
        index = 0
        while index < len(messages):
            message = messages[index]
            role = message.get("role")
            if role == "tool":
                out.append(_orphan(message))
                orphans += 1
                index += 1
                continue
            out.append(message)
            index += 1
            calls = message.get("tool_calls") if role == "assistant" else None
            if not calls:
                continue
            pending = [c.get("id") for c in calls if isinstance(c, dict)]
            strays: list[Message] = []
            while index < len(messages) and messages[index].get("role") == "tool":
                result = messages[index]
                call_id = result.get("tool_call_id")
                if call_id in pending:
                    pending.remove(call_id)
                    out.append(result)
                else:
                    strays.append(_orphan(result))
                index += 1
            for call_id in pending:
                out.append({"role": "tool", "tool_call_id": call_id, "content": INTERRUPTED_RESULT})
                synthetic += 1
            # Results that answer none of these calls follow the block, as user messages.
            out.extend(strays)
            orphans += len(strays)
        opened = _needs_opening(out)
        if opened:
            first = next(
                i for i, m in enumerate(out) if m.get("role") not in ("system", "developer")
            )
            out.insert(first, {"role": "user", "content": OPENING_MESSAGE})
        if not (synthetic or orphans or opened):
            return conversation
        ctx.record(synthetic_results=synthetic, orphan_results=orphans, opening_added=opened)
        return conversation.with_messages(out)


def _valid(messages: tuple[Message, ...]) -> bool:
    """The common case, checked without building anything: already valid."""
    if _needs_opening(messages):
        return False
    pending: set[Any] = set()
    for message in messages:
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in pending:
                return False
            pending.discard(call_id)
            continue
        if pending:
            return False
        if role == "assistant":
            calls = message.get("tool_calls")
            if calls:
                ids = [c.get("id") if isinstance(c, dict) else None for c in calls]
                pending = set(ids)
                if len(pending) != len(ids):
                    return False
    return not pending


def _orphan(result: Message) -> Message:
    """A tool result with no call to answer, as a user message that keeps its content."""
    label = f"[Result of an earlier tool call {result.get('tool_call_id') or '(no id)'}"
    if isinstance(result.get("name"), str):
        label += f" to {result['name']}"
    label += "; the call itself is no longer in the conversation.]"
    content: Any = result.get("content")
    if isinstance(content, list):
        return {"role": "user", "content": [{"type": "text", "text": label}, *content]}
    text = content if isinstance(content, str) else ""
    return {"role": "user", "content": f"{label}\n{text}"}


def _needs_opening(messages: Sequence[Message]) -> bool:
    for message in messages:
        role = message.get("role")
        if role in ("system", "developer"):
            continue
        return bool(role != "user")
    return False
