"""Prometheus metrics, exported at ``GET /metrics``.

Each gateway has its own registry (several apps may share a process, in tests), held by
``Gateway``; the route renders it in the text exposition format.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

__all__ = ["Metrics"]


class Metrics:
    """The gateway's counters and histograms."""

    __slots__ = ("cache_breaks", "limiter_fail_open", "rate_limited", "registry")

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.cache_breaks = Counter(
            "contextgate_cache_breaks",
            "Requests that broke the provider's prompt cache of their conversation, by cause"
            " (model, system, tools, compaction, ttl, unknown).",
            ["cause"],
            registry=self.registry,
        )
        self.rate_limited = Counter(
            "contextgate_rate_limited",
            "Requests refused with 429, by tenant (passthrough: all callers) and by the limit"
            " they hit (rate, concurrency).",
            ["tenant", "limit"],
            registry=self.registry,
        )
        self.limiter_fail_open = Counter(
            "contextgate_limiter_fail_open",
            "Limit checks or releases that could not reach Redis: the request went on.",
            registry=self.registry,
        )
