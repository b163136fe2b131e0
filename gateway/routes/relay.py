"""The relay: every OpenAI route the gateway does not manage itself (embeddings, files,
audio, images, moderations, batches, stored chat completions, the Responses API, ...)
goes to the request's upstream as it came, and its answer comes back as it went.

What is kept exactly: the method; the path and query string, as the client's bytes (the
ASGI scope's ``raw_path`` and ``query_string``, sent as httpx's request-target, so
``metadata%5Bfoo%5D=x`` and ``ft:gpt-4o-mini:org:x:abc`` are never re-encoded); the body;
the headers but hop-by-hop ones, ``Host``, ``Cookie``, ``Expect`` and ``x-contextgate-*``;
the upstream's status, headers and body (its ``Content-Length`` and ``Content-Encoding``
too, since the bytes are relayed as they came off the wire).

What the gateway does on the way: admission (the caller's key, tenant and limits), the
key (the tenant's upstream key, or in passthrough mode the caller's own), the choice of
upstream, the body limits, and telemetry (request id, access line, metrics under a route
label without ids, a server span and an upstream span). The path under the gateway's
``/v1`` is appended to the upstream base URL's own path: base ``https://host/api/v1`` and
``GET /v1/files/f1?limit=2`` give ``GET /api/v1/files/f1?limit=2`` on ``host``.

Bodies: a JSON body is read whole (within ``max_body_bytes``, as on the chat route) to
learn its ``model`` (and, for the access log, whether it asks for a ``stream``), then sent
as received. Any other body is streamed upstream as it arrives, within ``max_file_bytes``
for ``multipart/form-data`` (file uploads) and ``max_body_bytes`` otherwise; a body found
too large while it streams is a 413 and the upload is aborted. Answers are streamed back
chunk by chunk; an upstream error (4xx/5xx) is read whole, with the key it was sent with
redacted, as on the chat route.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable
from time import perf_counter
from typing import Any, Final

import anyio
import httpx
import orjson
from litestar import Request
from litestar.response.base import ASGIResponse
from litestar.response.streaming import ASGIStreamingResponse
from litestar.types import Receive, Send
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, StatusCode

from gateway.config import Settings
from gateway.context.compaction import refuse_upstream_choice
from gateway.context.record import RequestRecord
from gateway.errors import (
    ClientDisconnected,
    Forbidden,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    RequestTimeout,
)
from gateway.http.client import read_body, while_connected
from gateway.http.forwarding import HOP_BY_HOP, upstream_request_headers
from gateway.http.headers import report_headers
from gateway.http.responses import buffered_response
from gateway.http.sse import close
from gateway.providers.openai import Upstream
from gateway.routes.calls import caller_of, record_of, runtime_of
from gateway.runtime import Gateway
from gateway.tenancy.auth import Caller

__all__ = ["RESOURCES", "relay", "route_label", "upstream_target"]

log = logging.getLogger("contextgate.passthrough")
_tracer = trace.get_tracer(__name__)

RESOURCES: Final = frozenset(
    {
        "assistants",
        "audio",
        "batches",
        "chat",
        "completions",
        "containers",
        "conversations",
        "embeddings",
        "evals",
        "files",
        "fine_tuning",
        "images",
        "models",
        "moderations",
        "organization",
        "realtime",
        "responses",
        "threads",
        "uploads",
        "vector_stores",
        "videos",
    }
)
"""The OpenAI API's resources: a relayed request's route label names its resource when it
is one of these (``/v1/files``, ``/v1/files/*``), else it is ``/v1/*``, so that metrics
never get a label per id or per made-up path."""

_OPERATIONS: Final = {"/v1/responses": "chat", "/v1/embeddings": "embeddings"}
"""GenAI operation names (OpenTelemetry's conventions) of the relayed routes that have one."""

_MULTIPART: Final = "multipart/form-data"
_OWN: Final = ("/v1/messages/", "/v1/context/")
"""The gateway's own API families: an unknown path under them is a 404, not relayed."""


def route_label(path: str) -> str:
    """The bounded label of a relayed path, for metrics, the access log and span names."""
    parts = path.split("/", 3)  # "", "v1", resource, rest
    resource = parts[2] if len(parts) > 2 else ""
    if resource not in RESOURCES:
        return "/v1/*"
    return f"/v1/{resource}/*" if len(parts) > 3 and parts[3] else f"/v1/{resource}"


def upstream_target(base_url: str, raw_path: bytes, query: bytes) -> bytes:
    """The request-target sent upstream: the base URL's path, then the client's path
    after ``/v1``, then its query string, all as the bytes they were."""
    base = httpx.URL(base_url).raw_path.partition(b"?")[0].rstrip(b"/")
    target = base + raw_path[3:]
    return target + b"?" + query if query else target


def _checked_path(scope_path: str, raw_path: bytes) -> None:
    """404 for a path whose bytes do not begin ``/v1/`` (an encoded ``v1`` that only
    routed after decoding) or under the gateway's own ``/v1/messages`` and
    ``/v1/context``, 400 for dot segments: the client may not climb out of the
    upstream's API path."""
    if not raw_path.startswith(b"/v1/") or scope_path.startswith(_OWN):
        raise NotFound("No such route.")
    if any(segment in (".", "..") for segment in scope_path.split("/")):
        raise InvalidRequest(
            "The path may not contain '.' or '..' segments.", code="invalid_path", param="path"
        )


class _StreamedBody:
    """The client's body, chunk by chunk as it arrives, for httpx to send on: 413 past
    ``limit`` bytes, 408 when the client is silent for ``idle`` seconds, 499 when it
    leaves. ``finished`` is set once the last chunk is read."""

    __slots__ = ("_idle", "_limit", "_receive", "finished")

    def __init__(self, receive: Receive, limit: int, idle: float) -> None:
        self._receive, self._limit, self._idle = receive, limit, idle
        self.finished = asyncio.Event()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        size = 0
        while True:
            try:
                async with asyncio.timeout(self._idle):
                    message = await self._receive()
            except TimeoutError:
                raise RequestTimeout(
                    f"The request body stalled for {self._idle:g} seconds."
                ) from None
            if message["type"] == "http.disconnect":
                raise ClientDisconnected("The client closed the connection while sending its body.")
            chunk: bytes = message.get("body", b"")  # type: ignore[assignment]
            size += len(chunk)
            if size > self._limit:
                raise PayloadTooLarge(_too_large(self._limit))
            if chunk:
                yield chunk
            if not message.get("more_body", False):
                self.finished.set()
                return


def _too_large(limit: int) -> str:
    return f"The request body is larger than this gateway accepts ({limit:,} bytes)."


async def relay(request: Request[Any, Any, Any]) -> ASGIResponse:
    """Relay ``request`` to its upstream and its answer back (the module's docstring)."""
    started = perf_counter()
    gateway = runtime_of(request)
    record = record_of(request)
    scope = request.scope
    path: str = scope["path"]
    raw_path: bytes = scope.get("raw_path") or path.encode()
    label = route_label(path)
    scope["path_template"] = label  # the access log's and the metrics' route
    _checked_path(path, raw_path)
    method: str = scope["method"]
    server_span = trace.get_current_span()
    server_span.update_name(f"{method} {label}")
    server_span.set_attribute("http.route", label)

    caller = caller_of(request)
    headers = request.headers
    length = headers.get("content-length")
    content, model = await _body_of(request, gateway.settings, record)
    if model is None and path.startswith("/v1/models/"):
        model = path.removeprefix("/v1/models/")
    upstream = _upstream_for(gateway, caller, model)

    forwarded = upstream_request_headers(headers.items(), caller.upstream_key)
    forwarded["accept-encoding"] = headers.get("accept-encoding", "identity")
    if isinstance(content, _StreamedBody) and length is not None:
        forwarded["content-length"] = length
    target = upstream_target(upstream.settings.base_url, raw_path, scope.get("query_string", b""))
    span = _upstream_span(method, label, model)
    own_ms = (perf_counter() - started) * 1000
    try:
        with trace.use_span(span, end_on_exit=False):
            response = await _send(request.receive, upstream, method, target, forwarded, content)
    except Exception as exc:
        _end(span, failure=getattr(exc, "code", None) or type(exc).__qualname__)
        raise
    except BaseException:
        _end(span)  # cancelled: the client left or the drain ended it, the upstream did not fail
        raise
    span.set_attribute("http.response.status_code", response.status_code)
    ours = report_headers(record.request_id, None, own_ms)
    if not response.is_success:
        _end(span, failure=str(response.status_code))
        body = await while_connected(
            request.receive, upstream.read_body(response, upstream.settings.max_error_body_bytes)
        )
        return buffered_response(response, body, ours)
    return _RelayedResponse(response, span, [*_relayable(response.headers), *ours.items()])


async def _body_of(
    request: Request[Any, Any, Any], settings: Settings, record: RequestRecord
) -> tuple[bytes | _StreamedBody | None, str | None]:
    """The body to send on (``None``: the request has none) and the model it names. A
    JSON body is read whole, for its ``model`` (noted in ``record`` with whether it asks
    for a stream); any other streams, within its limit."""
    headers = request.headers
    media_type = headers.get("content-type", "").partition(";")[0].strip().lower()
    length = headers.get("content-length")
    if media_type == "application/json":
        body = await read_body(
            request.receive, length, settings.max_body_bytes, within=settings.body_timeout
        )
        fields = _fields_of(body)
        if fields is None:
            return body, None
        record.read(fields)  # the access log's model and stream, the metrics' model
        return body, fields["model"]
    if length in (None, "0") and "transfer-encoding" not in headers:
        return None, None
    limit = settings.max_file_bytes if media_type == _MULTIPART else settings.max_body_bytes
    if length is not None and length.isdigit() and int(length) > limit:
        raise PayloadTooLarge(_too_large(limit))
    return _StreamedBody(request.receive, limit, settings.body_timeout), None


def _fields_of(body: bytes) -> dict[str, Any] | None:
    """What the gateway reads of a JSON body (``None``: an empty one): the ``model`` it
    names (``None``: none) and ``stream``, whether it asks for a stream; 400 for a body
    that is not a JSON object, or that tries to choose its upstream.

    ``stream`` is the request's ``"stream": true`` rather than an event stream coming
    back: the access log's ``stream`` says whether the request asked for a stream, as on
    the chat route, where an upstream error answering a streamed request (a JSON body)
    is logged as streamed too; and it is read here, from the one parse the relay makes
    for the model, before anything has come back."""
    if not body.strip():
        return None
    try:
        fields = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"The body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(fields, dict):
        raise InvalidRequest("The body must be a JSON object.", code="invalid_body")
    refuse_upstream_choice(fields)
    model = fields.get("model")
    return {
        "model": model if isinstance(model, str) else None,
        "stream": fields.get("stream") is True,
    }


def _upstream_for(gateway: Gateway, caller: Caller, model: str | None) -> Upstream:
    """The OpenAI-compatible upstream, once the tenant may use ``model``; a model the
    built-in Anthropic provider serves is a 400: Anthropic has none of these routes."""
    if model is None:
        return gateway.upstream
    if not caller.profile.allows(model):
        raise Forbidden(f"This key may not use the model {model!r}.", param="model")
    if gateway.upstream_for(model) is gateway.anthropic:
        raise InvalidRequest(
            f"{model} is served by Anthropic, which has no such route; use"
            " /v1/chat/completions or /v1/messages for it.",
            code="unsupported_route",
            param="model",
        )
    return gateway.upstream


async def _send(
    receive: Receive,
    upstream: Upstream,
    method: str,
    target: bytes,
    headers: dict[str, str],
    content: bytes | _StreamedBody | None,
) -> httpx.Response:
    """The upstream's response (its headers). While the body streams up, the body itself
    watches the client; once it is all sent, so does ``while_connected``, and a client
    that leaves then closes the upstream request."""
    sending = asyncio.ensure_future(upstream.open(method, target, headers=headers, content=content))
    if isinstance(content, _StreamedBody):
        body_sent = asyncio.ensure_future(content.finished.wait())
        try:
            await asyncio.wait((sending, body_sent), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            sending.cancel()
            raise
        finally:
            body_sent.cancel()
        if sending.done():
            return sending.result()
    try:
        return await while_connected(receive, sending)
    except BaseException:
        # ``sending`` finished in the same turn as the client left (or the drain ended
        # the request): its response, open, was dropped with the result; close it.
        if sending.done() and not sending.cancelled() and sending.exception() is None:
            with anyio.CancelScope(shield=True):
                await sending.result().aclose()
        raise


_NOT_RELAYED: Final = HOP_BY_HOP | {"date", "server", "set-cookie"}


def _relayable(headers: httpx.Headers) -> list[tuple[str, str]]:
    """The upstream's headers for a body relayed as its raw bytes (so with its own
    ``Content-Length`` and ``Content-Encoding``)."""
    return [
        (name, value)
        for name, value in headers.multi_items()
        if name.lower() not in _NOT_RELAYED and not name.lower().startswith("x-contextgate-")
    ]


class _RelayedResponse(ASGIStreamingResponse):
    """An upstream's success answer, relayed chunk by chunk as its bytes arrive. The
    upstream response is closed, and its span ended, however the relay ends: the body
    done, the client gone, or the upstream broken (then the client's connection is cut,
    as the upstream cut the gateway's)."""

    __slots__ = ("_raw_headers", "_span", "_upstream")

    def __init__(
        self, response: httpx.Response, span: Span, headers: Iterable[tuple[str, str]]
    ) -> None:
        super().__init__(iterator=response.aiter_raw(), status_code=response.status_code)
        self._upstream = response
        self._span = span
        self._raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]

    def encode_headers(self) -> list[tuple[bytes, bytes]]:
        return self._raw_headers

    async def send_body(self, send: Send, receive: Receive) -> None:
        failure: str | None = None
        try:
            await super().send_body(send, receive)
        except httpx.HTTPError as exc:
            failure = type(exc).__qualname__
            log.warning("upstream broke off a relayed answer: %s", failure)
            raise
        finally:
            with anyio.CancelScope(shield=True):
                await close(self.iterator)
                await self._upstream.aclose()
            _end(self._span, failure=failure)


def _upstream_span(method: str, label: str, model: str | None) -> Span:
    """The upstream span of a relayed call: ``{operation} {model}`` with the GenAI
    attributes for the routes that are GenAI operations, ``{method} {route}`` else."""
    operation = _OPERATIONS.get(label)
    name = f"{operation} {model}" if operation and model else f"{method} {label}"
    span = _tracer.start_span(name, kind=SpanKind.CLIENT)
    if span.is_recording():
        span.set_attribute("contextgate.relay.route", label)
        span.set_attribute("gen_ai.provider.name", "openai")
        if operation:
            span.set_attribute("gen_ai.operation.name", operation)
        if model:
            span.set_attribute("gen_ai.request.model", model)
    return span


def _end(span: Span, *, failure: str | None = None) -> None:
    if failure is not None and span.is_recording():
        span.set_attribute("error.type", failure)
        span.set_status(StatusCode.ERROR)
    span.end()
