"""The compress stage itself: its parameters, and its steps in their order.

``Compress`` runs the steps of the package's modules on one request: the previous cut
reused when it certainly still holds (``memo``), else dedup and, from ``trigger``, the cut
on the grid (``dedup``, ``cut``); then the emergency when the request is still over the
budget. It records where it cut for the summarize stage and the conversation's next
record. When the store fails, or there is none, nothing is compacted: the request goes
as it came unless it cannot be sent at all, and then it is shortened with no copy kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipelines.conversation import Conversation
from pipelines.stage import Compacted, StageContext
from pipelines.stages.compress.cut import cut
from pipelines.stages.compress.dedup import dedup
from pipelines.stages.compress.emergency import emergency
from pipelines.stages.compress.memo import MEMO_CHARS, Memos
from pipelines.stages.compress.offload import NoStore

__all__ = ["Compress"]


@dataclass(frozen=True, slots=True)
class Compress:
    name: str = "compress"
    span_share: float = 0.10
    """Share of the budget the compacted span may take."""
    keep_chars: int = 1_200
    """Longest text kept as it is in the span, or in the tail in an emergency."""
    memo_chars: int = MEMO_CHARS
    """Characters the last cuts of recent conversations, kept to be re-applied without
    recomputing them, may hold together."""
    _memos: Memos = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "_memos", Memos(self.memo_chars, (self.span_share, self.keep_chars))
        )

    async def __call__(self, conversation: Conversation, ctx: StageContext) -> Conversation:
        policy, budget = ctx.policy, ctx.budget.input_tokens
        if (
            policy.mode == "off"
            or ctx.tokens(conversation) < min(policy.light, policy.trigger) * budget
        ):
            return conversation
        if ctx.store is None:
            ctx.record(skipped="no store")
            return await self._lossy(conversation, ctx)
        try:
            reused = await self._memos.reuse(conversation, ctx)
            if reused is not None:
                result = reused
            else:
                ctx.record(level="light")
                deduped = await dedup(conversation, ctx)
                result = deduped
                if ctx.tokens(result) > policy.trigger * budget:
                    ctx.record(level="full")
                    result = await cut(
                        result, ctx, span_share=self.span_share, keep_chars=self.keep_chars
                    )
                    self._memos.remember(conversation, deduped, result, ctx)
            at = ctx.details.get("cut")
            if isinstance(at, int):
                messages = conversation.messages
                after = result.messages[len(result.messages) - (len(messages) - at) :]
                basis = conversation.with_messages([*messages[:at], *after])
                ctx.compacted = Compacted(conversation, int(ctx.details["span_start"]), at, basis)
            ctx.carry["compacted_cut"] = at if isinstance(at, int) else 0
            if ctx.tokens(result) > budget:
                result = await emergency(result, ctx, keep_chars=self.keep_chars)
            if isinstance(at, int):
                # The compaction boundary: the last message of the compacted span.
                kept = len(conversation.messages) - at
                ctx.boundary = result.messages[len(result.messages) - kept - 1]
        except NoStore:
            ctx.compacted = None
            ctx.boundary = None
            ctx.carry["compacted_cut"] = 0
            ctx.record(skipped="store unavailable", store_failures=1)
            return await self._lossy(conversation, ctx)
        return result

    async def _lossy(self, conversation: Conversation, ctx: StageContext) -> Conversation:
        """Without a store nothing is removed, unless the request cannot be sent at all
        otherwise: then the emergency shortening runs with no copy kept, and each
        shortened text says so."""
        if ctx.tokens(conversation) <= ctx.budget.input_tokens:
            return conversation
        return await emergency(conversation, ctx, keep_chars=self.keep_chars, lossy=True)
