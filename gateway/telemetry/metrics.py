"""Prometheus metrics, exported at ``GET /metrics``; every family, its labels and meaning
are listed in ``docs/OBSERVABILITY.md``.

Each gateway has its own registry (several apps may share a process, in tests), held by
``Gateway``; the route renders it in the text exposition format. Each concern is recorded
in one place:

- requests, tokens, stages, summary paths and store fail-opens: by the request middleware
  (``gateway.edge.access``), once per request, from what the handlers left in its state;
- upstream latency: by ``gateway.context.exchange`` when an answer arrives;
- cache breaks: by ``gateway.context.cache_breaks``;
- store failures, summary jobs and overload (requests shed, in flight, the event loop's
  lag and tasks): counted by the store, the summary service and the shedder themselves
  and read at scrape time (``watch``), so those modules know nothing of Prometheus.

A new concern adds its families in ``Metrics.__init__`` under a comment naming it, and a
section in ``docs/OBSERVABILITY.md``. What every forwarded request records (its count and
duration, its tokens, each stage's time, the upstream's latency) is kept in plain numbers
(``gateway.telemetry.plain``: no lock, no walk of the buckets in Python; the exposition is
prometheus-client's) through series cached here by label values, and the requests in flight
are a number read at scrape time; the rest are prometheus-client's own metrics.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge

from gateway.telemetry.collectors import Overload, OwnCounts, Shedder, Stores, SummaryService
from gateway.telemetry.plain import CounterSeries, HistogramSeries, PlainCounter, PlainHistogram
from pipelines import ModelCatalog, Report

__all__ = [
    "LATENCY_BUCKETS",
    "OTHER_MODEL",
    "STAGE_BUCKETS",
    "TOKEN_KINDS",
    "Metrics",
    "ModelLabels",
    "cache_writes",
    "usage_counts",
]


LATENCY_BUCKETS: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0,
    300.0, 600.0,
)  # fmt: skip
"""Seconds, for requests and upstream answers: a cached reply in milliseconds, a long
reasoning answer or stream in minutes (the upstream read timeout is 10 minutes)."""
STAGE_BUCKETS: Final = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
"""Seconds, for pipeline stages: most take well under a millisecond; counting a cold
history takes tens, a summary made on the spot seconds."""
OTHER_MODEL: Final = "other"
MAX_MODELS: Final = 100
TOKEN_KINDS: Final = ("input", "output", "cache_read", "cache_write")


class ModelLabels:
    """The ``model`` label of a request, with a bounded number of values.

    A model keeps its name when the catalog knows it (a built-in or configured entry
    matches) or when the upstream answered a request for it with success, and the name
    is at most 100 printable characters; the first ``limit`` such names are kept for the
    life of the process, every other name is ``other``. A request without a model (an
    object, the model list) has ``""``. So a client sending made-up names cannot make the
    series grow without bound."""

    __slots__ = ("_catalog", "_kept", "limit")

    def __init__(self, catalog: ModelCatalog, limit: int = MAX_MODELS) -> None:
        self._catalog, self.limit = catalog, limit
        self._kept: dict[str, str] = {}

    def __call__(self, model: object, *, answered: bool) -> str:
        if not isinstance(model, str) or not model:
            return ""
        label = self._kept.get(model)
        if label is not None:
            return label
        if (
            len(self._kept) >= self.limit
            or len(model) > 100
            or not model.isprintable()
            or not (answered or self._catalog.knows(model))
        ):
            return OTHER_MODEL
        self._kept[model] = model
        return model


class Metrics:
    """The gateway's counters and histograms, and the cached children the request path
    records through."""

    __slots__ = (
        "_by_caller",
        "_by_request",
        "_by_route",
        "_by_stage",
        "_upstream",
        "cache_breaks",
        "compaction_tokens",
        "in_flight",
        "limiter_fail_open",
        "native_edits",
        "rate_limited",
        "registry",
        "request_duration",
        "requests",
        "stage_duration",
        "stage_failures",
        "store_fail_open",
        "summaries",
        "tokens_saved",
        "upstream_duration",
        "upstream_tokens",
    )

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry(auto_describe=True)

        # Requests (gateway.edge.access)
        self.requests = PlainCounter(
            "contextgate_requests",
            "Requests answered, by route, tenant, model and HTTP status.",
            ["route", "tenant", "model", "status"],
            registry=registry,
        )
        self.request_duration = PlainHistogram(
            "contextgate_request_duration_seconds",
            "Seconds from a request's arrival to the last byte of its answer (a stream's end).",
            ["route"],
            LATENCY_BUCKETS,
            registry=registry,
        )
        self.in_flight = 0
        """Requests being handled now, counted by the request middleware."""
        Gauge(
            "contextgate_requests_in_flight",
            "Requests being handled now (streams included).",
            registry=registry,
        ).set_function(lambda: self.in_flight)

        # Tokens (gateway.edge.access)
        self.upstream_tokens = PlainCounter(
            "contextgate_upstream_tokens",
            "Tokens the upstream reported in its usage, by kind: input (cache reads and"
            " writes included), output, cache_read, cache_write.",
            ["tenant", "model", "kind"],
            registry=registry,
        )
        self.compaction_tokens = PlainCounter(
            "contextgate_compaction_tokens",
            "Input tokens of forwarded requests by the gateway's count: as received (before)"
            " and as sent upstream after the pipeline (after).",
            ["tenant", "model", "phase"],
            registry=registry,
        )

        # Pipeline stages (gateway.edge.access, from the report of each forwarded request)
        self.stage_duration = PlainHistogram(
            "contextgate_stage_duration_seconds",
            "Seconds each pipeline stage took.",
            ["stage"],
            STAGE_BUCKETS,
            registry=registry,
        )
        self.stage_failures = PlainCounter(
            "contextgate_stage_failures",
            "Stage runs that raised and were skipped (the request went on without them).",
            ["stage"],
            registry=registry,
        )
        self.tokens_saved = PlainCounter(
            "contextgate_tokens_saved",
            "Input tokens each stage took out of forwarded requests (its tokens before less"
            " after; a stage that added tokens counts none).",
            ["stage"],
            registry=registry,
        )
        self.summaries = Counter(
            "contextgate_summaries",
            "Requests whose summarize stage took a path: made, prepared, reused, extended,"
            " notes-kept, fallback.",
            ["path"],
            registry=registry,
        )

        # Upstream (gateway.context.exchange)
        self.upstream_duration = PlainHistogram(
            "contextgate_upstream_duration_seconds",
            "Seconds from sending a request upstream to its answer: the whole body of a"
            " buffered answer, the first event of a stream; per attempt, by provider and"
            " outcome (success, error).",
            ["provider", "outcome"],
            LATENCY_BUCKETS,
            registry=registry,
        )

        # Native context management (gateway.context.native_request)
        self.native_edits = Counter(
            "contextgate_native_edits",
            "Provider-native context edits requested, by edit (clear_tool_uses_20250919,"
            " clear_thinking_20251015, compact_20260112, or the Responses API's compaction)"
            " and by who applies them: honour (the provider, as the client asked), polyfill"
            " (the gateway, where the provider cannot), prefer (the provider, asked by the"
            " gateway's policy).",
            ["edit", "mode"],
            registry=registry,
        )

        # Prompt cache (gateway.context.cache_breaks)
        self.cache_breaks = Counter(
            "contextgate_cache_breaks",
            "Requests that broke the provider's prompt cache of their conversation, by cause"
            " (model, system, tools, compaction, ttl, native, unknown).",
            ["cause"],
            registry=registry,
        )

        # Limits (gateway.tenancy.limits)
        self.rate_limited = Counter(
            "contextgate_rate_limited",
            "Requests refused with 429, by tenant (passthrough: all callers) and by the limit"
            " they hit (rate, concurrency).",
            ["tenant", "limit"],
            registry=registry,
        )
        self.limiter_fail_open = Counter(
            "contextgate_limiter_fail_open",
            "Limit checks or releases that could not reach Redis: the request went on.",
            registry=registry,
        )

        # Store (gateway.edge.access; the failures themselves are read by ``watch``)
        self.store_fail_open = Counter(
            "contextgate_store_fail_open",
            "Requests served although store operations failed during them (content kept in"
            " place, the conversation taken as new, no summary), rather than refused.",
            registry=registry,
        )

        self._by_route: dict[str, HistogramSeries] = {}
        self._by_request: dict[tuple[str, str, str, int], CounterSeries] = {}
        self._by_caller: dict[tuple[str, str], tuple[CounterSeries, ...]] = {}
        self._by_stage: dict[str, tuple[HistogramSeries, CounterSeries, CounterSeries]] = {}
        self._upstream = {
            (provider, ok): self.upstream_duration.series(provider, "success" if ok else "error")
            for provider in ("openai", "anthropic")
            for ok in (True, False)
        }

    def watch(self, stores: Stores, summaries: SummaryService, shedder: Shedder) -> None:
        """Export the counts ``stores``, ``summaries`` and ``shedder`` keep themselves."""
        self.registry.register(OwnCounts(stores, summaries))
        self.registry.register(Overload(shedder))

    def request(self, route: str, tenant: str, model: str, status: int, seconds: float) -> None:
        """One answered request."""
        key = (route, tenant, model, status)
        counter = self._by_request.get(key)
        if counter is None:
            counter = self._by_request[key] = self.requests.series(
                route, tenant, model, str(status)
            )
        counter.inc()
        duration = self._by_route.get(route)
        if duration is None:
            duration = self._by_route[route] = self.request_duration.series(route)
        duration.observe(seconds)

    def tokens(
        self, tenant: str, model: str, report: Report | None, usage: Mapping[str, Any] | None
    ) -> None:
        """A forwarded request's tokens: the pipeline's counts and the upstream's usage."""
        children = self._by_caller.get((tenant, model))
        if children is None:
            children = self._by_caller[(tenant, model)] = (
                self.compaction_tokens.series(tenant, model, "before"),
                self.compaction_tokens.series(tenant, model, "after"),
                *(self.upstream_tokens.series(tenant, model, kind) for kind in TOKEN_KINDS),
            )
        if report is not None:
            children[0].inc(report.tokens_before)
            children[1].inc(report.tokens_after)
        if usage:
            for child, count in zip(children[2:], usage_counts(usage), strict=True):
                if count:
                    child.inc(count)

    def expect(self, report: Report) -> None:
        """Make the children ``pipeline`` records ``report``'s stages in, recording
        nothing: the warm-up's pass through the pipeline names the stages, and the first
        request does not make them (33 of them, about a millisecond of prometheus-client
        validating labels and setting up buckets). Their series read 0 until then."""
        for stage in report.stages:
            self._stage(stage.name)

    def _stage(self, name: str) -> tuple[HistogramSeries, CounterSeries, CounterSeries]:
        children = self._by_stage.get(name)
        if children is None:
            children = self._by_stage[name] = (
                self.stage_duration.series(name),
                self.tokens_saved.series(name),
                self.stage_failures.series(name),
            )
        return children

    def pipeline(self, report: Report, summary_path: str | None) -> None:
        """What each stage of a forwarded request's pipeline did."""
        by_stage = self._by_stage
        for stage in report.stages:
            children = by_stage.get(stage.name) or self._stage(stage.name)
            children[0].observe(stage.ms / 1000)
            saved = stage.tokens_before - stage.tokens_after
            if saved > 0:
                children[1].inc(saved)
            if stage.error is not None:
                children[2].inc()
        if summary_path:
            self.summaries.labels(summary_path).inc()

    def upstream_answered(self, provider: str, seconds: float, ok: bool) -> None:
        """An upstream answer arrived ``seconds`` after its request went out."""
        self._upstream[(provider, ok)].observe(seconds)


def usage_counts(usage: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """Input, output, cache-read and cache-write tokens of an OpenAI-form ``usage``.

    Cache reads are ``prompt_tokens_details.cached_tokens``; cache writes are
    ``cache_creation_input_tokens`` (the gateway's Anthropic provider, LiteLLM) or
    ``prompt_tokens_details.cache_write_tokens`` (OpenRouter); absent is 0."""
    details = usage.get("prompt_tokens_details")
    if not isinstance(details, Mapping):
        details = {}
    return (
        _count(usage.get("prompt_tokens")),
        _count(usage.get("completion_tokens")),
        _count(details.get("cached_tokens")),
        _count(cache_writes(usage)),
    )


def cache_writes(usage: Mapping[str, Any]) -> Any:
    """The cache-write field of an OpenAI-form ``usage``, as it is (``usage_counts``)."""
    details = usage.get("prompt_tokens_details")
    fallback = details.get("cache_write_tokens") if isinstance(details, Mapping) else None
    return usage.get("cache_creation_input_tokens", fallback)


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
