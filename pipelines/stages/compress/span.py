"""Compress's third step: the span between the anchor and a cut, rendered compacted.

Inside the span user messages are kept whole and final answers kept (long ones shortened)
while they fit the span's share of the budget, answers dropped first, then user messages,
the oldest first in each; protected messages always stay. Everything else (tool-call
groups, interim assistant text) goes, and each run of removed groups becomes one short
user-role note naming the ref of what it held. The cut's search renders many candidate
spans over the same groups, so notes and shortened answers are made once and kept in
``made`` by their message range.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipelines.conversation import Conversation
from pipelines.errors import StoreError
from pipelines.groups import ANSWER, Group
from pipelines.messages import Message
from pipelines.notes import removal_note
from pipelines.stage import StageContext
from pipelines.stages.compress.offload import NoStore, shortened

__all__ = ["Made", "compact_span"]

Made = dict[tuple[int, int], Message]
"""Notes by the range ``(start, end)`` they stand for, shortened answers by ``(start, -1)``."""


async def compact_span(
    conversation: Conversation,
    span: list[Group],
    protected: frozenset[int],
    ctx: StageContext,
    made: Made,
    *,
    span_share: float,
    keep_chars: int,
) -> Conversation:
    """The conversation with the groups of ``span`` compacted. ``made`` keeps notes
    and shortened answers by their message range, for the next candidate."""
    messages = conversation.messages
    pinned, kept = await _kept(
        messages, span, protected, ctx, made, span_share=span_share, keep_chars=keep_chars
    )
    out: list[Message] = list(messages[: span[0].start])
    run = -1  # start of the run of removed groups, if any
    for group in span:
        if group.start in kept or group.start in pinned:
            if run >= 0:
                out.append(await _note(messages, run, group.start, ctx, made))
                run = -1
            if group.start in pinned:
                out.extend(messages[group.start : group.end])
            else:
                out.append(kept[group.start])
        elif run < 0:
            run = group.start
    if run >= 0:
        out.append(await _note(messages, run, span[-1].end, ctx, made))
    out.extend(messages[span[-1].end :])
    return conversation.with_messages(out)


async def _kept(
    messages: Sequence[Message],
    span: list[Group],
    protected: frozenset[int],
    ctx: StageContext,
    made: Made,
    *,
    span_share: float,
    keep_chars: int,
) -> tuple[set[int], dict[int, Message]]:
    """What of ``span`` stays: the groups kept whole (protected ones and the user messages
    that fit) by their start, and the final answers that fit, shortened when long."""
    size = ctx.tokens.message
    # User messages are kept whole and final answers (long ones shortened) while they
    # fit the span's share of the budget: answers go first, then user messages, the
    # oldest first in each; all else is removed. Protected messages always stay.
    pinned = {g.start for g in span if g.start in protected}
    users = [
        g.start for g in span if g.start not in pinned and messages[g.start].get("role") == "user"
    ]
    kept: dict[int, Message] = {}
    for group in span:
        message = messages[group.start]
        if (
            group.start not in pinned
            and group.end - group.start == 1
            and group.priority == ANSWER
            and message.get("role") == "assistant"
        ):
            short = made.get((group.start, -1))
            if short is None:
                short = made[group.start, -1] = await shortened(message, ctx, keep_chars)
            kept[group.start] = short
    allowance = span_share * ctx.budget.input_tokens
    used = sum(size(messages[i]) for i in (*pinned, *users))
    used += sum(size(m) for m in kept.values())
    order = sorted(kept)
    while order and used > allowance:
        used -= size(kept.pop(order.pop(0)))
    users.reverse()
    while users and used > allowance:
        used -= size(messages[users.pop()])
    pinned.update(users)
    return pinned, kept


async def _note(
    messages: Sequence[Message], start: int, end: int, ctx: StageContext, made: Made
) -> Message:
    """The note standing for ``messages[start:end]``, removed."""
    note = made.get((start, end))
    if note is None:
        try:
            note = await removal_note(list(messages[start:end]), ctx)
        except StoreError as exc:
            raise NoStore from exc
        made[start, end] = note
    return note
