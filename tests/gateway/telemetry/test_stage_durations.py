"""The stage-duration histogram kept as plain numbers: its exposition is the one
prometheus-client's ``Histogram`` gives for the same observations, byte for byte."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client import metrics as library

from gateway.telemetry import stage_durations
from gateway.telemetry.metrics import STAGE_BUCKETS
from gateway.telemetry.stage_durations import NAME, StageDurations

STAGES = ("guard_inbound", "filter", "compress")
seconds = st.one_of(
    st.floats(min_value=0, max_value=100, allow_nan=False),
    st.sampled_from([0.0, *STAGE_BUCKETS, 60.000001, 1e9]),
)


def expositions(observations: list[tuple[str, float]], made: tuple[str, ...]) -> tuple[str, str]:
    """The text of a registry holding prometheus-client's histogram, and of one holding
    ``StageDurations``, after the same series were made and the same observations made."""
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    histogram = Histogram(NAME, "Seconds each pipeline stage took.", ["stage"], registry=theirs,
                          buckets=STAGE_BUCKETS)  # fmt: skip
    durations = StageDurations(STAGE_BUCKETS)
    ours.register(durations)
    for stage in made:
        histogram.labels(stage)
        durations.series(stage)
    for stage, value in observations:
        histogram.labels(stage).observe(value)
        durations.series(stage).observe(value)
    return generate_latest(theirs).decode(), generate_latest(ours).decode()


@pytest.fixture(autouse=True)
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both make their series at the same (fixed) time, for the ``_created`` samples."""
    monkeypatch.setattr(library.time, "time", lambda: 1_700_000_000.25)
    monkeypatch.setattr(stage_durations, "time", lambda: 1_700_000_000.25)


@given(st.lists(st.tuples(st.sampled_from(STAGES), seconds), max_size=40))
def test_the_exposition_is_the_histograms_for_the_same_observations(
    observations: list[tuple[str, float]],
) -> None:
    """Buckets (a value on a bound included in it), counts, sums to the last bit and
    ``_created`` read as prometheus-client's histogram reads them, series in the order
    they were made, the ones made at the warm-up at 0."""
    theirs, ours = expositions(observations, made=STAGES)
    assert ours == theirs


def test_without_created_series_neither_has_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """``PROMETHEUS_DISABLE_CREATED_SERIES`` (the library's switch) holds here too."""
    monkeypatch.setattr(library, "_use_created", False)
    theirs, ours = expositions([("filter", 0.0002), ("compress", 3.0)], made=())
    assert "_created" not in ours
    assert ours == theirs


def test_buckets_must_be_sorted_and_finite() -> None:
    """A bucket list out of order, or with ``+Inf`` (always added), is refused."""
    with pytest.raises(ValueError, match="sorted"):
        StageDurations((0.1, 0.01))
    with pytest.raises(ValueError, match="sorted"):
        StageDurations((0.1, float("inf")))
