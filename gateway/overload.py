"""Overload shedding: the process refuses new work it cannot do in time, with a 503
``gateway_overloaded`` and ``Retry-After``, instead of queueing it until every request is
late.

Checked by ``gateway.admission`` before anything else is done for a request (public routes
are never checked, so probes and scrapes keep answering):

- ``max_in_flight``: requests past admission and not yet finished (a stream until its last
  event). A hard cap on what the process holds in memory at once.
- ``max_queue_delay``, against two measures of how long work waits before the process gets
  to it:

  - the event loop's lag: how late the loop runs a timer it sets every ``TICK`` seconds,
    counted only when ``SUSTAINED`` ticks in a row were late. One late tick is one long
    stretch of work (a large body parsed, a long history counted): the process is free
    again when the next request arrives, and refusing that request (a serial client's
    next one, say) would be a false alarm. A saturated loop is late tick after tick.
  - the accept queue's delay: connections the kernel has completed and the process has
    not accepted yet (``TCP_INFO`` of the listening sockets, which ``DrainingServer``
    hands over), divided by the rate at which requests reach admission. Measured on this
    gateway under uvloop: a CPU-saturated process keeps its loop lag near 0.1 s and takes
    in only what it can serve, while the queue, and the latency, grow in the kernel's
    backlog, which the loop's lag never shows. Counted only when connections waited at
    ``SUSTAINED`` ticks in a row: a client pool opening its connections at once fills the
    queue for an instant (16 connections on an idle process read as 0.3 s of delay), and
    refusing their first requests would be a false alarm.

The shedder counts refusals by reason (``in_flight``, ``event_loop_lag``, ``accept_queue``)
for the metrics and keeps no per-request state beyond the in-flight count.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Iterable
from typing import Final, Protocol

from gateway.errors import Overloaded

__all__ = ["REASONS", "SUSTAINED", "TICK", "Shedder"]

TICK: Final = 0.05
"""Seconds between two readings of the event loop's lag."""
SUSTAINED: Final = 3
"""Late ticks in a row that make the loop's lag a reason to refuse."""
REASONS: Final = ("in_flight", "event_loop_lag", "accept_queue")
_MIN_RATE: Final = 50.0
"""Requests a second assumed at least when estimating the accept queue's delay, so that a
burst of connections on an idle process is not taken for a queue."""
_RATE_WEIGHT: Final = 0.2
"""Weight of the last tick in the moving average of the admission rate (about 0.25 s)."""
RETRY_AFTER: Final = "1"
"""Seconds a refused client is told to wait: overload passes, or another replica answers."""


class Listener(Protocol):
    """A listening socket (``socket.socket``, asyncio's or uvloop's wrapper)."""

    def getsockopt(self, level: int, option: int, size: int) -> bytes: ...


class Shedder:
    """Admits a request, or refuses it with ``Overloaded`` while the process is past its
    ``max_in_flight`` or work waits more than ``max_queue_delay`` seconds (``None``: that
    signal is off)."""

    __slots__ = (
        "_due",
        "_handle",
        "_lag",
        "_late_ticks",
        "_listeners",
        "_loop",
        "_queued_ticks",
        "_rate",
        "_taken",
        "_ticked",
        "in_flight",
        "max_in_flight",
        "max_queue_delay",
        "shed",
    )

    def __init__(self, max_in_flight: int | None, max_queue_delay: float | None) -> None:
        self.max_in_flight = max_in_flight
        self.max_queue_delay = max_queue_delay
        self._listeners: list[Listener] = []
        self._rate = 0.0
        """Requests reaching admission per second, a moving average."""
        self._taken = 0
        self._ticked = 0.0
        self.in_flight = 0
        """Requests admitted and not finished."""
        self.shed = dict.fromkeys(REASONS, 0)
        """Requests refused since start, by reason."""
        self._lag = 0.0
        self._late_ticks = 0
        """Ticks in a row that came more than ``max_queue_delay`` late."""
        self._queued_ticks = 0
        """Ticks in a row at which connections waited in the accept queue."""
        self._due = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Start reading the lag of the running loop (at application start-up)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._schedule()

    def listen_on(self, sockets: Iterable[Listener]) -> None:
        """Watch the accept queue of these listening sockets (TCP on Linux; others are
        skipped)."""
        for sock in sockets:
            try:
                sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 32)
            except (OSError, AttributeError):
                continue
            self._listeners.append(sock)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._loop = None

    def _schedule(self) -> None:
        assert self._loop is not None
        self._ticked = time.monotonic()
        self._due = self._ticked + TICK
        self._handle = self._loop.call_later(TICK, self._tick)

    def _tick(self) -> None:
        now = time.monotonic()
        self._lag = max(0.0, now - self._due)
        limit = self.max_queue_delay
        late = limit is not None and self._lag > limit
        self._late_ticks = self._late_ticks + 1 if late else 0
        queued = limit is not None and self._listeners and self.accept_queue > 0
        self._queued_ticks = self._queued_ticks + 1 if queued else 0
        rate = self._taken / max(now - self._ticked, 1e-3)
        self._rate += _RATE_WEIGHT * (rate - self._rate)
        self._taken = 0
        self._schedule()

    @property
    def accept_queue(self) -> int:
        """Connections waiting to be accepted, on every listening socket together."""
        waiting = 0
        for sock in self._listeners:
            try:
                info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 32)
            except (OSError, ValueError):  # closed (uvloop's wrapper: ValueError)
                continue
            # struct tcp_info: 8 bytes of u8 fields, then u32 rto, ato, snd_mss, rcv_mss,
            # unacked; on a listening socket ``unacked`` is the accept queue's length.
            waiting += struct.unpack_from("I", info, 24)[0]
        return waiting

    @property
    def queue_delay(self) -> float:
        """Seconds a new connection waits to be accepted, estimated."""
        if not self._listeners:
            return 0.0
        return self.accept_queue / max(self._rate, _MIN_RATE)

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

    def admit(self) -> Overloaded | None:
        """Take an in-flight slot (``None``; ``release`` gives it back), or the refusal to
        send. Returned, not raised: the caller answers it directly, as cheaply as it can."""
        self._taken += 1
        reason = None
        if self.max_in_flight is not None and self.in_flight >= self.max_in_flight:
            reason = "in_flight"
        elif (limit := self.max_queue_delay) is not None:
            if self._late_ticks >= SUSTAINED:
                reason = "event_loop_lag"
            elif self._queued_ticks >= SUSTAINED and self.queue_delay > limit:
                reason = "accept_queue"
        if reason is None:
            self.in_flight += 1
            return None
        self.shed[reason] += 1
        return _REFUSALS[reason]

    def release(self) -> None:
        self.in_flight -= 1


_REFUSALS: Final = {
    reason: Overloaded(
        f"The gateway is overloaded ({what}); retry after {RETRY_AFTER} s.",
        headers={"retry-after": RETRY_AFTER},
    )
    for reason, what in (
        ("in_flight", "too many requests in progress"),
        ("event_loop_lag", "its event loop is behind"),
        ("accept_queue", "new connections wait to be accepted"),
    )
}
"""One refusal per reason, made once: they carry nothing of the request."""
