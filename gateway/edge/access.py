"""The request middleware: per request, its metrics and one JSON access-log line.

``AccessLog`` wraps the whole application (``create_app``; a tracing middleware may wrap
it in turn). Before the app runs it gives the request its record
(``gateway.context.record.RequestRecord``: its id, which the routes send back as
``x-contextgate-request-id``, and what the admission, the route and the exchange learn
about it on the way); it watches the response go out (its status, and the start of an
error body); and when the app returns, which is after the last byte of a streamed body,
it records the request's metrics (``gateway.telemetry.metrics``) and writes one line to the
``contextgate.access`` logger (fields in ``docs/OBSERVABILITY.md``).

The store counts its own failures in the request's ``REQUEST_FAILURES``. The middleware
keeps nothing per request on itself.
"""

from __future__ import annotations

import logging
from time import perf_counter
from typing import Any, Final, NamedTuple

import orjson
from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send
from opentelemetry import trace
from opentelemetry.trace import SpanContext

from gateway.context.ledger import LedgerWriter
from gateway.context.record import RECORD, RequestRecord, new_request_id
from gateway.http.headers import summary_header, summary_path
from gateway.store.shared import REQUEST_FAILURES
from gateway.telemetry.metrics import TOKEN_KINDS, Metrics, ModelLabels, usage_counts
from pipelines import ModelCatalog

__all__ = ["ACCESS_LOG", "AccessLog", "Exchange"]

log = logging.getLogger("contextgate.access")

PROBES: Final = frozenset({"/healthz", "/readyz", "/metrics"})
"""Routes an orchestrator or a scraper calls every few seconds: logged at DEBUG, and never
counted as store fail-opens (``/readyz`` pings the store)."""
ACCESS_LOG: Final = "contextgate.access_log"
"""The key under which a WebSocket connection's scope state holds the ``AccessLog``."""
UNMATCHED: Final = "unmatched"
"""The route of a request no route matched (404, 405)."""
_ERROR_BODY: Final = 4_096
"""Bytes of an error body read for its ``type`` and ``code``."""
_FIELD_CHARS: Final = 200


