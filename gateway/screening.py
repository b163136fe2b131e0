"""Refusing overload below the application: uvicorn's HTTP protocol, with the shedder's
screen (``gateway.overload``) asked as each request's headers arrive.

A request the application refuses still costs the application's front half: the ASGI
scope, the access-log middleware and its metrics, Litestar's routing and middleware stack,
the admission middleware. Measured on the two-core machine of docs/RELIABILITY.md, that
was about half the cost of serving a small chat completion, so a process at 150% of its
capacity spent a third of its time refusing, and refusals waited behind one another.

Here a request to a work route (under ``/v1/``) that the shedder refuses is answered by a
canned 503 ``gateway_overloaded`` with ``Retry-After``, in its route's envelope, made once
at start-up; uvicorn still parses the request and discards its body as it arrives, and the
connection stays open for the client's next request. The health checks, ``/metrics`` and
everything outside ``/v1/`` always reach the application. The refusals are counted in
``contextgate_overload_shed_total`` by reason; they write no access line and are not in the
request metrics, which describe the requests the application saw.

The in-flight cap stays in ``gateway.admission``: only the application knows when a
request (a stream at its last event) is over.
"""

from __future__ import annotations

import asyncio
from typing import Final

from litestar.types import Receive, Scope, Send

from gateway.codecs.anthropic_inbound import error_body
from gateway.errors import envelope_of
from gateway.overload import REASONS, REFUSALS, Shedder
from gateway.relay import ANTHROPIC_ROUTES

__all__ = ["screening_protocol"]

WORK_ROUTES: Final = b"/v1/"
_ANTHROPIC: Final = ANTHROPIC_ROUTES.encode()


class _Refusal:
    """An ASGI application answering one canned refusal."""

    __slots__ = ("_body", "_start")

    def __init__(self, reason: str, anthropic: bool) -> None:
        error = REFUSALS[reason]
        body = error_body(error.status, error.message) if anthropic else envelope_of(error)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        headers += [(k.encode(), v.encode()) for k, v in (error.headers or {}).items()]
        self._start = {"type": "http.response.start", "status": error.status, "headers": headers}
        self._body = {"type": "http.response.body", "body": body, "more_body": False}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(dict(self._start))  # type: ignore[arg-type]
        await send(dict(self._body))  # type: ignore[arg-type]


def screening_protocol(shedder: Shedder) -> type[asyncio.Protocol] | None:
    """uvicorn's httptools protocol screening each work request with ``shedder``; ``None``
    without httptools (uvicorn's h11 protocol then runs unscreened, and the admission
    middleware screens instead)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return None
    refusals = {
        (reason, anthropic): _Refusal(reason, anthropic)
        for reason in REASONS
        for anthropic in (False, True)
    }

    class ScreeningProtocol(HttpToolsProtocol):
        def on_headers_complete(self) -> None:
            url: bytes = self.url
            if not url.startswith(WORK_ROUTES) or (reason := shedder.screen()) is None:
                super().on_headers_complete()
                return
            # uvicorn starts the request's task with ``self.app``: the refusal, this once.
            app = self.app
            self.app = refusals[reason, url.startswith(_ANTHROPIC)]
            try:
                super().on_headers_complete()
            finally:
                self.app = app

    shedder.screened = True
    return ScreeningProtocol
