"""Compress's second step (from ``trigger``): where the compacted span ends, on a grid.

The span runs from after the anchor to a *cut*. Cuts sit on a fixed grid: the first group
boundary after each multiple of ``(trigger - target) x budget`` tokens of the raw span, or,
when no grid cut is enough, the last group before the protected tail. The first grid cut
that brings the request under ``trigger`` is taken, but the previous request's cut stays
while the request fits with it, and a move that saves too little (``MIN_SAVING_FLOOR`` to
``MAX_MIN_SAVING``, or thin moves in a row: ``THIN_EVENTS``) is not made: each move breaks
the provider's cached prefix. Nothing here depends on messages after a cut.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate, pairwise
from typing import Final

from pipelines.conversation import Conversation
from pipelines.groups import Group, protect, split_groups
from pipelines.stage import StageContext
from pipelines.stages.compress.span import Made, compact_span

__all__ = [
    "MAX_MIN_SAVING",
    "MIN_SAVING_FLOOR",
    "THIN_EVENTS",
    "THIN_SAVING",
    "compactable",
    "cut",
    "span_groups",
]

MAX_MIN_SAVING: Final = 3_000
MIN_SAVING_FLOOR: Final = 500
"""A cut must save at least the room left under the budget, clamped to these tokens (so
less is asked as room shrinks), unless the request is over the budget."""

THIN_EVENTS: Final = 2
THIN_SAVING: Final = 0.10
"""Anti-thrashing: after this many compaction events in a row each saving under this
share of the request (compared with keeping the previous cut), the previous cut is kept
until ``emergency``."""


async def cut(
    conversation: Conversation, ctx: StageContext, *, span_share: float, keep_chars: int
) -> Conversation:
    """``conversation`` with its span compacted up to the cut this request takes (the
    previous one, or the first grid cut under ``trigger``), recorded in the report as
    ``cut``, ``span_start`` and ``grid``; the conversation itself when nothing is cut."""
    grid = _Grid.of(conversation, ctx, span_share=span_share, keep_chars=keep_chars)
    if grid is None:
        return conversation
    limit = ctx.policy.trigger * ctx.budget.input_tokens
    previous = grid.previous
    kept, kept_tokens, at = conversation, grid.start_tokens, -1
    ends = [g.end for g in grid.span]
    if previous in ends:
        at = ends.index(previous)
        kept, kept_tokens = await grid.candidate(at)

    def stay() -> Conversation:
        """The previous request's cut applied again; with none, nothing cut."""
        if kept is conversation:
            return conversation
        return recorded(kept, previous, grid.span_start, grid.held, grid.on_grid[at], ctx)

    if kept_tokens <= limit:
        # The cut stays put while the request fits under ``trigger`` with it, wherever
        # it sits: moving it is a compaction event, which breaks the cached prefix.
        return stay()
    best, best_tokens, best_cut, best_on_grid = await grid.best(limit)
    if best_cut == previous or best_tokens >= kept_tokens:
        return stay()
    if not _worth_moving(
        ctx,
        from_previous=kept is not conversation,
        kept_tokens=kept_tokens,
        best_tokens=best_tokens,
        start_tokens=grid.start_tokens,
    ):
        return stay()
    protected = grid.protected_at(best_cut)
    return recorded(best, best_cut, grid.span_start, protected, best_on_grid, ctx)


def _worth_moving(
    ctx: StageContext, *, from_previous: bool, kept_tokens: int, best_tokens: int, start_tokens: int
) -> bool:
    """Whether the best cut saves enough over what goes out without it (the previous
    cut, if any) to be taken; why not, in the report."""
    budget = ctx.budget.input_tokens
    saving = kept_tokens - best_tokens
    minimum = min(MAX_MIN_SAVING, max(MIN_SAVING_FLOOR, budget - kept_tokens))
    if saving < minimum and kept_tokens <= budget:
        # Not worth breaking the cached prefix for; the next turns will save more.
        ctx.record(skipped_saving=saving, minimum_saving=minimum)
        return False
    if from_previous:
        # A compaction event: moving the cut from where the previous request had it.
        # When such moves keep saving little, the previous cut is kept instead
        # (anti-thrashing), while the request stays under ``emergency``.
        thin = saving < THIN_SAVING * start_tokens
        thin_before = ctx.cut("thin_compactions")
        if thin and thin_before >= THIN_EVENTS and kept_tokens <= ctx.policy.emergency * budget:
            ctx.record(anti_thrash=True)
            return False
        ctx.carry["thin_compactions"] = thin_before + 1 if thin else 0
    return True


def recorded(
    result: Conversation,
    cut: int,
    span_start: int,
    protected: frozenset[int],
    on_grid: bool,
    ctx: StageContext,
) -> Conversation:
    """``result``, cut at ``cut``, recorded as this request's cut, with the messages
    before it kept whole because they were protected, for the next request."""
    ctx.record(cut=cut, span_start=span_start, grid=on_grid)
    ctx.carry["compacted_pins"] = sorted(i for i in protected if span_start <= i < cut)
    return result


