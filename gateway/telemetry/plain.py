"""Histograms and counters kept as plain numbers, exported at scrape time: the families
every forwarded request records in (a stage's duration eleven times a request, the
request's duration, the upstream's latency, the request and token counts).

Through prometheus-client each observation took a lock or two and, for a histogram, a
walk of the buckets in Python: about a tenth of a small request's work in the gateway.
Here an observation is one or two additions (a histogram's bucket found by a bisect),
made on the event loop's thread, where the request middleware and the exchange record.
``collect`` writes each family as prometheus-client's ``Histogram`` or ``Counter`` does:
the same samples in the same order, with the same values (a sum is added up observation
by observation, as there) and each series' ``_created`` time, honouring
``PROMETHEUS_DISABLE_CREATED_SERIES`` as the library does. Tests compare the two
expositions.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from math import inf
from time import time
from typing import Generic, TypeVar

from prometheus_client import metrics as _library
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

__all__ = ["CounterSeries", "HistogramSeries", "PlainCounter", "PlainHistogram"]


class HistogramSeries:
    """One series of a histogram: the count in each bucket (not cumulative), the sum of
    the observations, and when the series was made."""

    __slots__ = ("_bounds", "buckets", "created", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.buckets = [0.0] * (len(bounds) + 1)
        self.sum = 0.0
        self.created = time()

    def observe(self, value: float) -> None:
        """One observation: in the first bucket whose bound is at least ``value`` (the
        last one, ``+Inf``, past every bound), as ``Histogram.observe`` picks it."""
        self.sum += value
        self.buckets[bisect_left(self._bounds, value)] += 1.0


class CounterSeries:
    """One series of a counter: its total, and when it was made."""

    __slots__ = ("created", "total")

    def __init__(self) -> None:
        self.total = 0.0
        self.created = time()

    def inc(self, amount: float = 1.0) -> None:
        """Add ``amount`` (never negative: the callers count requests and tokens)."""
        self.total += amount


S = TypeVar("S", "HistogramSeries", "CounterSeries")


class _Family(Collector, Generic[S]):
    """A family's series by label values, made on first use and kept for the process's
    life (the callers bound the values a label takes); registered with ``registry`` as
    prometheus-client's metrics are."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        registry: CollectorRegistry,
    ) -> None:
        self.name, self.documentation = name, documentation
        self.labelnames = tuple(labelnames)
        self._series: dict[tuple[str, ...], S] = {}
        registry.register(self)

    def _new(self) -> S:
        raise NotImplementedError

    def series(self, *labels: str) -> S:
        """The series of ``labels`` (one value per label name), made at 0 if it is new."""
        found = self._series.get(labels)
        if found is None:
            if len(labels) != len(self.labelnames):
                raise ValueError(f"{self.name} takes the labels {self.labelnames}")
            found = self._series[labels] = self._new()
        return found

    def _created(self, family: Metric, labels: tuple[str, ...], created: float) -> None:
        # prometheus-client's own switch (PROMETHEUS_DISABLE_CREATED_SERIES,
        # disable_created_metrics), private: read as the library's metrics read it.
        if getattr(_library, "_use_created", True):
            family.add_sample(
                f"{self.name}_created", dict(zip(self.labelnames, labels, strict=True)), created
            )


class PlainHistogram(_Family[HistogramSeries]):
    """A histogram by ``labelnames``, with ``buckets`` as its finite bounds (``+Inf`` is
    added)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        bounds = tuple(float(bound) for bound in buckets)
        if list(bounds) != sorted(bounds) or inf in bounds:
            raise ValueError("buckets must be sorted and finite (+Inf is added)")
        self._bounds = bounds
        self._les = [floatToGoString(b) for b in (*bounds, inf)]  # type: ignore[no-untyped-call]
        super().__init__(name, documentation, labelnames, registry)

    def _new(self) -> HistogramSeries:
        return HistogramSeries(self._bounds)

    def describe(self) -> Iterable[Metric]:
        return [HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, series in list(self._series.items()):
            cumulative, acc = [], 0.0
            for le, count in zip(self._les, list(series.buckets), strict=True):
                acc += count
                cumulative.append((le, acc))
            family.add_metric(labels, cumulative, series.sum)
            self._created(family, labels, series.created)
        yield family


class PlainCounter(_Family[CounterSeries]):
    """A counter by ``labelnames`` (``name`` without the ``_total`` suffix, which the
    exposition adds)."""

    def _new(self) -> CounterSeries:
        return CounterSeries()

    def describe(self) -> Iterable[Metric]:
        return [CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, series in list(self._series.items()):
            family.add_metric(labels, series.total)
            self._created(family, labels, series.created)
        yield family
