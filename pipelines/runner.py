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
from pipelines.counting import ConversationTokens
from pipelines.errors import RequestRejected
from pipelines.report import Report, StageReport
from pipelines.stage import Stage, StageContext

__all__ = ["run_stages"]

log = logging.getLogger("contextgate.pipeline")


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
        carried, compacted, boundary = dict(ctx.carry), ctx.compacted, ctx.boundary
        started = perf_counter()
        error: str | None = None
        try:
            result = await stage(conversation, ctx)
            if not isinstance(result, Conversation):
                raise TypeError(f"returned {type(result).__name__}, not a Conversation")
            changed = result is not conversation
            after = tokens(result) if changed else current
        except RequestRejected:
            raise
        except Exception as exc:
            log.warning("stage %s failed; request left unchanged", stage.name, exc_info=True)
            result, changed, after = conversation, False, current
            ctx.carry = carried
            ctx.compacted = compacted
            ctx.boundary = boundary
            error = f"{type(exc).__name__}: {exc}"
        elapsed = (perf_counter() - started) * 1000
        report.stages.append(
            StageReport(stage.name, elapsed, current, after, changed, error, ctx.details)
        )
        conversation, current = result, after
    report.tokens_after = current
    return conversation
