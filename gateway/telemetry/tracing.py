"""Tracing's process-wide setup: the OpenTelemetry SDK, configured by the standard ``OTEL_*``
variables alone, and the gateway's own clients instrumented once it is on.

Tracing is on when the environment names somewhere to send spans: ``OTEL_EXPORTER_OTLP_ENDPOINT``
or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (OTLP over HTTP/protobuf), or ``OTEL_TRACES_EXPORTER``
listing ``otlp`` and/or ``console``. It is off when none is set, when ``OTEL_TRACES_EXPORTER``
is ``none`` and when ``OTEL_SDK_DISABLED`` is ``true``: then no SDK is installed, the API's
tracers do nothing, and the gateway adds no server-span middleware and wraps no client.

The SDK and the exporter read the rest themselves: ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES`` (the service is ``contextgate`` unless they name one),
``OTEL_TRACES_SAMPLER`` and its argument, ``OTEL_BSP_*``, and the exporter's headers, timeout,
compression and certificates. Only the HTTP exporter is installed: a ``grpc`` (or
``http/json``) protocol is warned about and spans go as HTTP/protobuf. The HTTP client
spans use the stable HTTP conventions (``OTEL_SEMCONV_STABILITY_OPT_IN=http`` unless set),
as the server span does.

A tracer provider the embedding program installed first (``opentelemetry-instrument``, a
test) is used as it is.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import os
from typing import TYPE_CHECKING, Final

import httpx
from opentelemetry import trace

if TYPE_CHECKING:
    import httpx2  # the anthropic SDK's, loaded with it
    import redis.asyncio as aioredis
    from opentelemetry.sdk.trace.export import SpanExporter
    from redis.asyncio.cluster import RedisCluster

__all__ = [
    "configure_tracing",
    "flush_spans",
    "trace_redis",
    "traced_sdk_transport",
    "traced_transport",
    "tracing_on",
]

log = logging.getLogger("contextgate.tracing")

_ENDPOINTS: Final = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_PROTOCOLS: Final = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
_SANITIZED: Final = "OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SANITIZE_FIELDS"
_CREDENTIALS: Final = "authorization,proxy-authorization,x-api-key,api-key,cookie,set-cookie"
"""Headers redacted should an operator ask the HTTP instrumentation to capture headers
(``OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_CLIENT_REQUEST``): they carry API keys."""


@functools.cache
def configure_tracing() -> None:
    """Install an SDK tracer provider as the ``OTEL_*`` variables ask, once per process
    (every app a process creates calls this; only the first call acts)."""
    environ = os.environ
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true" or tracing_on():
        return
    exporters = _exporters()
    if not exporters:
        return
    from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "contextgate"}))
    if SERVICE_VERSION not in resource.attributes:
        resource = resource.merge(Resource({SERVICE_VERSION: _version()}))
    provider = TracerProvider(resource=resource)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    # Read by the instrumentations when they are made (after this).
    sanitized = environ.get(_SANITIZED, "").strip()
    environ[_SANITIZED] = f"{sanitized},{_CREDENTIALS}" if sanitized else _CREDENTIALS
    environ.setdefault("OTEL_SEMCONV_STABILITY_OPT_IN", "http")
    trace.set_tracer_provider(provider)


def tracing_on() -> bool:
    """Whether a tracer provider is installed (ours, or the embedding program's)."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


async def flush_spans() -> None:
    """Send the spans still waiting in the batch (at shutdown), within 5 seconds."""
    from opentelemetry.sdk.trace import TracerProvider

    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):
        import anyio.to_thread

        await anyio.to_thread.run_sync(provider.force_flush, 5_000)


def traced_transport(transport: httpx.AsyncBaseTransport) -> httpx.AsyncBaseTransport:
    """``transport`` with a client span per request and the trace context sent along
    (``traceparent`` set, replacing any the caller's headers brought), when tracing is on."""
    if not tracing_on():
        return transport
    from opentelemetry.instrumentation.httpx import AsyncOpenTelemetryTransport

    return AsyncOpenTelemetryTransport(transport)


def traced_sdk_transport(transport: httpx2.AsyncBaseTransport) -> httpx2.AsyncBaseTransport:
    """``traced_transport`` for the anthropic SDK's own copy of httpx."""
    if not tracing_on():
        return transport
    from opentelemetry.instrumentation.httpx import AsyncOpenTelemetryTransportHttpx2

    # The instrumentation annotates its httpx2 transport with httpx's types.
    return AsyncOpenTelemetryTransportHttpx2(transport)  # type: ignore[arg-type]


def trace_redis(client: aioredis.Redis | RedisCluster) -> None:
    """A client span per command or pipeline of ``client``, when tracing is on. The
    instrumentation records a command's name and ``?`` for each argument, never keys or
    values (which hold offloaded content)."""
    if not tracing_on():
        return
    from opentelemetry.instrumentation.redis import RedisInstrumentor

    RedisInstrumentor.instrument_client(client)


def _exporters() -> list[SpanExporter]:
    environ = os.environ
    names = [
        name.strip().lower()
        for name in environ.get("OTEL_TRACES_EXPORTER", "").split(",")
        if name.strip()
    ]
    if not names and any(environ.get(name) for name in _ENDPOINTS):
        names = ["otlp"]
    if "none" in names:
        return []
    exporters: list[SpanExporter] = []
    for name in dict.fromkeys(names):
        if name == "otlp":
            exporters.append(_otlp())
        elif name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            exporters.append(ConsoleSpanExporter())
        else:
            log.warning("OTEL_TRACES_EXPORTER names %r, which contextgate does not ship", name)
    return exporters


def _otlp() -> SpanExporter:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    protocol = next((os.environ[name] for name in _PROTOCOLS if os.environ.get(name)), "")
    if protocol.strip().lower() not in ("", "http/protobuf"):
        log.warning(
            "OTLP protocol %r is not installed; spans are sent as OTLP over HTTP/protobuf"
            " (point the endpoint at the collector's HTTP port, usually 4318)",
            protocol,
        )
    return OTLPSpanExporter()


def _version() -> str:
    try:
        return importlib.metadata.version("contextgate")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
