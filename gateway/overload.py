"""Overload shedding: the process refuses new work it cannot do in time, with a 503
``gateway_overloaded`` and ``Retry-After``, instead of queueing it until every request is
late.

Two signals, checked by ``gateway.admission`` before anything else is done for a request
(public routes are never checked, so probes and scrapes keep answering):

- ``max_in_flight``: requests past admission and not yet finished (a stream until its last
  event). A hard cap on what the process holds in memory at once.
- ``max_event_loop_lag``: how late the event loop runs a timer it set for itself every
  ``TICK`` seconds. A saturated loop runs callbacks late; every request it still admits
  waits in the same queue. The lag counted is the larger of the last tick's lateness and
  how overdue the next tick is now, so a loop that has been stuck since its last tick is
  seen at once, not one tick later.

The shedder counts refusals by reason (``in_flight``, ``event_loop_lag``) for the metrics
and keeps no per-request state beyond the in-flight count.
"""

from __future__ import annotations

import asyncio
import time
from typing import Final

from gateway.errors import Overloaded

__all__ = ["REASONS", "TICK", "Shedder"]

TICK: Final = 0.05
"""Seconds between two readings of the event loop's lag."""
REASONS: Final = ("in_flight", "event_loop_lag")
RETRY_AFTER: Final = "1"
"""Seconds a refused client is told to wait: overload passes, or another replica answers."""


class Shedder:
    """Admits a request, or refuses it with ``Overloaded`` while the process is past its
    ``max_in_flight`` or its event loop lags more than ``max_event_loop_lag`` seconds
    (``None``: that signal is off)."""

    __slots__ = (
        "_due",
        "_handle",
        "_lag",
        "_loop",
        "in_flight",
        "max_event_loop_lag",
        "max_in_flight",
        "shed",
    )

    def __init__(self, max_in_flight: int | None, max_event_loop_lag: float | None) -> None:
        self.max_in_flight = max_in_flight
        self.max_event_loop_lag = max_event_loop_lag
        self.in_flight = 0
        """Requests admitted and not finished."""
        self.shed = dict.fromkeys(REASONS, 0)
        """Requests refused since start, by reason."""
        self._lag = 0.0
        self._due = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Start reading the lag of the running loop (at application start-up)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._schedule()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._loop = None

    def _schedule(self) -> None:
        assert self._loop is not None
        self._due = time.monotonic() + TICK
        self._handle = self._loop.call_later(TICK, self._tick)

    def _tick(self) -> None:
        self._lag = max(0.0, time.monotonic() - self._due)
        self._schedule()

    @property
    def lag(self) -> float:
        """Seconds the event loop is behind now (0 before ``start``)."""
        if self._loop is None:
            return 0.0
        return max(self._lag, time.monotonic() - self._due)

    @property
    def tasks(self) -> int:
        """Tasks alive on the loop (0 before ``start``)."""
        return len(asyncio.all_tasks(self._loop)) if self._loop is not None else 0

    def admit(self) -> None:
        """Take an in-flight slot, or raise ``Overloaded``; ``release`` gives it back."""
        if self.max_in_flight is not None and self.in_flight >= self.max_in_flight:
            self._refuse("in_flight", f"{self.max_in_flight} requests in progress")
        limit = self.max_event_loop_lag
        if limit is not None and (lag := self.lag) > limit:
            self._refuse("event_loop_lag", f"its event loop {lag:.2f} s behind")
        self.in_flight += 1

    def release(self) -> None:
        self.in_flight -= 1

    def _refuse(self, reason: str, what: str) -> None:
        self.shed[reason] += 1
        raise Overloaded(
            f"The gateway is overloaded ({what}); retry after {RETRY_AFTER} s.",
            headers={"retry-after": RETRY_AFTER},
        )
