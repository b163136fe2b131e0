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
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from gateway.codecs.anthropic_envelopes import error_body
from gateway.context.record import new_request_id
from gateway.edge.overload import REASONS, REFUSALS, Shedder
from gateway.errors import envelope_of
from gateway.http.responses import ANTHROPIC_ROUTES

__all__ = ["WORK_ROUTES", "refusing_protocol"]

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

    canned = {
        (reason, anthropic, keep_alive): _head_and_body(reason, anthropic, keep_alive)
        for reason in REASONS
        for anthropic in (False, True)
        for keep_alive in (False, True)
    }

    class RefusingProtocol(HttpToolsProtocol):
        _refused: Any = None
        """The refused request whose body is still coming, if any."""
        _refused_timer: asyncio.TimerHandle | None = None

        def _start_asgi_task(self, cycle: Any, app: Any) -> None:
            scope = cycle.scope
            path: str = scope["path"]
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
            head, rest = canned[reason, path.startswith(ANTHROPIC_ROUTES), keep_alive]
            dated = b"".join(k + b": " + v + b"\r\n" for k, v in self.server_state.default_headers)
            self.transport.write(head + new_request_id().encode() + b"\r\n" + dated + rest[2:])
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

        def connection_lost(self, exc: Exception | None) -> None:
            if self._refused_timer is not None:
                self._refused_timer.cancel()
            super().connection_lost(exc)

    return RefusingProtocol
