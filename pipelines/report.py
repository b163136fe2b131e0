"""The per-request report: what each stage did and what the request costs before and after."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Report", "StageReport"]


@dataclass(slots=True)
class StageReport:
    """One stage's run."""

    name: str
    ms: float
    tokens_before: int
    tokens_after: int
    changed: bool
    error: str | None = None
    """The exception's type and message when the stage raised (and was skipped)."""
    details: dict[str, Any] = field(default_factory=dict)
    written: tuple[tuple[str, int], ...] = ()
    """The refs the stage wrote to the offload store, with the bytes each holds."""


@dataclass(slots=True)
class Report:
    """The pipeline's account of one request."""

    model: str
    window: int
    output_reserve: int
    budget: int
    tokens_before: int
    tokens_after: int = 0
    exact: bool = True
    """False when some counts are estimates (see ``pipelines.counting``)."""
    ms: float = 0.0
    cache: str = "new"
    """The provider cache as the pipeline judged it: ``hot``, or why it is cold (``new``,
    ``expired``, ``low hit rate``, ``diverged``: the history does not continue the
    conversation's previous request)."""
    stages: list[StageReport] = field(default_factory=list)
    native: dict[str, Any] | None = None
    """The request's native context management and what the pipeline did about it
    (``pipelines.native.NativePlan.as_dict``); ``None`` when it carried none."""

    @property
    def received_tokens(self) -> int:
        """The request's tokens as the client sent it: without the tools the host added
        (the count the ``native_edits`` stage compares the client's triggers with, when it
        ran), else ``tokens_before``."""
        stage = self.stage("native_edits")
        found = stage.details.get("input_tokens") if stage is not None else None
        return found if isinstance(found, int) else self.tokens_before

    @property
    def applied_edits(self) -> list[dict[str, Any]]:
        """The native edits the gateway applied itself (a polyfill), in the API's
        ``applied_edits`` shape."""
        stage = self.stage("native_edits")
        edits = stage.details.get("applied_edits") if stage is not None else None
        return list(edits) if isinstance(edits, list) else []

    @property
    def actions(self) -> list[str]:
        """Names of the stages that changed the request, in pipeline order."""
        return [stage.name for stage in self.stages if stage.changed]

    @property
    def store_failures(self) -> int:
        """Writes to the offload store that failed (the content stayed in place)."""
        return sum(int(stage.details.get("store_failures", 0)) for stage in self.stages)

    @property
    def failures(self) -> list[str]:
        """Names of the stages that raised and were skipped."""
        return [stage.name for stage in self.stages if stage.error is not None]

    def stage(self, name: str) -> StageReport | None:
        # A loop: next() over a generator cost a small request 25,000 instructions more
        # (the report's properties look stages up by name several times a request).
        for stage in self.stages:
            if stage.name == name:
                return stage
        return None

    @property
    def moved(self) -> bool:
        """Whether a stage moved a cut (the media window, the cache-TTL prune's levels)."""
        return any(stage.details.get("moved") for stage in self.stages)

    def compaction(self) -> tuple[Any, ...]:
        """What this request's compaction was: compress's level (when it changed the
        request: a level that found nothing to do rewrote nothing), cut and where its span
        starts, the messages the summary stands for, and whether an emergency shortening
        acted. Between two requests of a conversation, a difference is a compaction event
        (``is_event_after``)."""
        compress, summary = self.stage("compress"), self.stage("summarize")
        details = compress.details if compress is not None else {}
        return (
            details.get("level") if compress is not None and compress.changed else None,
            details.get("cut"),
            details.get("span_start"),
            summary.details.get("covers") if summary is not None else None,
            "emergency_shortened" in details,
        )

    def is_event_after(self, previous: Report) -> bool:
        """Whether this request's compaction differs in kind from ``previous``'s (of the
        same conversation): a stage moved a cut, compress rewrote at another level, or
        changed its cut or where its span starts (the anchor is released when the pinned
        messages outgrow half the budget), an emergency shortening acted on either, or the
        summary stands for other messages. Between events, a growing history keeps its
        outgoing prefix."""
        now, before = self.compaction(), previous.compaction()
        return self.moved or now != before or bool(now[-1] or before[-1])

    @property
    def cache_break(self) -> str | None:
        """The cause of the provider-cache break this request was predicted to cause
        (``pipelines.cache_break.BREAK_CAUSES``), or ``None``."""
        stage = self.stage("cache_markers")
        cause = stage.details.get("cache_break") if stage is not None else None
        return cause if isinstance(cause, str) else None

    def _native(self) -> dict[str, Any] | None:
        if self.native is None:
            return None
        return {**self.native, "applied_edits": self.applied_edits}

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "window": self.window,
            "output_reserve": self.output_reserve,
            "budget": self.budget,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "exact": self.exact,
            "utilisation_before": round(self.tokens_before / self.budget, 4),
            "utilisation_after": round(self.tokens_after / self.budget, 4),
            "ms": round(self.ms, 3),
            "cache": self.cache,
            "native": None
            if self.native is None
            else {**self.native, "applied_edits": self.applied_edits},
            "actions": self.actions,
            "failures": self.failures,
            "store_failures": self.store_failures,
            "stages": [
                {
                    "name": s.name,
                    "ms": round(s.ms, 3),
                    "tokens_before": s.tokens_before,
                    "tokens_after": s.tokens_after,
                    "changed": s.changed,
                    "error": s.error,
                    "details": s.details,
                }
                for s in self.stages
            ],
        }
