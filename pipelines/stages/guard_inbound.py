"""Stage 0: refuse a new user turn larger than ``block-tokens``.

A pasted log or document of hundreds of thousands of tokens in one turn would force the
rest of the conversation out of the window, so it is refused up front (400
``payload_too_large``) with the count and the limit, and nothing is sent upstream. Only the
new turn counts: the trailing user messages after the last message of any other role (a
system turn among them, as Claude Code sends one after the user's message, counts too).
History is the other stages' business, and tool outputs are the filter's.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipelines.conversation import Conversation
from pipelines.errors import RequestRejected
from pipelines.messages import is_system_turn
from pipelines.stage import StageContext

__all__ = ["GuardInbound"]


@dataclass(frozen=True, slots=True)
class GuardInbound:
    name: str = "guard_inbound"

    async def __call__(self, conversation: Conversation, ctx: StageContext) -> Conversation:
        messages = conversation.messages
        start = len(messages)
        while start > 0 and (
            messages[start - 1].get("role") == "user" or is_system_turn(messages[start - 1])
        ):
            start -= 1
        tokens = sum(map(ctx.tokens.message, messages[start:]))
        limit = ctx.policy.block_tokens
        if tokens > limit:
            raise RequestRejected(
                "payload_too_large",
                f"The new user turn is {tokens:,} tokens; the largest accepted is {limit:,}"
                " (policy block-tokens). Send large documents in parts or as a file.",
                param=f"messages[{start}]",
            )
        ctx.record(turn_tokens=tokens)
        return conversation
