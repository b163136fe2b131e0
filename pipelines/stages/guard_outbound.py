"""Stage 10: the request that leaves must fit its budget.

The budget is ``min(window - output reserve, max-input)``. If the stages before could not
bring the request under it, the gateway answers 400 ``context_length_exceeded`` and sends
nothing, rather than let the provider fail it after a round trip: nothing the client sent
is dropped to make it fit. The message says what could not be shortened (the tools, the
system prompt, the system messages an agent sends inside the history, the latest user
message: an agent's fixed part, some 12,000 tokens for Claude Code) and the smallest
``max-input`` with which the request fits, or that the model's window cannot hold it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pipelines.conversation import Conversation
from pipelines.errors import RequestRejected
from pipelines.messages import is_system_turn
from pipelines.stage import StageContext

__all__ = ["GuardOutbound"]

_SYSTEM_ROLES: Final = ("system", "developer")
_ROUNDING: Final = 1_000
"""The ``max-input`` a refusal suggests is rounded up to this."""


@dataclass(frozen=True, slots=True)
class GuardOutbound:
    name: str = "guard_outbound"

    async def __call__(self, conversation: Conversation, ctx: StageContext) -> Conversation:
        tokens = ctx.tokens(conversation)
        budget = ctx.budget
        if tokens <= budget.input_tokens:
            return conversation
        room = budget.window - budget.output_reserve
        cap = f", capped at {budget.max_input:,} by max-input" if budget.max_input else ""
        if tokens <= room:
            suggested = min(room, -(-tokens // _ROUNDING) * _ROUNDING)
            remedy = (
                f" It fits with max-input={suggested} or more (x-contextgate-policy) or with"
                " fewer or smaller tools, system prompt or message."
            )
        else:
            remedy = (
                f" The model's window cannot hold it ({room:,} tokens of input with"
                f" {budget.output_reserve:,} kept for the reply): send less, or ask for a"
                " shorter reply (max_tokens)."
            )
        raise RequestRejected(
            "context_length_exceeded",
            f"After compaction the request is {tokens:,} tokens; its input budget is"
            f" {budget.input_tokens:,} (a {budget.window:,}-token window less"
            f" {budget.output_reserve:,} kept for the reply{cap}). What compaction may not"
            f" shorten is too large to fit: {_fixed_part(conversation, ctx)}.{remedy}",
        )


def _fixed_part(conversation: Conversation, ctx: StageContext) -> str:
    """What a request keeps whatever the compaction, with its tokens."""
    messages = conversation.messages
    system = [m for m in messages if m.get("role") in _SYSTEM_ROLES and not is_system_turn(m)]
    turns = [m for m in messages if is_system_turn(m)]
    users = [m for m in messages if m.get("role") == "user"]
    parts = [
        ("the tools", ctx.counter.count_tools(conversation.tools)),
        ("the system prompt", sum(ctx.tokens.message(m) for m in system)),
        ("the system messages in the history", sum(ctx.tokens.message(m) for m in turns)),
        ("the latest user message", ctx.tokens.message(users[-1]) if users else 0),
    ]
    shown = [f"{what} ({count:,} tokens)" for what, count in parts if count]
    if len(shown) > 1:
        return ", ".join(shown[:-1]) + " and " + shown[-1]
    return shown[0] if shown else "the messages left"
