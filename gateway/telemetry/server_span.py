"""The server span: one OpenTelemetry span (kind ``SERVER``) per request, for operators
following a request through the gateway.

``ServerSpans`` is a pure ASGI middleware, installed by ``gateway.app.create_app`` only when
tracing is on. It continues the caller's trace (W3C ``traceparent`` and ``tracestate``, read
by the global propagator) and covers the whole response: a streamed body until its last
event. It records the method, path, route, scheme and protocol, the status sent, and the
gateway's request id (``contextgate.request_id``, as in the ``x-contextgate-request-id``
header), never a header's or body's content (they carry API keys and prompts); a status of
500 or more is an error. Probes and scrapes (``/healthz``, ``/readyz``, ``/metrics``) get
no span: they would bury the requests in traces and say nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send
from opentelemetry import propagate, trace
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import SpanKind, StatusCode

__all__ = ["UNTRACED", "ServerSpans"]

UNTRACED: Final = frozenset({"/healthz", "/readyz", "/metrics"})
"""Routes that get no span."""

_REQUEST_ID: Final = b"x-contextgate-request-id"

_tracer = trace.get_tracer(__name__)

RawHeaders = Iterable[tuple[bytes, bytes]]


class _ScopeHeaders(Getter[RawHeaders]):
    """An ASGI scope's headers (names in lower case, as ASGI gives them) for the
    propagator."""

    def get(self, carrier: RawHeaders, key: str) -> list[str] | None:
        name = key.encode("latin-1")
        values = [value.decode("latin-1") for found, value in carrier if found == name]
        return values or None

    def keys(self, carrier: RawHeaders) -> list[str]:
        return [name.decode("latin-1") for name, _ in carrier]


_HEADERS: Final = _ScopeHeaders()


class ServerSpans:
    """A server span around every HTTP request to ``app``, except ``untraced`` routes."""

    __slots__ = ("app", "untraced")

    def __init__(self, app: ASGIApp, untraced: frozenset[str] = UNTRACED) -> None:
        self.app = app
        self.untraced = untraced

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = scope.get("path_template") or ""
        if scope["type"] != ScopeType.HTTP or route in self.untraced:
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        headers: RawHeaders = scope["headers"]
        parent = propagate.extract(headers, getter=_HEADERS)
        with _tracer.start_as_current_span(
            f"{method} {route}" if route else method,
            context=parent,
            kind=SpanKind.SERVER,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            if not span.is_recording():
                await self.app(scope, receive, send)
                return
            span.set_attributes(
                {
                    "http.request.method": method,
                    "url.path": scope["path"],
                    "url.scheme": scope["scheme"],
                    "network.protocol.version": scope["http_version"],
                    **({"http.route": route} if route else {}),
                }
            )

            async def send_traced(message: Message) -> None:
                if message["type"] == "http.response.start":
                    status = message["status"]
                    span.set_attribute("http.response.status_code", status)
                    if status >= 500:
                        span.set_status(StatusCode.ERROR)
                        span.set_attribute("error.type", str(status))
                    for name, value in message.get("headers", ()):
                        if name.lower() == _REQUEST_ID:
                            span.set_attribute("contextgate.request_id", value.decode("latin-1"))
                await send(message)

            try:
                await self.app(scope, receive, send_traced)
            except Exception as exc:
                span.set_status(StatusCode.ERROR)
                span.set_attribute("error.type", type(exc).__qualname__)
                raise
