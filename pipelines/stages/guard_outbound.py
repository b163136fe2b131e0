"""Stage 9: the request that leaves must fit its budget.

The budget is ``min(window - output reserve, max-input)``. If the stages before could not
bring the request under it (the system prompt and the latest user message alone are too
big), the gateway answers 400 ``context_length_exceeded`` with the numbers and sends
nothing, rather than let the provider fail it after a round trip.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipelines.conversation import Conversation
from pipelines.errors import RequestRejected
from pipelines.stage import StageContext

__all__ = ["GuardOutbound"]


@dataclass(frozen=True, slots=True)
class GuardOutbound:
    name: str = "guard_outbound"

    async def __call__(self, conversation: Conversation, ctx: StageContext) -> Conversation:
        tokens = ctx.tokens(conversation)
        budget = ctx.budget
        if tokens > budget.input_tokens:
            cap = f", capped at {budget.max_input:,} by max-input" if budget.max_input else ""
            raise RequestRejected(
                "context_length_exceeded",
                f"After compaction the request is {tokens:,} tokens; its input budget is"
                f" {budget.input_tokens:,} (a {budget.window:,}-token window less"
                f" {budget.output_reserve:,} kept for the reply{cap}). What compaction may not"
                " shorten (system messages, the latest user message, short messages) is too"
                " large to fit.",
            )
        return conversation
