"""Plots of the context-quality replays (matplotlib, PNG): tokens sent per request and
cost per session, per method."""

from __future__ import annotations

import os
import re
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, MaxNLocator

MIN_SESSIONS = 20
"""A request index is plotted while at least this many sessions reach it."""

COLOURS = {
    "none": "#7f7f7f",
    "drop-oldest": "#ff7f0e",
    "middle-out": "#9467bd",
    "headroom": "#2ca02c",
    "contextgate": "#1f77b4",
}


STYLES: dict[str, dict[str, Any]] = {
    # The raw history and Headroom often coincide: the raw one dashed, on top.
    "none": {"linestyle": "--", "linewidth": 2.0, "zorder": 3},
}
THOUSANDS = FuncFormatter(lambda value, _: f"{value:,.0f}")


class Replayed(Protocol):
    """What a plot needs of one method's replay (``bench.compaction.Tally``)."""

    budget: int
    turn_tokens: list[list[int]]
    session_costs: list[float]


def median_per_turn(sessions: Sequence[Sequence[int]], least: int = MIN_SESSIONS) -> list[float]:
    """The median over sessions of the tokens sent at each request index, while at least
    ``least`` sessions (or all, if fewer) have a request at that index."""
    least = min(least, len(sessions))
    out: list[float] = []
    for index in range(max((len(s) for s in sessions), default=0)):
        values = [s[index] for s in sessions if len(s) > index]
        if len(values) < least or not values:
            break
        out.append(statistics.median(values))
    return out


def plot_run(title: str, tallies: Mapping[str, Replayed], path: Path) -> None:
    """One PNG: median tokens per request (left), cost per session (right)."""
    figure, (turns, costs) = plt.subplots(1, 2, figsize=(12, 4.5), width_ratios=(3, 2))
    budget = next(iter(tallies.values())).budget
    for name, tally in tallies.items():
        series = median_per_turn(tally.turn_tokens)
        turns.plot(
            range(1, len(series) + 1),
            series,
            label=name,
            color=COLOURS.get(name),
            **STYLES.get(name, {}),
        )
    turns.axhline(budget, color="black", linestyle=":", linewidth=1, label="max-input")
    turns.set(xlabel="request in session", ylabel="tokens sent (median over sessions)")
    turns.set_title("Tokens per request", fontsize=10)
    turns.legend(fontsize=8)
    turns.grid(alpha=0.3)
    names = list(tallies)
    box = costs.boxplot(
        [tallies[n].session_costs for n in names], showfliers=False, patch_artist=True
    )
    for patch, name in zip(box["boxes"], names, strict=True):
        patch.set_facecolor(COLOURS.get(name, "#cccccc"))
        patch.set_alpha(0.6)
    costs.set_xticks(range(1, len(names) + 1), names, rotation=20, fontsize=8)
    costs.set_ylabel("cost per session (uncached-token units)")
    costs.yaxis.set_major_formatter(THOUSANDS)
    turns.yaxis.set_major_formatter(THOUSANDS)
    turns.xaxis.set_major_locator(MaxNLocator(integer=True))
    costs.set_title("Cost per session under cache pricing", fontsize=10)
    costs.grid(alpha=0.3, axis="y")
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(figure)


def plot_runs(runs: Mapping[str, Mapping[str, Replayed]], folder: Path, doc: Path) -> list[str]:
    """A PNG per run under ``folder``; the Markdown lines that show them from a page in
    ``doc``."""
    lines = []
    for title, tallies in runs.items():
        slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
        path = folder / f"quality-{slug}.png"
        plot_run(title, tallies, path)
        lines += [f"![{title}]({os.path.relpath(path, doc)})", ""]
    return lines
