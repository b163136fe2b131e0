"""What the metrics read at scrape time from the parts that count for themselves: the
store's failures and circuit, the summary service's jobs, the shedder's view of the
process's load. Each part is seen through a protocol of what is read of it, so that
telemetry knows none of them (``Metrics.watch``)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["Overload", "OwnCounts", "Shedder", "Stores", "SummaryService"]


class _Breaker(Protocol):
    @property
    def state(self) -> str: ...


class _Redis(Protocol):
    @property
    def failed(self) -> Mapping[str, int]: ...

    @property
    def breaker(self) -> _Breaker: ...


class Stores(Protocol):
    """What the metrics read of the stores (``gateway.store.Stores``)."""

    @property
    def redis(self) -> _Redis | None: ...


class SummaryService(Protocol):
    """What the metrics read of the summary service (``gateway.summaries.service``)."""

    @property
    def counts(self) -> Mapping[str, int]: ...


class Shedder(Protocol):
    """What the metrics read of the process's load (``gateway.edge.overload.Shedder``)."""

    @property
    def shed(self) -> Mapping[str, int]: ...

    @property
    def in_flight(self) -> int: ...

    @property
    def pending(self) -> int: ...

    @property
    def limit(self) -> int | None: ...

    @property
    def wait(self) -> float: ...

    @property
    def lag(self) -> float: ...

    @property
    def accept_queue(self) -> int: ...

    @property
    def tasks(self) -> int: ...


class OwnCounts(Collector):
    """Counts the store and the summary service keep themselves, read at scrape time."""

    def __init__(self, stores: Stores, summaries: SummaryService) -> None:
        self._stores, self._summaries = stores, summaries

    def collect(self) -> Iterator[Metric]:
        failures = CounterMetricFamily(
            "contextgate_store_failures",
            "Store operations that failed (timeout, refused connection, error) or that the"
            " open circuit breaker refused, by operation.",
            labels=["operation"],
        )
        circuit = GaugeMetricFamily(
            "contextgate_store_circuit_open",
            "1 while the store's circuit breaker is open (the store is not asked), else 0.",
        )
        redis = self._stores.redis
        if redis is not None:
            for operation, count in sorted(redis.failed.items()):
                failures.add_metric([operation], count)
        circuit.add_metric([], 1.0 if redis is not None and redis.breaker.state == "open" else 0.0)
        jobs = CounterMetricFamily(
            "contextgate_summary_jobs",
            "Summary jobs by outcome: scheduled (queued for the background), busy (one was"
            " already queued or running for the conversation), queue_full (dropped), made,"
            " reused (a stored checkpoint served), locked (another replica was making it),"
            " failed.",
            labels=["outcome"],
        )
        for outcome, count in sorted(self._summaries.counts.items()):
            jobs.add_metric([outcome], count)
        yield failures
        yield circuit
        yield jobs


class Overload(Collector):
    """What the shedder (``gateway.edge.overload``) knows of the process's load, read at scrape
    time."""

    def __init__(self, shedder: Shedder) -> None:
        self._shedder = shedder

    def collect(self) -> Iterator[Metric]:
        shedder = self._shedder
        shed = CounterMetricFamily(
            "contextgate_overload_shed",
            "Requests refused with 503 gateway_overloaded, by reason: in_flight (max_in_flight"
            " reached), loop_wait (the limit that work waiting for the event loop longer than"
            " max_queue_delay has set).",
            labels=["reason"],
        )
        for reason, count in shedder.shed.items():
            shed.add_metric([reason], count)
        yield shed
        yield GaugeMetricFamily(
            "contextgate_admitted_in_flight",
            "Requests past admission and not finished (public routes not counted): what"
            " max_in_flight caps.",
            value=shedder.in_flight,
        )
        yield GaugeMetricFamily(
            "contextgate_admission_pending",
            "Work requests the server's protocol let through whose task has not started"
            " yet, counted against the admission limit: 0 at rest.",
            value=shedder.pending,
        )
        if shedder.limit is not None:
            yield GaugeMetricFamily(
                "contextgate_admission_limit",
                "Requests in flight past which new ones are refused now: max_in_flight, or"
                " less while work waits for the event loop longer than max_queue_delay.",
                value=shedder.limit,
            )
        yield GaugeMetricFamily(
            "contextgate_event_loop_wait_seconds",
            "Seconds a callback last took through 20 turns of the event loop: about what a"
            " small request waits for the loop.",
            value=shedder.wait,
        )
        yield GaugeMetricFamily(
            "contextgate_event_loop_lag_seconds",
            "Seconds the event loop is behind: how late a timer it sets every 50 ms fires.",
            value=shedder.lag,
        )
        yield GaugeMetricFamily(
            "contextgate_accept_queue",
            "Connections the kernel has completed and the process has not accepted yet.",
            value=shedder.accept_queue,
        )
        yield GaugeMetricFamily(
            "contextgate_event_loop_tasks",
            "asyncio tasks alive on the event loop.",
            value=shedder.tasks,
        )
