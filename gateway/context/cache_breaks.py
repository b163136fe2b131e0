"""Prompt-cache breaks: when a conversation's cached prefix was lost, and why.

The pipeline's ``cache_markers`` stage predicts a break before the request leaves (the
model, system prompt or tools changed, a compaction rewrote the prefix, or the cache's TTL
ran out since the previous request) and records the cause in its report. After the answer,
the provider's usage tells whether the cache reads really fell (``observed_break``: by more
than 5% and at least 2,000 tokens against the previous request). A break is counted once
per request, with the predicted cause, ``native`` when the provider edits the context itself
(the client's ``context_management`` honoured, or its compaction preferred: a known prefix
change), or ``unknown`` when only the usage shows it; where the provider reports no cache
reads, the prediction stands alone.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace

from gateway.context.compaction import ChatRequest
from gateway.telemetry.metrics import Metrics
from pipelines import observed_break
from pipelines.session import NATIVE_EDITS, usage_of

__all__ = ["CACHE_BREAK_HEADER", "note_cache_break"]

CACHE_BREAK_HEADER = "x-contextgate-cache-break"


def cache_break(chat: ChatRequest, usage: dict[str, Any] | None) -> str | None:
    """The cause of this request's cache break, judged with the usage it got back."""
    predicted = chat.result.report.cache_break
    if chat.result.report.cache == "diverged":
        return None
    previous = chat.state.cached_tokens if chat.state is not None else None
    _, cached = usage_of(usage)
    if previous is None or cached is None:
        return predicted
    if observed_break(previous, cached):
        return predicted or ("native" if _provider_edited(usage) else "unknown")
    return None


def _provider_edited(usage: dict[str, Any] | None) -> bool:
    """Whether the provider reports it edited this request's context itself (the
    client's native context management honoured, or its compaction preferred): a fall in
    its cache reads is then the edit's known prefix change, not a surprise."""
    edits = usage.get(NATIVE_EDITS) if usage is not None else None
    return isinstance(edits, int) and edits > 0


def note_cache_break(
    metrics: Metrics, chat: ChatRequest, usage: dict[str, Any] | None
) -> str | None:
    """Judge and count this request's cache break (metric and span attribute); its cause."""
    cause = cache_break(chat, usage)
    if cause is not None:
        metrics.cache_breaks.labels(cause=cause).inc()
        trace.get_current_span().set_attribute("contextgate.cache_break", cause)
    return cause
