"""The application factory: routes, error envelopes, and the gateway's lifetime."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import httpx
from litestar import Litestar, Request, Response
from litestar.config.app import AppConfig
from litestar.exceptions import HTTPException
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import RedocRenderPlugin
from litestar.plugins import PluginProtocol
from litestar.plugins.core import MsgspecDIPlugin

from gateway.codecs.anthropic_envelopes import error_body
from gateway.config import Settings, load_settings
from gateway.context.record import record_of
from gateway.edge.access import AccessLog
from gateway.edge.admission import Admission
from gateway.edge.drain import Drain
from gateway.errors import GatewayError
from gateway.http.responses import ANTHROPIC_ROUTES, error_response
from gateway.routes.chat import chat_completions
from gateway.routes.context import compact_dry_run
from gateway.routes.conversations import conversation, conversation_request, conversations
from gateway.routes.health import healthz, readyz
from gateway.routes.inspector import (
    error_page,
    inspector_routes,
    inspector_templates,
    is_inspector,
)
from gateway.routes.messages import count_tokens, messages
from gateway.routes.metrics import metrics
from gateway.routes.models import list_models
from gateway.routes.objects import get_object
from gateway.routes.openapi import DocumentJson
from gateway.routes.passthrough import relayed, stored_completions
from gateway.routes.responses import responses
from gateway.routes.responses_socket import responses_socket
from gateway.runtime import Gateway
from gateway.telemetry.server_span import ServerSpans
from gateway.telemetry.tracing import configure_tracing, flush_spans, tracing_on

if TYPE_CHECKING:
    import httpx2

__all__ = ["create_app"]

log = logging.getLogger("contextgate")


_HTTP_CODES = {
    400: "invalid_request",
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
}


def _error_headers(request: Request[Any, Any, Any], exc: GatewayError) -> dict[str, str]:
    headers = dict(exc.headers or {})
    record = record_of(request.scope.get("state", {}))
    if record is not None:
        headers["x-contextgate-request-id"] = record.request_id
    return headers


def _on_gateway_error(request: Request[Any, Any, Any], exc: GatewayError) -> Response[bytes]:
    if request.url.path.startswith(ANTHROPIC_ROUTES):
        return Response(
            content=error_body(exc.status, exc.message),
            status_code=exc.status,
            media_type="application/json",
            headers=_error_headers(request, exc),
        )
    return error_response(exc, _error_headers(request, exc))


def _on_http_error(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    status = exc.status_code
    if status >= 500:
        return _on_unexpected(request, exc)
    inspector = request.app.state.gateway.settings.inspector
    if inspector.enabled and inspector.ui and is_inspector(request.url.path):
        return error_page(request, exc)  # a page under /ui/, with its headers
    error = GatewayError(
        str(exc.detail),
        code=_HTTP_CODES.get(status, "invalid_request"),
        status=status,
        type="invalid_request_error",
    )
    return _on_gateway_error(request, error)


def _on_unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    record = record_of(request.scope.get("state", {}))
    log.error(
        "unhandled error on %s",
        request.url.path,
        exc_info=exc,
        extra={"request_id": record.request_id if record is not None else None},
    )
    error = GatewayError("The gateway failed to handle the request.")
    return _on_gateway_error(request, error)


class _Litestar(Litestar):
    """Litestar without the plugins it adds by itself for pydantic (and attrs) whenever
    they are installed: the gateway's handlers take and give bytes and msgspec structs,
    and pydantic is there only for the anthropic SDK, which is loaded at the first Claude
    request. Litestar's pydantic plugins cost 8 MB and a fifth of a second at start-up.

    Nor does it look for its own OpenTelemetry middleware among the gateway's: the server
    span is the gateway's (``ServerSpans``), and looking imports Litestar's OpenTelemetry
    plugin, which tries the instrumentation packages installed for the HTTP clients
    (8 ms and a dozen modules at every start, traced or not)."""

    @staticmethod
    def _get_default_plugins(plugins: list[PluginProtocol]) -> list[PluginProtocol]:
        return [*plugins, MsgspecDIPlugin()]

    @staticmethod
    def _patch_opentelemetry_middleware(config: AppConfig) -> AppConfig:
        return config


def create_app(
    settings: Settings | None = None,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    anthropic_transport: httpx2.AsyncBaseTransport | None = None,
) -> Litestar:
    """A gateway application. ``settings`` default to ``load_settings()`` (file and env).
    The process's tracing is set up from the ``OTEL_*`` variables first
    (``gateway.telemetry.tracing``); with it on, each request gets a server span.
    ``transport`` and ``anthropic_transport`` replace the HTTP transports to the
    OpenAI-compatible upstream and to Anthropic (the SDK's copy of httpx), for tests that
    script the provider in process (``httpx.MockTransport``, ``httpx2.MockTransport``)."""
    settings = settings or load_settings()
    configure_tracing()
    traced = tracing_on()
    gateway = Gateway.build(settings, transport=transport, anthropic_transport=anthropic_transport)

    async def close() -> None:
        await gateway.aclose()
        if traced:
            await flush_spans()

    admission = Admission(
        gateway.shedder,
        gateway.tenants,
        gateway.stores,
        gateway.limiter,
        max_header_bytes=settings.max_header_bytes,
    )
    app = _Litestar(
        route_handlers=[
            chat_completions,
            messages,
            count_tokens,
            responses,
            responses_socket,
            compact_dry_run,
            get_object,
            conversations,
            conversation,
            conversation_request,
            list_models,
            healthz,
            readyz,
            metrics,
            stored_completions,
            relayed,
            *inspector_routes(settings.inspector),
        ],
        exception_handlers={
            GatewayError: _on_gateway_error,
            HTTPException: _on_http_error,
            Exception: _on_unexpected,
        },
        # The server span, when traced, is outermost: refusals at admission are traced too.
        middleware=[ServerSpans, admission] if traced else [admission],
        template_config=inspector_templates(),
        on_startup=[gateway.start],
        on_shutdown=[close],
        request_max_body_size=settings.max_body_bytes,
        openapi_config=OpenAPIConfig(
            title="contextgate",
            version="0.1.0",
            path="/schema",
            # The JSON document is completed by gateway.routes.openapi; the UI reads that one.
            render_plugins=[DocumentJson(), RedocRenderPlugin(path=["/", "/redoc"])],
        ),
        logging_config=None,
    )
    app.state.gateway = gateway
    # Around everything Litestar does for a request (routing, errors included), so that
    # every request is counted and logged; a tracing middleware goes around this one.
    # The drain is inside it, so a request ended at shutdown is logged as it was answered.
    app.asgi_handler = AccessLog(
        Drain(app.asgi_handler, gateway.draining),
        gateway.metrics,
        gateway.pipeline.catalog,
        tenanted=bool(gateway.tenants),
        log_prompts=settings.log_prompts,
        ledger=gateway.ledger,
    )
    return app
