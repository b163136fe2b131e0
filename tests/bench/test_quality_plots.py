"""bench.quality_plots: the series plotted and the PNG written."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bench.quality_plots import median_per_turn, plot_runs


@dataclass
class Replay:
    budget: int = 100
    turn_tokens: list[list[int]] = field(default_factory=lambda: [[10, 20, 30], [30, 40]])
    session_costs: list[float] = field(default_factory=lambda: [5.0, 7.0])


def test_median_per_turn_stops_where_too_few_sessions_remain() -> None:
    """The median at each request index, while enough sessions reach it."""
    assert median_per_turn([[10, 20, 30], [30, 40], [20, 60]], least=2) == [20, 40]
    assert median_per_turn([[1, 2]], least=20) == [1, 2]


def test_plot_runs_writes_a_png_and_links_it(tmp_path: Path) -> None:
    """One PNG per run, linked relative to the page."""
    lines = plot_runs(
        {"long sessions, max-input 100": {"none": Replay()}}, tmp_path / "img", tmp_path
    )
    png = tmp_path / "img" / "quality-long-sessions-max-input-100.png"
    assert png.read_bytes().startswith(b"\x89PNG")
    assert (
        lines[0] == "![long sessions, max-input 100](img/quality-long-sessions-max-input-100.png)"
    )
