"""The runner: applies the stages in order, times each, reports each, and is fail-open.

A stage that raises leaves the conversation as it was; the failure is logged and counted
in the report, and the next stage runs. ``RequestRejected`` is the exception: a stage
raises it on purpose to stop the request, so it propagates.

The runner also traces (OpenTelemetry API; the process decides where spans go): one span
``contextgate.pipeline`` around the stages, with the model, budget and tokens before and
after, and, when that span records, one child span per stage, ``contextgate.stage.<name>``,
with its tokens before and after, whether it changed the request, the refs it offloaded
(``contextgate.stage.refs``) and, for a stage that failed, status ``ERROR`` and the
exception's type (its message stays in the report and the log: it may quote the
conversation). Stages do not trace themselves.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from time import perf_counter
from typing import Any, Final

from opentelemetry import trace
from opentelemetry.trace import ProxyTracer, ProxyTracerProvider, Span, StatusCode, Tracer

from pipelines.conversation import Conversation
from pipelines.counting import ConversationTokens
from pipelines.errors import RequestRejected
from pipelines.ports import OffloadStore
from pipelines.report import Report, StageReport
from pipelines.stage import Stage, StageContext

__all__ = ["TRACER", "run_stages"]

log = logging.getLogger("contextgate.pipeline")

TRACER: Final = trace.get_tracer("pipelines")
"""The pipeline's tracer by default: the global provider's (none: spans are no-ops)."""


async def run_stages(
    stages: Sequence[Stage],
    conversation: Conversation,
    ctx: StageContext,
    report: Report,
    tokens: ConversationTokens,
    tracer: Tracer = TRACER,
) -> Conversation:
    """Run ``stages`` over ``conversation``, appending one ``StageReport`` each."""
    if not _may_record(tracer):
        return await _each(stages, conversation, ctx, report, tokens, None)
    with tracer.start_as_current_span(
        "contextgate.pipeline", record_exception=False, set_status_on_exception=False
    ) as span:
        traced = span.is_recording()
        try:
            conversation = await _each(
                stages, conversation, ctx, report, tokens, tracer if traced else None
            )
        except RequestRejected as exc:
            if traced:
                span.set_attribute("contextgate.rejected", exc.code)
            raise
        if traced:
            span.set_attributes(
                {
                    "contextgate.model": report.model,
                    "contextgate.cache": report.cache,
                    "contextgate.tokens.budget": report.budget,
                    "contextgate.tokens.before": report.tokens_before,
                    "contextgate.tokens.after": report.tokens_after,
                    "contextgate.tokens.exact": report.exact,
                    "contextgate.actions": report.actions,
                }
            )
    return conversation


async def _each(
    stages: Sequence[Stage],
    conversation: Conversation,
    ctx: StageContext,
    report: Report,
    tokens: ConversationTokens,
    tracer: Tracer | None,
) -> Conversation:
    """Every stage in turn (each in a span of its own with ``tracer``), the request's store
    wrapped once for all of them; ``report.tokens_after`` set at the end."""
    counted = _CountedStore(ctx.store) if ctx.store is not None else None
    current = report.tokens_before
    for stage in stages:
        if tracer is not None:
            conversation = await _traced(
                tracer, stage, conversation, ctx, report, tokens, current, counted
            )
        else:
            conversation = await _run(stage, conversation, ctx, report, tokens, current, counted)
        current = report.stages[-1].tokens_after
    report.tokens_after = current
    return conversation


def _may_record(tracer: Tracer) -> bool:
    """Whether ``tracer``'s spans may record: not while it is the API's proxy and no SDK
    is installed (tracing off), when every span is a no-op and making one current
    changes nothing any code can see. Then the spans are not made at all."""
    return not (
        isinstance(tracer, ProxyTracer)
        and isinstance(trace.get_tracer_provider(), ProxyTracerProvider)
    )


async def _run(
    stage: Stage,
    conversation: Conversation,
    ctx: StageContext,
    report: Report,
    tokens: ConversationTokens,
    current: int,
    counted: _CountedStore | None,
) -> Conversation:
    """One stage over ``conversation`` (of ``current`` tokens), fail-open, with its report
    appended; ``counted`` is the request's store as the stages see it, noting the refs
    each writes."""
    ctx.details = {}
    ctx.off_the_wire = False
    carried, compacted, boundary = dict(ctx.carry), ctx.compacted, ctx.boundary
    store = ctx.store
    if counted is not None:
        counted.written = []
        ctx.store = counted
    started = perf_counter()
    error: str | None = None
    try:
        result = await stage(conversation, ctx)
        if not isinstance(result, Conversation):
            raise TypeError(f"returned {type(result).__name__}, not a Conversation")
        rewrote = result is not conversation
        changed = rewrote and not ctx.off_the_wire
        after = tokens(result) if rewrote else current
    except RequestRejected:
        raise
    except Exception as exc:
        log.warning("stage %s failed; request left unchanged", stage.name, exc_info=True)
        result, changed, after = conversation, False, current
        ctx.carry = carried
        ctx.compacted = compacted
        ctx.boundary = boundary
        error = f"{type(exc).__name__}: {exc}"
    finally:
        ctx.store = store
    elapsed = (perf_counter() - started) * 1000
    written = counted.written if counted is not None else None
    report.stages.append(
        StageReport(
            stage.name,
            elapsed,
            current,
            after,
            changed,
            error,
            ctx.details,
            tuple(written) if written else (),
        )
    )
    return result


async def _traced(
    tracer: Tracer,
    stage: Stage,
    conversation: Conversation,
    ctx: StageContext,
    report: Report,
    tokens: ConversationTokens,
    current: int,
    counted: _CountedStore | None,
) -> Conversation:
    """``_run`` in a span of its own."""
    with tracer.start_as_current_span(
        f"contextgate.stage.{stage.name}",
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            result = await _run(stage, conversation, ctx, report, tokens, current, counted)
        except RequestRejected as exc:
            span.set_attribute("contextgate.rejected", exc.code)
            raise
        _describe(span, report.stages[-1], len(report.stages[-1].written))
    return result


def _describe(span: Span, stage: StageReport, refs: int) -> None:
    span.set_attributes(
        {
            "contextgate.stage.name": stage.name,
            "contextgate.tokens.before": stage.tokens_before,
            "contextgate.tokens.after": stage.tokens_after,
            "contextgate.stage.changed": stage.changed,
            "contextgate.stage.refs": refs,
        }
    )
    if stage.error is not None:
        kind = stage.error.partition(":")[0]
        span.set_attribute("error.type", kind)
        span.set_status(StatusCode.ERROR, kind)


class _CountedStore:
    """The stages' view of the request's offload store, noting the refs ``put`` returns
    and the size of what each holds (``written``: the running stage's, a new list for
    each); everything else (``get``, a store's ``touch``) is the store's own."""

    __slots__ = ("store", "written")

    def __init__(self, store: OffloadStore) -> None:
        self.store = store
        self.written: list[tuple[str, int]] = []

    async def put(self, namespace: str, content: bytes, *, ttl: int) -> str:
        ref = await self.store.put(namespace, content, ttl=ttl)
        self.written.append((ref, len(content)))
        return ref

    async def get(self, namespace: str, ref: str) -> bytes | None:
        return await self.store.get(namespace, ref)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)
