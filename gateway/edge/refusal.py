"""Refusing overload in the callback that read the request, not a turn of the loop later.

A refusal sent by the application (``gateway.edge.admission``) waits for its task: uvicorn
starts one per request as the headers are read, and its first step runs after every
callback already queued, which under overload is the admitted requests' work: a turn of a
saturated loop lasts 5-30 ms, longer when the host takes the core away in it
(docs/RELIABILITY.md, "Twice the capacity").

``refusing_protocol`` gives uvicorn's httptools protocol a check of the shedder where it
would start the request's task: a request to a work route (under ``/v1/``) that the
shedder refuses is answered there and then, with the same 503 ``gateway_overloaded``,
``Retry-After`` and envelope the application sends, made once at start-up, and a request
id of its own. No task is made and the body is discarded as it arrives; the connection
stays open for the client's next request. The shedder counts the refusal by reason
(``contextgate_overload_shed_total``); it writes no access line and is not in the request
metrics, which describe the requests the application saw. Everything else (the health
checks, ``/metrics``, ``HEAD``, anything outside ``/v1/``) goes to the application, where
``Admission`` asks the shedder again and takes the in-flight slot: only the application
knows when a request (a stream at its last event) is over. A work request let through is
counted (``Shedder.pending``) until its task starts: the requests read in the same turn of
the loop (those that arrived while it was busy) are screened with it counted, not all let
through because none has a slot yet, to be refused by the application a turn later. At
twice the capacity that slow way had been taken by a fifth to a quarter of the 503s.

A new connection's first request would wait a turn more: the connection is accepted in
one poll of the loop, its protocol connected in the next turn (after every callback
already queued), and only then is the request read. ``first_request_refusal`` gives
``gateway.edge.accept`` a look at what a new connection has already sent, as it is
accepted: a whole work request (head and body in the socket) that the shedder refuses is
read and answered there, with the same bytes, and the connection is then set up as any
other (or closed, if the request asked for it). Anything else is left in the socket for
the protocol. At twice the capacity the first requests of new connections were 1-3% of
the 503s, each waiting two turns of a saturated loop: they made the 503s' p99.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterable
from typing import Any, Final

from gateway.codecs.anthropic_envelopes import error_body
from gateway.context.record import new_request_id
from gateway.edge.overload import REASONS, REFUSALS, Shedder
from gateway.errors import envelope_of
from gateway.http.responses import ANTHROPIC_ROUTES

__all__ = ["WORK_ROUTES", "first_request_refusal", "refusing_protocol"]

WORK_ROUTES: Final = "/v1/"
"""Paths the protocol may refuse: the API's, none of them public."""
REFUSED_BODY_WITHIN: Final = 30.0
"""Seconds a refused request's body may take to arrive before its connection is closed."""


def _head_and_body(reason: str, anthropic: bool, keep_alive: bool) -> tuple[bytes, bytes]:
    """The refusal's status line and headers up to the request id's value, and the rest."""
    error = REFUSALS[reason]
    body = error_body(error.status, error.message) if anthropic else envelope_of(error)
    headers = b"".join(
        name.encode() + b": " + value.encode() + b"\r\n"
        for name, value in (error.headers or {}).items()
    )
    head = (
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n" + headers
    )
    if not keep_alive:
        head += b"connection: close\r\n"
    return head + b"x-contextgate-request-id: ", b"\r\n\r\n" + body


_CANNED: Final = {
    (reason, anthropic, keep_alive): _head_and_body(reason, anthropic, keep_alive)
    for reason in REASONS
    for anthropic in (False, True)
    for keep_alive in (False, True)
}


def _refusal(
    reason: str, anthropic: bool, keep_alive: bool, dated: Iterable[tuple[bytes, bytes]]
) -> bytes:
    """The whole 503 for ``reason``, with a request id of its own and the server's headers
    of the moment (``dated``: uvicorn's ``date``, set each second)."""
    head, rest = _CANNED[reason, anthropic, keep_alive]
    headers = b"".join(name + b": " + value + b"\r\n" for name, value in dated)
    return head + new_request_id().encode() + b"\r\n" + headers + rest[2:]


