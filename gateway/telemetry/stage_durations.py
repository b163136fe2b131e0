"""``contextgate_stage_duration_seconds``: the seconds each pipeline stage took, a
histogram by stage, kept as plain numbers and exported at scrape time.

A forwarded request records eleven of these observations. Through prometheus-client's
``Histogram.observe`` each took two locks and a walk of the buckets in Python, about a
twentieth of a small request's work in the gateway; here an observation is a bisect and
two additions (``StageSeries.observe``, on the event loop's thread, as the request
middleware records). ``StageDurations.collect`` writes the families as
prometheus-client's histogram does: the same samples in the same order, with the same
values (the sum is added up observation by observation, as there) and each series'
``_created`` time, honouring ``PROMETHEUS_DISABLE_CREATED_SERIES`` as the library does. A
test compares the two expositions.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from math import inf
from time import time

from prometheus_client import metrics as _library
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = ["StageDurations", "StageSeries"]

NAME = "contextgate_stage_duration_seconds"
DOCUMENTATION = "Seconds each pipeline stage took."


class StageSeries:
    """One stage's histogram: the count in each bucket (not cumulative), the sum of the
    observations, and when the series was made."""

    __slots__ = ("_bounds", "buckets", "created", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.buckets = [0.0] * (len(bounds) + 1)
        self.sum = 0.0
        self.created = time()

    def observe(self, seconds: float) -> None:
        """One run of the stage: the first bucket whose bound is at least ``seconds``
        (the last one, ``+Inf``, past every bound), as ``Histogram.observe`` picks it."""
        self.sum += seconds
        self.buckets[bisect_left(self._bounds, seconds)] += 1.0


class StageDurations(Collector):
    """The histogram's series by stage, made on first use and kept for the process's life
    (the stages are the pipeline's, a bounded set)."""

    __slots__ = ("_bounds", "_les", "_series")

    def __init__(self, buckets: Sequence[float]) -> None:
        bounds = tuple(float(bound) for bound in buckets)
        if list(bounds) != sorted(bounds) or inf in bounds:
            raise ValueError("buckets must be sorted and finite (+Inf is added)")
        self._bounds = bounds
        self._les = [floatToGoString(b) for b in (*bounds, inf)]  # type: ignore[no-untyped-call]
        self._series: dict[str, StageSeries] = {}

    def series(self, stage: str) -> StageSeries:
        """``stage``'s series, made (at 0) if it is new."""
        found = self._series.get(stage)
        if found is None:
            found = self._series[stage] = StageSeries(self._bounds)
        return found

    def describe(self) -> Iterable[Metric]:
        return [HistogramMetricFamily(NAME, DOCUMENTATION, labels=["stage"])]

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(NAME, DOCUMENTATION, labels=["stage"])
        created = _library._use_created
        for stage, series in list(self._series.items()):
            cumulative, acc = [], 0.0
            for le, count in zip(self._les, list(series.buckets), strict=True):
                acc += count
                cumulative.append((le, acc))
            family.add_metric([stage], cumulative, series.sum)
            if created:
                family.add_sample(f"{NAME}_created", {"stage": stage}, series.created)
        yield family
