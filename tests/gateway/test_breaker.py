"""The circuit breaker: closed, open after failures in a row, then one trial at a time."""

from __future__ import annotations

from gateway.breaker import CircuitBreaker


def test_the_breaker_opens_half_opens_and_closes() -> None:
    now = [0.0]
    breaker = CircuitBreaker(2, 1.0, clock=lambda: now[0])
    breaker.failure()
    assert breaker.allow()
    breaker.failure()
    assert breaker.state == "open"
    assert not breaker.allow()
    now[0] = 1.0
    assert breaker.allow()  # the one trial
    assert not breaker.allow()
    breaker.failure()
    assert breaker.state == "open"
    now[0] = 2.0
    assert breaker.allow()
    breaker.success()
    assert breaker.state == "closed"
