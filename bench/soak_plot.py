"""RSS over time of the soak's two gateways (matplotlib, PNG), from the CSV the soak writes
(``CONTEXTGATE_SOAK_CSV``, ``make soak``'s ``SOAK_CSV``: ``variant,seconds,rss_mib,requests``).

    .venv/bin/python -m bench.soak_plot soak-rss.csv docs/img/soak-rss.png

The 10-minute mark, after which the soak allows 5 MiB of growth, is drawn, and each
variant's line is labelled with its growth from there to its end."""

from __future__ import annotations

import csv
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

SETTLED_AFTER = 600.0
COLOURS = {"memory": "#1f77b4", "redis-traced": "#ff7f0e"}
LABELS = {"memory": "in-memory store", "redis-traced": "Redis store, tracing on"}


def read(path: Path) -> dict[str, list[tuple[float, float, int]]]:
    """Each variant's samples: (minutes, RSS in MiB, requests so far)."""
    series: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    with path.open(newline="") as file:
        for row in csv.DictReader(file):
            seconds = float(row["seconds"])
            series[row["variant"]].append(
                (seconds / 60, float(row["rss_mib"]), int(row["requests"]))
            )
    return series


def plot(series: dict[str, list[tuple[float, float, int]]], output: Path) -> None:
    figure, axes = plt.subplots(figsize=(9, 4.5), dpi=120)
    for variant, samples in sorted(series.items()):
        minutes = [m for m, _, _ in samples]
        rss = [r for _, r, _ in samples]
        later = [r for m, r, _ in samples if m * 60 >= SETTLED_AFTER]
        growth = f", +{max(later) - later[0]:.1f} MiB after 10 min" if later else ""
        label = f"{LABELS.get(variant, variant)} ({samples[-1][2]:,} requests{growth})"
        axes.plot(minutes, rss, label=label, color=COLOURS.get(variant), linewidth=1.5)
    axes.axvline(SETTLED_AFTER / 60, color="#7f7f7f", linestyle=":", linewidth=1)
    axes.set_xlabel("minutes of traffic")
    axes.set_ylabel("RSS (MiB)")
    axes.set_title("contextgate soak: RSS of each gateway process")
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output)
    plt.close(figure)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m bench.soak_plot SOAK.csv OUTPUT.png", file=sys.stderr)
        return 2
    plot(read(Path(argv[0])), Path(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