@dataclass(slots=True)
class _Grid:
    """One request's span and the cuts it may take: its groups, their raw tokens summed
    along the span, which group ends are grid cuts, and the notes and shortened answers
    its candidates share (made once each)."""

    conversation: Conversation
    ctx: StageContext
    span: list[Group]
    protected: frozenset[int]
    held: frozenset[int]
    """What was protected at the previous request's cut, rendered there as it was then."""
    previous: int
    start_tokens: int
    raw: list[int]
    on_grid: list[bool]
    span_share: float
    keep_chars: int
    made: Made = field(default_factory=dict)

    @classmethod
    def of(
        cls, conversation: Conversation, ctx: StageContext, *, span_share: float, keep_chars: int
    ) -> _Grid | None:
        """The grid of ``conversation``'s span, or ``None`` when there is no span."""
        messages = conversation.messages
        budget = ctx.budget.input_tokens
        size = ctx.tokens.message
        # No goal terms here: they come from the latest user message, and anything that
        # changes with later messages would make the compacted span change from turn to turn.
        groups = split_groups(messages)
        protection = protect(
            messages, groups, budget=budget, tail_ratio=ctx.policy.tail_ratio, tokens_of=size
        )
        span = span_groups(groups, protection.indices, protection.tail_start)
        if not span:
            return None
        step = max(1, int((ctx.policy.trigger - ctx.policy.target) * budget))
        start_tokens = ctx.tokens(conversation)
        raw = list(accumulate(sum(size(m) for m in messages[g.start : g.end]) for g in span))
        on_grid = [now // step > before // step for before, now in pairwise([0, *raw])]
        # The previous request's cut is rendered as it was then: the messages protected
        # then (a latest user message since followed by another) stay protected at it.
        previous = ctx.cut("compacted_cut")
        state_pins = ctx.state.compacted_pins if ctx.state is not None else ()
        held = protection.indices | frozenset(i for i in state_pins if i < previous)
        return cls(
            conversation,
            ctx,
            span,
            protection.indices,
            held,
            previous,
            start_tokens,
            raw,
            on_grid,
            span_share,
            keep_chars,
        )

    @property
    def span_start(self) -> int:
        return self.span[0].start

    def protected_at(self, cut: int) -> frozenset[int]:
        return self.held if cut == self.previous else self.protected

    async def candidate(self, position: int) -> tuple[Conversation, int]:
        """The conversation with its span cut after group ``position``, and its tokens."""
        found = await compact_span(
            self.conversation,
            self.span[: position + 1],
            self.protected_at(self.span[position].end),
            self.ctx,
            self.made,
            span_share=self.span_share,
            keep_chars=self.keep_chars,
        )
        return found, self._counted(found, position)

    async def best(self, limit: float) -> tuple[Conversation, int, int, bool]:
        """The first grid cut (or the last group) that brings the request to ``limit``
        tokens, else the one that saves the most: the conversation cut there, its tokens,
        the cut, and whether it is on the grid."""
        best, best_tokens, best_cut, best_on_grid = self.conversation, self.start_tokens, 0, False
        last = len(self.span) - 1
        for position, group in enumerate(self.span):
            on_grid = self.on_grid[position]
            if not on_grid and position < last:
                continue
            found, tokens = await self.candidate(position)
            if tokens < best_tokens:
                best, best_tokens, best_cut, best_on_grid = found, tokens, group.end, on_grid
            if tokens <= limit:
                break
        return best, best_tokens, best_cut, best_on_grid

    def _counted(self, candidate: Conversation, position: int) -> int:
        """Tokens of ``candidate``, the span cut after group ``position``: only the
        span changed, its old messages out, its new ones in."""
        size = self.ctx.tokens.message
        after = len(self.conversation.messages) - self.span[position].end
        new_span = candidate.messages[self.span_start : len(candidate.messages) - after]
        tokens = self.start_tokens - self.raw[position] + sum(size(m) for m in new_span)
        self.ctx.tokens.remember(candidate, tokens)
        return tokens


def compactable(
    conversation: Conversation, ctx: StageContext
) -> tuple[int, int, tuple[int, ...]] | None:
    """Where compaction may act in ``conversation``: from the first group after the
    system prompt and anchor to the protected tail (``None`` when that is empty), and the
    protected messages inside that range."""
    messages = conversation.messages
    groups = split_groups(messages)
    protection = protect(
        messages,
        groups,
        budget=ctx.budget.input_tokens,
        tail_ratio=ctx.policy.tail_ratio,
        tokens_of=ctx.tokens.message,
    )
    span = span_groups(groups, protection.indices, protection.tail_start)
    if not span:
        return None
    start, end = span[0].start, span[-1].end
    return start, end, tuple(sorted(i for i in protection.indices if start <= i < end))


def span_groups(groups: list[Group], protected: frozenset[int], tail_start: int) -> list[Group]:
    """The groups between the leading protected ones (system prompt, anchor) and the tail.
    A protected group inside it (the latest user message, before an agent loop) stays in
    place, whole."""
    start = 0
    while start < len(groups) and groups[start].start in protected:
        start += 1
    return [group for group in groups[start:] if group.end <= tail_start]
