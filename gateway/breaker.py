"""A circuit breaker: after a run of failures, stop asking a service that is down for a
while, then let one call find out whether it is back. The store guards Redis with one
(``gateway.store.redis``) and the summarizer the summary model (``gateway.runtime``)."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["CircuitBreaker"]


class CircuitBreaker:
    """Closed, then open for ``cooldown`` seconds after ``failures`` failures in a row, then
    half-open: one call is let through, and its outcome closes or reopens the circuit."""

    __slots__ = ("_clock", "_failures", "_opened_at", "_trial", "cooldown", "failures")

    def __init__(
        self, failures: int, cooldown: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.failures, self.cooldown, self._clock = failures, cooldown, clock
        self._failures = 0
        self._opened_at: float | None = None
        self._trial = False

    @property
    def state(self) -> str:
        if self._opened_at is None:
            return "closed"
        return "half-open" if self._clock() - self._opened_at >= self.cooldown else "open"

    def allow(self) -> bool:
        state = self.state
        if state == "closed":
            return True
        if state == "half-open" and not self._trial:
            self._trial = True
            return True
        return False

    def success(self) -> None:
        self._failures, self._opened_at, self._trial = 0, None, False

    def release(self) -> None:
        """End a call that says nothing about the service (cancelled by its caller, or
        refused for the caller's own fault): a half-open trial may be made again."""
        self._trial = False

    def failure(self, *, slow: bool = False) -> None:
        """Count a failure; a ``slow`` one (a timeout) opens the circuit at once, so that a
        Redis that stopped answering costs one timeout per cooldown, not one per call."""
        self._failures += 1
        self._trial = False
        if slow or self._opened_at is not None or self._failures >= self.failures:
            self._opened_at = self._clock()
