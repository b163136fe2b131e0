"""The runner: applies the stages in order, times each, reports each, and is fail-open.

A stage that raises leaves the conversation as it was; the failure is logged and counted
in the report, and the next stage runs. ``RequestRejected`` is the exception: a stage
raises it on purpose to stop the request, so it propagates.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from time import perf_counter

from pipelines.conversation import Conversation
from pipelines.errors import RequestRejected
from pipelines.messages import Message
from pipelines.report import Report, StageReport
from pipelines.stage import Stage, StageContext
from pipelines.tokens import REPLY_PRIMING, TokenCounter

__all__ = ["ConversationTokens", "run_stages"]

log = logging.getLogger("contextgate.pipeline")


class ConversationTokens:
    """Counts a conversation's tokens, reusing the count of every message object already
    seen in this request (stages keep unchanged messages as the same objects)."""

    __slots__ = ("_counter", "_seen")

    def __init__(self, counter: TokenCounter) -> None:
        self._counter = counter
        # id -> (message, count); holding the message keeps its id from being reused.
        self._seen: dict[int, tuple[Message, int]] = {}

    def __call__(self, conversation: Conversation) -> int:
        total = REPLY_PRIMING + self._counter.count_tools(conversation.tools)
        seen = self._seen
        for message in conversation.messages:
            known = seen.get(id(message))
            if known is None:
                known = (message, self._counter.count_message(message))
                seen[id(message)] = known
            total += known[1]
        return total


async def run_stages(
    stages: Sequence[Stage],
    conversation: Conversation,
    ctx: StageContext,
    report: Report,
    tokens: ConversationTokens,
) -> Conversation:
    """Run ``stages`` over ``conversation``, appending one ``StageReport`` each."""
    current = report.tokens_before
    for stage in stages:
        ctx.details = {}
        started = perf_counter()
        error: str | None = None
        try:
            result = await stage(conversation, ctx)
        except RequestRejected:
            raise
        except Exception as exc:
            log.warning("stage %s failed; request left unchanged", stage.name, exc_info=True)
            result, error = conversation, f"{type(exc).__name__}: {exc}"
        elapsed = (perf_counter() - started) * 1000
        changed = result is not conversation
        after = tokens(result) if changed else current
        report.stages.append(
            StageReport(stage.name, elapsed, current, after, changed, error, ctx.details)
        )
        conversation, current = result, after
    report.tokens_after = current
    return conversation
