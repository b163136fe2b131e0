"""Overload shedding: the process refuses new work it cannot do in time, with a 503
``gateway_overloaded`` and ``Retry-After``, instead of queueing it until every request is
late.

Checked by ``gateway.edge.admission`` before anything else is done for a request (public routes
are never checked, so probes and scrapes keep answering):

- ``max_in_flight``: requests past admission and not yet finished (a stream until its last
  event). A hard cap on what the process holds in memory at once.
- ``max_queue_delay``: an adaptive limit on the requests in flight, set by how long work
  waits for the event loop.

  - **The probe.** Every ``TICK`` seconds a callback is sent through ``HOPS`` turns of the
    loop (``call_soon``, ``HOPS`` times over) and the trip is timed. A small request takes
    about that many turns (measured: 20 turns took 11-14 ms while 16 connections kept the
    process busy with small requests, whose round trip was 11-12 ms), so the trip reads as
    what a request waits for the loop. One long turn (a 100K-token history is 5-25 ms of
    work in one step) hardly moves it; a saturated loop, every turn of which is long, moves
    it at once.
  - **The limit**, cut and raised much as TCP's window is, and only for work that is
    more than the loop can do in time: a flood still coming, or demand already past the
    limit. A closed loop's clients never hold more than they are, and a burst sent at
    once has arrived by the time the loop is late and only shrinks: both are taken whole
    however late the loop (500 small requests at once, or 300 of 20K tokens: 0.4-0.8 s of
    work; 64 connections each sending its next request when its answer comes), bounded
    by ``max_in_flight``. So the most requests held in the first ``max_queue_delay`` of a
    late episode (consecutive late trips) is kept, and the limit falls to what is in
    flight times ``max_queue_delay`` over the trip's time so far when a trip has lasted
    more than ``EARLY`` (1.5) times ``max_queue_delay`` and more than that most (and a
    margin) are held, or more than ``GRACE`` (3) times with requests already refused in
    it. Once cut, it falls again at each further ``max_queue_delay`` past ``GRACE``
    times. This is checked as requests arrive, so a flood still growing is cut within
    0.15 s of a trip, one held at ``max_in_flight`` within 0.3 s, not when the slow trip
    ends (a flood of 1,000 requests got in between two readings when the probe only said
    yes or no). A trip in time raises the limit by a sixteenth, so it is back at
    ``max_in_flight`` seconds after the overload ends. It never goes below ``FLOOR``: a
    few requests at once are never overload, whatever their size (a serial client, or
    four 100K-token histories, each a long turn by itself). Long streams are not refused
    for being many: they leave the loop idle and the limit at the cap.
  - **Refusals that feed themselves.** Clients that resend a refused request at once
    (ignoring ``Retry-After``, or a closed loop cut by an earlier flood) keep the loop
    busy refusing and the trips late however low the limit goes. When a late trip saw
    more than ``RESENT`` refusals per admission, the limit doubles at a cut instead of
    falling, and rises by a sixteenth at the trip's end, as after a trip in time:
    refusing is making the wait, not easing it.

Refusing fast also needs the connections to reach the process, and the refusal to go out
before the admitted work: ``gateway.edge.accept`` takes in every connection the kernel has
completed, and ``gateway.edge.refusal`` answers a refused request in the callback that read
it (``screen``), a turn of the loop before the application would.

The shedder counts refusals by reason (``in_flight``, ``loop_wait``) for the metrics and
keeps no per-request state beyond two counts: the requests in flight, and those the
refusing protocol let through whose task has not started (``pending``).
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Iterable
from typing import Final, Protocol

from gateway.errors import Overloaded

__all__ = [
    "EARLY",
    "FLOOR",
    "GRACE",
    "HOPS",
    "REASONS",
    "REFUSALS",
    "RETRY_AFTER",
    "TICK",
    "Shedder",
]

TICK: Final = 0.05
"""Seconds between two trips of the probe (and two readings of the loop's lag)."""
HOPS: Final = 20
"""Turns of the event loop one trip of the probe goes through."""
EARLY: Final = 1.5
"""How many times ``max_queue_delay`` a trip may last before the limit is cut if the
requests held have grown past their most in the first ``max_queue_delay`` of the late
episode (by more than twice ``FLOOR`` or an eighth): a flood, still coming while the loop
is late."""
GRACE: Final = 3
"""How many times ``max_queue_delay`` a trip may last before the limit is cut if requests
have been refused in it (demand past the limit), grown or not."""
FLOOR: Final = 8
"""Requests in flight the limit never goes below."""
RESENT: Final = 4
"""Refusals per admission during a late trip past which refusing is taken to be making the
wait, not easing it: the refused come straight back (clients that ignore ``Retry-After``),
and the limit doubles instead of falling."""
REASONS: Final = ("in_flight", "loop_wait")

RETRY_AFTER: Final = "1"
"""Seconds a refused client is told to wait: overload passes, or another replica answers."""


class Listener(Protocol):
    """A listening socket (``socket.socket``, asyncio's or uvloop's wrapper)."""

    def getsockopt(self, level: int, option: int, size: int) -> bytes: ...


class Shedder:
    """Admits a request, or refuses it with ``Overloaded`` while the process is past its
    ``max_in_flight`` or past the limit that work waiting more than ``max_queue_delay``
    seconds for the event loop has set (``None``: that signal is off)."""

    __slots__ = (
        "_admitted",
        "_cap",
        "_cuts",
        "_due",
        "_fresh",
        "_handle",
        "_lag",
        "_limit",
        "_listeners",
        "_loop",
        "_peak",
        "_refused",
        "_trip_started",
        "_tripping",
        "in_flight",
        "max_in_flight",
        "max_queue_delay",
        "pending",
        "shed",
        "wait",
    )

    def __init__(self, max_in_flight: int | None, max_queue_delay: float | None) -> None:
        self.max_in_flight = max_in_flight
        self.max_queue_delay = max_queue_delay
        self._listeners: list[Listener] = []
        self.in_flight = 0
        """Requests admitted and not finished."""
        self.pending = 0
        """Requests ``gateway.edge.refusal`` let through whose task has not started yet
        (``admit`` has not been asked): counted with those in flight, so the requests read
        in one turn of the loop are not all let through because none has been admitted."""
        self._cap = max_in_flight if max_in_flight is not None else _UNCAPPED
        """What the limit rises to."""
        self._limit = self._cap
        """Requests in flight past which new ones are refused."""
        self.shed = dict.fromkeys(REASONS, 0)
        """Requests refused since start, by reason."""
        self.wait = 0.0
        """Seconds the last trip of the probe took through ``HOPS`` turns of the loop."""
        self._lag = 0.0
        self._due = 0.0
        self._tripping = False
        self._trip_started = 0.0
        self._cuts = 0
        """Times the limit was cut during the trip under way."""
        self._admitted = self._refused = 0
        """Requests admitted and refused since the trip under way started."""
        self._peak = 0
        """The most requests held (in flight or let through) in the first
        ``max_queue_delay`` of the last trip that began after one in time: what a late
        episode's growth is measured from."""
        self._fresh = True
        """The trip under way began after one in time (it sets ``_peak``)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Start probing the running loop (at application start-up)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._schedule()

    def listen_on(self, sockets: Iterable[Listener]) -> None:
        """Report the accept queue of these listening sockets (TCP on Linux; others are
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
        self._due = time.monotonic() + TICK
        self._handle = self._loop.call_later(TICK, self._tick)

    def _tick(self) -> None:
        now = time.monotonic()
        self._lag = max(0.0, now - self._due)
        if self.max_queue_delay is not None and not self._tripping and self._loop is not None:
            self._tripping = True
            self._trip_started = now
            self._cuts = self._admitted = self._refused = 0
            # The baseline is kept through consecutive late trips: an overload growing
            # a little each trip adds up, where a burst or a closed loop does not.
            self._fresh = self.wait <= self.max_queue_delay
            if self._fresh:
                self._peak = self.in_flight + self.pending
            self._loop.call_soon(self._hop, HOPS - 1)
        self._schedule()

    def _hop(self, left: int) -> None:
        if left and self._loop is not None:
            self._loop.call_soon(self._hop, left - 1)
            return
        self._tripping = False
        self.wait = time.monotonic() - self._trip_started
        delay = self.max_queue_delay
        assert delay is not None
        if self.wait > delay * GRACE:
            if not self._cuts and (self._refused or self._growing(self.in_flight + self.pending)):
                self._cut(self.wait)
        elif self.wait <= delay:
            self._limit = min(self._cap, self._limit + max(1, self._limit // 16))
        elif self._refused > RESENT * max(1, self._admitted):
            # Late, and the refused came straight back: the refusals make the wait, and
            # the limit is raised as by a trip in time (not doubled: an open loop on a
            # host short of CPU looks the same).
            self._limit = min(self._cap, self._limit + max(1, self._limit // 16))

    def _growing(self, taken: int) -> bool:
        """More requests are held than the most at the late episode's start (``_peak``)
        and a margin: work still coming in while the loop is late."""
        return taken > self._peak + max(2 * FLOOR, self._peak >> 3)

    def _cut(self, elapsed: float) -> None:
        self._cuts += 1
        if self._refused > RESENT * max(1, self._admitted):
            self._limit = min(self._cap, 2 * self._limit)
            return
        assert self.max_queue_delay is not None
        held = min(self._limit, self.in_flight)
        # Never below the floor, never above the cap (a ``max_in_flight`` under the floor).
        self._limit = min(self._cap, max(FLOOR, int(held * self.max_queue_delay / elapsed)))

    @property
    def limit(self) -> int | None:
        """Requests in flight past which new ones are refused now (``None``: no limit)."""
        return None if self.max_in_flight is None and self._limit >= _UNCAPPED else self._limit

    @property
    def probing(self) -> bool:
        """A trip of the probe is on its way through the loop."""
        return self._tripping

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
    def lag(self) -> float:
        """Seconds the event loop is behind now (0 before ``start``)."""
        if self._loop is None:
            return 0.0
        return max(self._lag, time.monotonic() - self._due)

    @property
    def tasks(self) -> int:
        """Tasks alive on the loop (0 before ``start``)."""
        return len(asyncio.all_tasks(self._loop)) if self._loop is not None else 0

    def screen(self) -> str | None:
        """Why a new request is refused now (the refusal counted), or ``None``: it may come
        in. Takes no slot: ``gateway.edge.refusal`` asks as a request's headers arrive (and
        counts one it lets through in ``pending`` until its task starts), and ``admit``
        asks again when the application takes the request."""
        taken = self.in_flight + self.pending
        if self._tripping and (delay := self.max_queue_delay) is not None:
            elapsed = time.monotonic() - self._trip_started
            if elapsed <= delay:
                if self._fresh:
                    self._peak = max(self._peak, taken)
            elif self._cuts:
                if elapsed > delay * (GRACE + self._cuts):
                    self._cut(elapsed)
            elif (elapsed > delay * EARLY and self._growing(taken)) or (
                elapsed > delay * GRACE and self._refused
            ):
                self._cut(elapsed)
        if taken < self._limit:
            return None
        self._refused += 1
        reason = (
            "in_flight"
            if self.max_in_flight is not None and taken >= self.max_in_flight
            else "loop_wait"
        )
        self.shed[reason] += 1
        return reason

    def admit(self) -> Overloaded | None:
        """Take an in-flight slot (``None``; ``release`` gives it back), or the refusal to
        send. Returned, not raised: the caller answers it directly, as cheaply as it can."""
        if (reason := self.screen()) is not None:
            return REFUSALS[reason]
        self.in_flight += 1
        self._admitted += 1
        return None

    def release(self) -> None:
        self.in_flight -= 1


_UNCAPPED: Final = 1_000_000
"""What the limit rises to without ``max_in_flight``: no process holds that many requests,
so at this height it is no limit."""

REFUSALS: Final = {
    reason: Overloaded(
        f"The gateway is overloaded ({what}); retry after {RETRY_AFTER} s.",
        headers={"retry-after": RETRY_AFTER},
    )
    for reason, what in (
        ("in_flight", "too many requests in progress"),
        ("loop_wait", "work waits too long for its event loop"),
    )
}
"""One refusal per reason, made once: they carry nothing of the request."""
