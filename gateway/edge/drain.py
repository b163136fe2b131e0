"""Graceful shutdown: on SIGTERM, stop taking requests, let those in flight finish within
``shutdown_grace``, then end what is left with an error the client can read.

The sequence, driven by ``gateway.edge.server.DrainingServer`` (uvicorn's server with the
drain started first):

1. the listening sockets close, idle keep-alive connections close, and connections with a
   request in flight will close after its response; ``/readyz`` answers 503 ``draining``;
2. requests and streams in flight go on for up to ``shutdown_grace`` seconds;
3. at the deadline, each one still running is cancelled (its upstream response closed) and
   ended by ``Drain``: a request not yet answered gets a 503 ``gateway_shutting_down`` in its
   route's envelope (the SDKs retry a 503, on another replica behind the Service); a stream
   gets one terminal error event after its last whole event (OpenAI's ``data: {"error"}`` or
   Anthropic's ``event: error``); any other response already begun is cut;
4. uvicorn's own limit, a few seconds later, is only a backstop; then the application's
   shutdown hooks flush the spans and close the pools, and the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import anyio
from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from gateway.context.record import record_of
from gateway.errors import ShuttingDown
from gateway.http.responses import (
    ANTHROPIC_ROUTES,
    anthropic_error_event,
    last_sequence_number,
    openai_error_event,
    responses_error_event,
    send_error,
)

__all__ = ["Drain", "Draining"]

log = logging.getLogger("contextgate.drain")


class Draining:
    """The process's shutdown state: the server starts it, every request runs under it."""

    __slots__ = ("_begun", "_quiet", "_scopes", "_sockets", "_timer", "expired", "started")

    def __init__(self) -> None:
        self._scopes: set[anyio.CancelScope] = set()
        self._sockets = 0
        self._begun = asyncio.Event()
        self._quiet = asyncio.Event()
        self._quiet.set()
        self._timer: asyncio.TimerHandle | None = None
        self.started = False
        """SIGTERM came: the gateway takes no new connections and is not ready."""
        self.expired = False
        """The grace period is over: what still runs is being ended."""

    @property
    def in_flight(self) -> int:
        return len(self._scopes)

    def begin(self, grace: float) -> None:
        """Start draining; what still runs after ``grace`` seconds is ended."""
        if self.started:
            return
        self.started = True
        self._begun.set()
        log.info(
            "draining: %d request(s) in flight, %.1f s to finish",
            self.in_flight,
            grace,
            extra={"fields": {"in_flight": self.in_flight, "grace_seconds": grace}},
        )
        self._timer = asyncio.get_running_loop().call_later(grace, self._expire)

    def _expire(self) -> None:
        self.expired = True
        if self._scopes:
            log.warning(
                "shutdown grace over: ending %d request(s) still in flight",
                self.in_flight,
                extra={"fields": {"in_flight": self.in_flight}},
            )
        for scope in self._scopes:
            scope.cancel()

    async def begun(self) -> None:
        """Return once the drain has begun."""
        await self._begun.wait()

    @contextmanager
    def socket(self) -> Iterator[anyio.CancelScope]:
        """A scope for one WebSocket connection, as ``request``; the server's shutdown
        waits for the connections to close (``sockets_closed``) before its own, which
        would close them at once."""
        self._sockets += 1
        self._quiet.clear()
        try:
            with self.request() as scope:
                yield scope
        finally:
            self._sockets -= 1
            if not self._sockets:
                self._quiet.set()

    async def sockets_closed(self, within: float) -> None:
        """Return once no WebSocket connection is open, or after ``within`` seconds."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._quiet.wait(), within)

    @contextmanager
    def request(self) -> Iterator[anyio.CancelScope]:
        """A scope for one request, cancelled when the grace period ends."""
        with anyio.CancelScope() as scope:
            if self.expired:
                scope.cancel()
            self._scopes.add(scope)
            try:
                yield scope
            finally:
                self._scopes.discard(scope)


class Drain:
    """ASGI middleware running each HTTP request under the drain, and ending the ones
    the grace period cut short with an error in their route's format."""

    __slots__ = ("app", "draining")

    def __init__(self, app: ASGIApp, draining: Draining) -> None:
        self.app = app
        self.draining = draining

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await self.app(scope, receive, send)
            return
        response = _Progress(send, numbered=scope["path"] == "/v1/responses")
        with self.draining.request() as cancel:
            await self.app(scope, receive, response.send)
        if not cancel.cancelled_caught or response.finished:
            return
        record = record_of(scope.get("state", {}))
        if record is not None:
            record.drained = True
        error = ShuttingDown(
            "The gateway is shutting down and could not finish this request in time;"
            " send it again.",
            headers={"retry-after": "1"},
        )
        if not response.started:
            await send_error(scope, send, error, record.request_id if record else None)
        elif response.event_stream:
            event = _error_event(scope["path"], error, response.last_number + 1)
            await send({"type": "http.response.body", "body": event, "more_body": False})
        # Any other response already begun is cut: the server closes its connection.


def _is_event_stream(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    for name, value in headers:  # a loop: any() over a generator costs twice as much
        if name.lower() == b"content-type" and value.startswith(b"text/event-stream"):
            return True
    return False


def _error_event(path: str, error: ShuttingDown, number: int) -> bytes:
    """The terminal error event of a stream on the route at ``path`` (``number``: a
    Responses stream's next sequence number)."""
    if path.startswith(ANTHROPIC_ROUTES):
        return anthropic_error_event(error)
    if path == "/v1/responses":
        return responses_error_event(error, number)
    return openai_error_event(error)


class _Progress:
    """How far a response has gone out."""

    __slots__ = ("_numbered", "_send", "event_stream", "finished", "last_number", "started")

    def __init__(self, send: Send, *, numbered: bool = False) -> None:
        self._send = send
        self._numbered = numbered
        self.started = self.finished = self.event_stream = False
        self.last_number = -1
        """A Responses stream's last ``sequence_number`` sent (when ``numbered``)."""

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            self.event_stream = _is_event_stream(message.get("headers", ()))
        elif message["type"] == "http.response.body":
            if not message.get("more_body", False):
                self.finished = True
            if self._numbered:
                number = last_sequence_number(message.get("body", b""))
                if number is not None:
                    self.last_number = number
        await self._send(message)