class AccessLog:
    """ASGI middleware recording each HTTP request's metrics and access-log line."""

    __slots__ = ("_ledger", "_log_prompts", "_metrics", "_models", "_tenanted", "app")

    def __init__(
        self,
        app: ASGIApp,
        metrics: Metrics,
        catalog: ModelCatalog,
        *,
        tenanted: bool,
        log_prompts: bool,
        ledger: LedgerWriter | None = None,
    ) -> None:
        self.app = app
        self._metrics = metrics
        self._models = ModelLabels(catalog)
        self._tenanted = tenanted
        self._log_prompts = log_prompts
        self._ledger = ledger

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            if scope["type"] == ScopeType.WEBSOCKET:
                # A WebSocket route logs each exchange on its connection itself.
                scope.setdefault("state", {})[ACCESS_LOG] = self
            await self.app(scope, receive, send)
            return
        started = perf_counter()
        record = RequestRecord(new_request_id())
        scope.setdefault("state", {})[RECORD] = record
        response = _Response(send, trace.get_current_span().get_span_context())
        failures = [0]
        token = REQUEST_FAILURES.set(failures)
        self._metrics.in_flight += 1
        escaped: BaseException | None = None
        try:
            await self.app(scope, receive, response.send)
        except BaseException as exc:
            escaped = exc
            raise
        finally:
            REQUEST_FAILURES.reset(token)
            self._metrics.in_flight -= 1
            try:
                self._done(scope, record, response, perf_counter() - started, failures[0], escaped)
            except Exception:  # the answer has gone out: a bug here must not touch it
                log.exception("recording the request failed")

    def _done(
        self,
        scope: Scope,
        record: RequestRecord,
        response: _Response,
        seconds: float,
        store_failures: int,
        escaped: BaseException | None,
    ) -> None:
        exchange = Exchange(
            str(scope.get("method")),
            scope["path"],
            scope.get("path_template") or UNMATCHED,
            response.status or 500,  # uvicorn answers 500 when the app sent nothing
            response.span,
            response.error_body,
        )
        self.record(record, exchange, seconds, store_failures, escaped)

    def record(
        self,
        record: RequestRecord,
        exchange: Exchange,
        seconds: float,
        store_failures: int = 0,
        escaped: BaseException | None = None,
    ) -> None:
        """Count one exchange's metrics and write its line: an HTTP request's, or one
        response on a WebSocket connection."""
        status, route = exchange.status, exchange.route
        caller = record.caller
        if not self._tenanted:
            tenant = "passthrough"
        elif caller is None:  # refused before the caller was known
            tenant = ""
        else:
            tenant = caller.tenant or ""
        label = self._models(record.model, answered=record.answered)
        report, usage = record.report, record.usage
        error = _error_of(exchange.error_body) if exchange.error_body is not None else None
        probe = route in PROBES

        metrics = self._metrics
        metrics.request(route, tenant, label, status, seconds)
        if report is not None:
            metrics.pipeline(report, summary_path(report))
            metrics.tokens(tenant, label, report, usage)
        if store_failures and not probe and (error is None or error[1] != "store_unavailable"):
            metrics.store_fail_open.inc()
        if self._ledger is not None:
            self._ledger.write(record, exchange.method, route, status)

        level = logging.DEBUG if probe else logging.INFO
        if not log.isEnabledFor(level):
            return
        line = self._line(exchange, record, seconds, tenant, store_failures, error, escaped)
        log.log(level, "%s %s %d", line["method"], line["path"], status, extra={"fields": line})

    def _line(
        self,
        exchange: Exchange,
        record: RequestRecord,
        seconds: float,
        tenant: str,
        store_failures: int,
        error: tuple[str | None, str | None] | None,
        escaped: BaseException | None,
    ) -> dict[str, Any]:
        """The access log line's fields."""
        line: dict[str, Any] = {"request_id": record.request_id}
        span = exchange.span
        if span.is_valid:
            line["trace_id"] = f"{span.trace_id:032x}"
            line["span_id"] = f"{span.span_id:016x}"
        line["method"] = exchange.method
        line["path"] = exchange.path[:_FIELD_CHARS]
        line["route"] = exchange.route
        line["status"] = exchange.status
        line["duration_ms"] = round(seconds * 1000, 3)
        line["tenant"] = tenant or None
        if record.model is not None:
            line["model"] = record.model[:_FIELD_CHARS]
        if record.stream is not None:
            line["stream"] = record.stream
        report, usage = record.report, record.usage
        if report is not None:
            line["tokens_before"] = report.tokens_before
            line["tokens_after"] = report.tokens_after
            line["attempts"] = record.attempts
            summary = summary_header(report)
            if summary:
                line["summary"] = summary
        if usage:
            line["upstream_tokens"] = dict(zip(TOKEN_KINDS, usage_counts(usage), strict=True))
        if record.cache_break is not None:
            line["cache_break"] = record.cache_break
        if store_failures:
            line["store_failures"] = store_failures
        if error is not None:
            line["error_type"], line["error_code"] = error
        if escaped is not None:
            line["error_type"] = type(escaped).__name__
        if record.drained:
            line["drained"] = True  # ended by the shutdown deadline (gateway.edge.drain)
        if self._log_prompts and record.stream is not None:
            line["messages"] = record.messages
        return line


class Exchange(NamedTuple):
    """What the access log reads of one exchange besides its record."""

    method: str
    """The HTTP method, or ``WS`` for a response on a WebSocket connection."""
    path: str
    route: str
    status: int
    span: SpanContext
    error_body: bytes | bytearray | None = None
    """The start of the error body the client got, when the status is an error."""


class _Response:
    """What the middleware sees of one response on its way out."""

    __slots__ = ("_send", "error_body", "span", "status")

    def __init__(self, send: Send, span: SpanContext) -> None:
        self._send = send
        self.span = span
        self.status = 0
        self.error_body: bytearray | None = None

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            if self.status >= 400:
                self.error_body = bytearray()
            if not self.span.is_valid:
                # A server span opened inside this middleware is current by now.
                self.span = trace.get_current_span().get_span_context()
        elif (
            message["type"] == "http.response.body"
            and self.error_body is not None
            and len(self.error_body) < _ERROR_BODY
        ):
            self.error_body += message.get("body", b"")[:_ERROR_BODY]
        await self._send(message)


def _error_of(body: bytes | bytearray) -> tuple[str | None, str | None] | None:
    """The ``type`` and ``code`` of an error body in the OpenAI or the Anthropic envelope
    (``{"error": {"type", "code"}}``, ``{"type": "error", "error": {"type"}}``)."""
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    error = answer.get("error") if isinstance(answer, dict) else None
    if not isinstance(error, dict):
        return None
    return _short(error.get("type")), _short(error.get("code"))


def _short(value: object) -> str | None:
    return value if isinstance(value, str) and len(value) <= 64 else None
