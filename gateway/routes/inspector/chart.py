"""The timeline's chart: a conversation's requests, oldest left, as an SVG's geometry.

Two series: the tokens the client sent and those that went up. Behind them the budget and
the trigger, target and emergency levels, as steps (a level moves only where a request's
budget did, so a steady conversation shows straight lines). Compaction events and cache
breaks are marked on their requests. Only coordinates and labels are made here; the
template draws them (``_chart.html``), so everything in the SVG is escaped like the rest.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from gateway.routes.inspector.views import number

__all__ = ["LEVELS", "Chart", "Column", "Level", "chart_of", "short_tokens"]

WIDTH: Final = 1200
HEIGHT: Final = 300
_LEFT, _RIGHT, _TOP, _BOTTOM = 56, 84, 22, 30
_LABEL_GAP: Final = 13
"""Pixels between the levels' labels at least, so that close levels stay readable."""
LEVELS: Final = (
    ("budget", "Budget"),
    ("emergency", "Emergency"),
    ("trigger", "Trigger"),
    ("target", "Target"),
)
"""The levels drawn, by their names in an entry (``tokens.budget``, ``thresholds.*``)."""


@dataclass(frozen=True, slots=True)
class Column:
    """One request's place on the chart."""

    number: int
    """Its position in the conversation, from 1 (the oldest shown)."""
    id: str
    x: float
    client: float | None
    upstream: float | None
    client_y: float | None
    upstream_y: float | None
    compaction: bool
    cache_break: bool


@dataclass(frozen=True, slots=True)
class Level:
    name: str
    label: str
    path: str
    """The SVG path's ``d``: steps across the requests that had the level."""
    label_y: float


@dataclass(frozen=True, slots=True)
class Chart:
    columns: list[Column]
    client: str
    upstream: str
    levels: list[Level]
    y_ticks: list[tuple[float, str]]
    x_ticks: list[tuple[float, str]]
    width: int = WIDTH
    height: int = HEIGHT
    left: int = _LEFT
    right: int = WIDTH - _RIGHT
    top: int = _TOP
    bottom: int = HEIGHT - _BOTTOM


def short_tokens(value: float) -> str:
    """``150k``, ``1.5M``: an axis label."""
    if value >= 1_000_000:
        return f"{value / 1_000_000:.3g}M"
    if value >= 1_000:
        return f"{value / 1_000:.3g}k"
    return f"{value:.0f}"


def _nice(value: float) -> float:
    """The round step (1, 2, 2.5 or 5 times a power of ten) at or above ``value``."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(m * power for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * power >= value)


def _level(entry: Mapping[str, Any], name: str) -> float | None:
    if name == "budget":
        tokens = entry.get("tokens")
        return number(tokens.get("budget")) if isinstance(tokens, Mapping) else None
    thresholds = entry.get("thresholds")
    return number(thresholds.get(name)) if isinstance(thresholds, Mapping) else None


def _tokens(entry: Mapping[str, Any], side: str) -> float | None:
    tokens = entry.get("tokens")
    return number(tokens.get(side)) if isinstance(tokens, Mapping) else None


def chart_of(entries: Sequence[Mapping[str, Any]]) -> Chart:
    """The chart of ``entries``, given oldest first."""
    count = max(1, len(entries))
    band = (WIDTH - _RIGHT - _LEFT) / count
    values = [
        value
        for entry in entries
        for value in (
            _tokens(entry, "client"),
            _tokens(entry, "upstream"),
            *(_level(entry, name) for name, _ in LEVELS),
        )
        if value is not None
    ]
    step = _nice(max(values, default=0) * 1.05 / 5)
    top_value = step * max(1, math.ceil(max(values, default=0) * 1.05 / step))
    plot = HEIGHT - _BOTTOM - _TOP

    def y(value: float) -> float:
        return round(HEIGHT - _BOTTOM - plot * value / top_value, 1)

    columns = []
    for index, entry in enumerate(entries):
        client, upstream = _tokens(entry, "client"), _tokens(entry, "upstream")
        cache = entry.get("cache")
        columns.append(
            Column(
                number=index + 1,
                id=str(entry.get("id", "")),
                x=round(_LEFT + band * (index + 0.5), 1),
                client=client,
                upstream=upstream,
                client_y=y(client) if client is not None else None,
                upstream_y=y(upstream) if upstream is not None else None,
                compaction=entry.get("compaction") is True,
                cache_break=isinstance(cache, Mapping) and cache.get("verdict") == "break",
            )
        )
    levels = []
    for name, label in LEVELS:
        steps = [(c.x, _level(e, name)) for c, e in zip(columns, entries, strict=True)]
        path = _steps(steps, band, y)
        latest = next((value for _, value in reversed(steps) if value is not None), None)
        if path and latest is not None:
            levels.append(Level(name, label, path, y(latest)))
    levels = _apart(levels)
    ticks = [(y(step * i), short_tokens(step * i)) for i in range(int(top_value / step) + 1)]
    every = max(1, int(_nice(count / 10)))
    x_ticks = [(c.x, f"#{c.number}") for c in columns if c.number == 1 or c.number % every == 0]
    return Chart(
        columns=columns,
        client=_line([(c.x, c.client_y) for c in columns]),
        upstream=_line([(c.x, c.upstream_y) for c in columns]),
        levels=levels,
        y_ticks=ticks,
        x_ticks=x_ticks,
    )


def _apart(levels: list[Level]) -> list[Level]:
    """The levels with their labels moved down where one would cover the one above."""
    placed: list[Level] = []
    for level in sorted(levels, key=lambda found: found.label_y):
        lowest = placed[-1].label_y + _LABEL_GAP if placed else level.label_y
        placed.append(replace(level, label_y=max(level.label_y, lowest)))
    return placed


def _line(points: Sequence[tuple[float, float | None]]) -> str:
    """A path through the points, broken where one is missing."""
    parts, drawing = [], False
    for x, y in points:
        if y is None:
            drawing = False
            continue
        parts.append(f"{'L' if drawing else 'M'}{x} {y}")
        drawing = True
    return " ".join(parts)


def _steps(steps: Sequence[tuple[float, float | None]], band: float, y: Any) -> str:
    """Each request's level as a flat step across its band, joined where they follow."""
    parts, drawing = [], False
    for x, value in steps:
        if value is None:
            drawing = False
            continue
        start, end = round(x - band / 2, 1), round(x + band / 2, 1)
        parts.append(f"{'L' if drawing else 'M'}{start} {y(value)} H{end}")
        drawing = True
    return " ".join(parts)
