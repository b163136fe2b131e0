"""How the inspector's pages write numbers, money and times: the templates' filters.

Numbers carry thousands separators; an unknown value is written as such (``unknown`` for
money, a dash elsewhere), never as zero. Times are UTC, relative where a person scans
(``2 min ago``) with the exact time beside or in a ``title``.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote

from gateway.routes.inspector.views import number, segments

if TYPE_CHECKING:  # loaded with the first page (``gateway.routes.inspector.engine``)
    from jinja2 import Environment
    from litestar.plugins.jinja import JinjaTemplateEngine

__all__ = [
    "FILTERS",
    "ago",
    "clock",
    "delta",
    "money",
    "percent",
    "prepare_engine",
    "tokens",
    "when",
]

UNKNOWN: Final = "unknown"
DASH: Final = "—"
MINUS: Final = "\u2212"


def tokens(value: Any) -> str:
    """``181,234``; a dash when unknown."""
    found = number(value)
    return f"{round(found):,}" if found is not None else DASH


def money(value: Any) -> str:
    """``$12.35``, ``$0.987``, ``$0.0740``: cents from a dollar, three significant digits
    under; ``unknown`` when unknown."""
    found = number(value)
    if found is None:
        return UNKNOWN
    sign, found = MINUS if found < 0 else "", abs(found)
    places = 2 if found >= 1 else 3 if found >= 0.1 else 4
    return f"{sign}${found:,.{places}f}"


def delta(value: Any) -> str:
    """``+1,600`` or ``\u22121,600``: a change in tokens."""
    found = number(value)
    if found is None:
        return DASH
    return f"{MINUS if found < 0 else '+'}{abs(round(found)):,}"


def percent(value: Any) -> str:
    """``45%`` (a share from 0 to 1), one decimal under 10%; a dash when unknown."""
    found = number(value)
    if found is None:
        return DASH
    shown = found * 100
    return f"{shown:.1f}%" if abs(shown) < 10 and shown != 0 else f"{shown:.0f}%"


def when(value: Any) -> str:
    """``2025-11-29 10:13:20 UTC``."""
    found = number(value)
    if found is None:
        return DASH
    return datetime.fromtimestamp(found, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def clock(value: Any) -> str:
    """``10:13:20`` (UTC)."""
    found = number(value)
    return datetime.fromtimestamp(found, UTC).strftime("%H:%M:%S") if found is not None else DASH


def ago(value: Any, now: float | None = None) -> str:
    """``just now``, ``40 s ago``, ``2 min ago``, ``3 h ago``, ``2 days ago``."""
    found = number(value)
    if found is None:
        return DASH
    seconds = max(0.0, (time.time() if now is None else now) - found)
    if seconds < 5:
        return "just now"
    if seconds < 60:
        return f"{seconds:.0f} s ago"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min ago"
    if seconds < 86_400:
        return f"{seconds // 3600:.0f} h ago"
    days = seconds // 86_400
    return f"{days:.0f} day{'s' if days != 1 else ''} ago"


def path_part(value: Any) -> str:
    """``value`` as one segment of a URL's path (a ``/`` in it escaped too)."""
    return quote(str(value), safe="")


FILTERS: Final = {
    "tokens": tokens,
    "delta": delta,
    "money": money,
    "percent": percent,
    "when": when,
    "clock": clock,
    "ago": ago,
    "path_part": path_part,
    "segments": segments,
}


def prepare_engine(engine: JinjaTemplateEngine) -> None:
    """The inspector's filters on Litestar's Jinja environment (which escapes
    everything). A field the ledger lacks reads as undefined: shown as unknown, not an
    error."""
    environment: Environment = engine.engine
    environment.trim_blocks = environment.lstrip_blocks = True
    environment.filters.update(FILTERS)
