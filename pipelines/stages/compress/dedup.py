"""Dedup, compress's first step (from 50% utilisation): repeated tool outputs stored once.

A tool output of ``DEDUP_MIN_CHARS`` or more characters identical to an earlier one is
replaced by a back-reference naming the earlier call and the ref of its own stored
content. It depends only on the messages before each output, so the same history always
deduplicates the same way, turn after turn.
"""

from __future__ import annotations

from typing import Final

from pipelines.conversation import Conversation
from pipelines.messages import Message, original_bytes
from pipelines.stage import StageContext
from pipelines.stages.compress.offload import offload

__all__ = ["DEDUP_MIN_CHARS", "dedup", "deduplicated"]

DEDUP_MIN_CHARS: Final = 200
"""Tool outputs shorter than this are never replaced."""


async def dedup(conversation: Conversation, ctx: StageContext) -> Conversation:
    """``conversation`` with its repeated tool outputs replaced by back-references (the
    number replaced in the report as ``duplicates``)."""
    out = list(conversation.messages)
    replaced = await deduplicated(out, {}, ctx)
    if not replaced:
        return conversation
    ctx.record(duplicates=replaced)
    return conversation.with_messages(out)


async def deduplicated(messages: list[Message], seen: dict[str, Message], ctx: StageContext) -> int:
    """Replace, in place, each tool output of 200+ characters identical to one in
    ``seen`` or earlier in ``messages`` by a back-reference; how many were replaced."""
    replaced = 0
    for index, message in enumerate(messages):
        content = message.get("content")
        if message.get("role") != "tool" or not isinstance(content, str):
            continue
        if len(content) < DEDUP_MIN_CHARS:
            continue
        earlier = seen.get(content)
        if earlier is None:
            seen[content] = message
            continue
        messages[index] = await _duplicate(message, earlier, ctx)
        replaced += 1
    return replaced


async def _duplicate(message: Message, earlier: Message, ctx: StageContext) -> Message:
    ref = await offload(ctx, original_bytes(ctx.as_received(message)))
    return {
        **message,
        "content": f"[Identical to the output of the earlier call"
        f" {earlier.get('tool_call_id')}; stored as {ref}.]",
    }