def refusing_protocol(shedder: Shedder) -> type[asyncio.Protocol] | None:
    """uvicorn's httptools protocol refusing work requests ``shedder`` refuses as they are
    read; ``None`` without httptools (uvicorn's h11 protocol then runs as it is, and the
    application refuses instead)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return None
    counting: dict[Any, Any] = {}  # each application uvicorn passes, wrapped by ``_pending``

    def _pending(app: Any) -> Any:
        """``app``, which first takes its request out of ``shedder.pending``: made once per
        application (uvicorn passes its own, or its refusal past ``limit_concurrency``)."""
        wrapped = counting.get(app)
        if wrapped is None:

            async def wrapped(scope: Any, receive: Any, send: Any) -> None:
                shedder.pending -= 1
                await app(scope, receive, send)

            counting[app] = wrapped
        return wrapped

    class RefusingProtocol(HttpToolsProtocol):
        _answered = False
        """Its first request was refused and answered as the connection was accepted: the
        connection is idle from the start, under the keep-alive limit."""
        _let_through = False
        """Its first request was screened and counted as the connection was accepted
        (``first_request_refusal``)."""
        _refused: Any = None
        """The refused request whose body is still coming, if any."""
        _refused_timer: asyncio.TimerHandle | None = None

        def _start_asgi_task(self, cycle: Any, app: Any) -> None:
            scope = cycle.scope
            path: str = scope["path"]
            if self._let_through:  # the request seen as the connection was accepted
                self._let_through = False
                super()._start_asgi_task(cycle, _pending(app))
                return
            if not path.startswith(WORK_ROUTES) or scope["method"] == "HEAD":
                super()._start_asgi_task(cycle, app)
                return
            if (reason := shedder.screen()) is None:
                # Counted until its task starts and ``Admission`` takes its slot: the
                # other requests read before then are screened with it in the count.
                shedder.pending += 1
                super()._start_asgi_task(cycle, _pending(app))
                return
            # A client waiting for ``100 Continue`` will not send the body it announced:
            # the connection cannot be read on, so the refusal closes it.
            keep_alive: bool = cycle.keep_alive and not cycle.waiting_for_100_continue
            anthropic = path.startswith(ANTHROPIC_ROUTES)
            dated = self.server_state.default_headers
            self.transport.write(_refusal(reason, anthropic, keep_alive, dated))
            # What uvicorn's cycle does once a response is complete: the body still to
            # come is discarded, and the next request on the connection is read.
            cycle.response_started = cycle.response_complete = True
            cycle.message_event.set()
            if not keep_alive:
                self.transport.close()
                cycle.on_response()
            elif cycle.more_body:
                # Once the body is in (discarded as it comes): had the connection gone
                # idle now, the next packet of the body would end its idle timer for good.
                # A body that stops coming closes the connection after a while.
                self._refused = cycle
                self._refused_timer = self.loop.call_later(
                    REFUSED_BODY_WITHIN, self.transport.close
                )
            else:
                cycle.on_response()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            refused = self._refused
            if refused is not None and refused is self.cycle:
                self._refused = None
                if self._refused_timer is not None:
                    self._refused_timer.cancel()
                refused.on_response()

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if self._answered:  # what uvicorn does once a response is complete
                self._answered = False
                self.on_response_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._let_through:  # gone before its first request was read
                self._let_through = False
                shedder.pending -= 1
            if self._refused_timer is not None:
                self._refused_timer.cancel()
            super().connection_lost(exc)

    return RefusingProtocol


FIRST_READ: Final = 16_384
"""Bytes of a new connection looked at as it is accepted: a small request whole."""


def first_request_refusal(
    shedder: Shedder, server_state: Any, protocol: Callable[[], asyncio.Protocol]
) -> Callable[[socket.socket], Callable[[], asyncio.Protocol] | None]:
    """For ``gateway.edge.accept``: called with each new connection as it is accepted,
    screens its first request there and then if it has all arrived, as the protocol would
    a turn later. Refused, it is answered (``server_state``: uvicorn's, for the ``date``);
    let through, it is counted in ``Shedder.pending`` as its protocol is made, in the same
    callback (as the requests read in one turn are), and the protocol told so. Returns
    what to set the connection up with (``protocol``, the server's factory of
    ``refusing_protocol``'s, or one that makes it knowing its first request was let
    through, or answered), or ``None`` once the connection is closed (the refused request
    asked for it, or it is gone)."""

    def let_through() -> asyncio.Protocol:
        made = protocol()
        made._let_through = True  # type: ignore[attr-defined]
        shedder.pending += 1  # counted once the protocol that gives it back exists
        return made

    def answered() -> asyncio.Protocol:
        made = protocol()
        made._answered = True  # type: ignore[attr-defined]
        return made

    def screen(connection: socket.socket) -> Callable[[], asyncio.Protocol] | None:
        try:
            data = connection.recv(FIRST_READ, socket.MSG_PEEK)
        except OSError:  # nothing sent yet (or already gone): the protocol will see
            return protocol
        request = _whole_work_request(data)
        if request is None:
            return protocol
        if (reason := shedder.screen()) is None:
            return let_through
        length, anthropic, keep_alive = request
        answer = _refusal(reason, anthropic, keep_alive, server_state.default_headers)
        try:
            connection.recv(length)  # the request, answered: what follows is the next
            if connection.send(answer) == len(answer) and keep_alive:
                return answered
        except OSError:
            pass
        connection.close()  # asked for, or gone (a new socket takes a few hundred bytes)
        return None

    return screen


def _whole_work_request(data: bytes) -> tuple[int, bool, bool] | None:
    """The first request in ``data`` if it is one the protocol would screen (a plain
    HTTP/1.1 request to a work route, not ``HEAD``) and all of it is there: its length,
    whether it is for an Anthropic route, whether the connection stays open after it.
    ``None`` for anything else (a body still coming or chunked, ``Expect``, an upgrade,
    an escaped path, a header the parser might refuse): the protocol reads it as usual."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return None
    lines = data[:end].split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or parts[2] != b"HTTP/1.1" or parts[0] == b"HEAD":
        return None
    target = parts[1]
    if not target.startswith(_WORK) or b"%" in target:
        return None
    length = 0
    keep_alive = True
    seen_length = seen_connection = False
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        name = name.lower()
        if not colon or not name.replace(b"-", b"").isalnum():
            return None
        value = value.strip()
        if name == b"content-length":
            if seen_length or not value.isdigit() or len(value) > 12:
                return None
            seen_length, length = True, int(value)
        elif name in _LEFT_TO_THE_PROTOCOL:
            return None
        elif name in (b"connection", b"proxy-connection"):  # llhttp reads both
            if seen_connection:  # llhttp adds their tokens up: left to it
                return None
            seen_connection = True
            tokens = {token.strip() for token in value.lower().split(b",")}
            if b"upgrade" in tokens:
                return None
            keep_alive = b"close" not in tokens
    total = end + 4 + length
    if total > len(data):
        return None
    return total, target.startswith(_ANTHROPIC), keep_alive


_WORK: Final = WORK_ROUTES.encode()
_ANTHROPIC: Final = ANTHROPIC_ROUTES.encode()
_LEFT_TO_THE_PROTOCOL: Final = frozenset((b"transfer-encoding", b"expect", b"upgrade"))
