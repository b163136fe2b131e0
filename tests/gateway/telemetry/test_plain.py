"""Histograms and counters kept as plain numbers: their exposition is the one
prometheus-client's ``Histogram`` and ``Counter`` give for the same observations, byte for
byte."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client import metrics as library

from gateway.telemetry import plain
from gateway.telemetry.metrics import STAGE_BUCKETS
from gateway.telemetry.plain import PlainCounter, PlainHistogram

LABELS = (("filter", "a"), ("compress", "b"), ("filter", "b"))
seconds = st.one_of(
    st.floats(min_value=0, max_value=100, allow_nan=False),
    st.sampled_from([0.0, *STAGE_BUCKETS, 60.000001, 1e9]),
)
Observations = list[tuple[tuple[str, str], float]]


def expositions(observations: Observations, *, made: bool = True) -> tuple[str, str]:
    """The text of a registry holding prometheus-client's histogram and counter, and of one
    holding their plain counterparts, with the same series made (``made``: all of them
    before the first observation, as the warm-up makes the stages') and the same
    observations (each counted too, by its value)."""
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    names = ("stage", "kind")
    histogram = Histogram("h_seconds", "A histogram.", names, registry=theirs,
                          buckets=STAGE_BUCKETS)  # fmt: skip
    counter = Counter("c", "A counter.", names, registry=theirs)
    plain_histogram = PlainHistogram("h_seconds", "A histogram.", names, STAGE_BUCKETS, ours)
    plain_counter = PlainCounter("c", "A counter.", names, ours)
    for labels in LABELS if made else ():
        histogram.labels(*labels)
        counter.labels(*labels)
        plain_histogram.series(*labels)
        plain_counter.series(*labels)
    for labels, value in observations:
        histogram.labels(*labels).observe(value)
        counter.labels(*labels).inc(value)
        plain_histogram.series(*labels).observe(value)
        plain_counter.series(*labels).inc(value)
    return generate_latest(theirs).decode(), generate_latest(ours).decode()


@pytest.fixture(autouse=True)
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both make their series at the same (fixed) time, for the ``_created`` samples."""
    monkeypatch.setattr(library.time, "time", lambda: 1_700_000_000.25)
    monkeypatch.setattr(plain, "time", lambda: 1_700_000_000.25)


@given(st.lists(st.tuples(st.sampled_from(LABELS), seconds), max_size=40), st.booleans())
def test_the_exposition_is_prometheus_clients_for_the_same_observations(
    observations: Observations, made: bool
) -> None:
    """Buckets (a value on a bound included in it), counts, sums and totals to the last
    bit and ``_created`` read as prometheus-client's read them, series in the order they
    were made, those made before any observation at 0."""
    theirs, ours = expositions(observations, made=made)
    assert ours == theirs


def test_without_created_series_neither_has_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """``PROMETHEUS_DISABLE_CREATED_SERIES`` (the library's switch) holds here too."""
    monkeypatch.setattr(library, "_use_created", False)
    theirs, ours = expositions([(("filter", "a"), 0.0002), (("compress", "b"), 3.0)])
    assert "_created" not in ours
    assert ours == theirs


def test_buckets_must_be_sorted_and_finite_and_labels_complete() -> None:
    """A bucket list out of order, or with ``+Inf`` (always added), is refused, and so is
    a series named with fewer label values than the family has labels."""
    with pytest.raises(ValueError, match="sorted"):
        PlainHistogram("h", "A histogram.", ["stage"], (0.1, 0.01), CollectorRegistry())
    with pytest.raises(ValueError, match="sorted"):
        PlainHistogram("h", "A histogram.", ["stage"], (0.1, float("inf")), CollectorRegistry())
    with pytest.raises(ValueError, match="labels"):
        PlainCounter("c", "A counter.", ["stage", "kind"], CollectorRegistry()).series("filter")
