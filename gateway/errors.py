"""Errors a client of the gateway can see, each with a stable status, ``type`` and ``code``.

    GatewayError
    ├── InvalidRequest          400  invalid_request_error  (bad JSON, wrong types, bad policy)
    ├── RequestRejectedError    400  invalid_request_error  (pipeline refusal: payload_too_large)
    ├── Forbidden               403  permission_error       model_not_allowed
    ├── NotFound                404  invalid_request_error  not_found
    ├── RequestTimeout          408  invalid_request_error  request_timeout
    ├── PayloadTooLarge         413  invalid_request_error  request_too_large
    ├── HeadersTooLarge         431  invalid_request_error  headers_too_large
    ├── RateLimited             429  rate_limit_error       rate_limit_exceeded
    ├── ClientDisconnected      499  invalid_request_error  client_closed_request
    ├── UpstreamUnreachable     502  upstream_error         upstream_unreachable
    ├── UpstreamStreamBroken    502  upstream_error         upstream_stream_error
    ├── UpstreamInvalidAnswer   502  upstream_error         upstream_invalid_answer
    ├── ShuttingDown            503  server_error           gateway_shutting_down
    ├── Overloaded              503  server_error           gateway_overloaded
    ├── StoreUnavailable        503  api_error              store_unavailable
    └── UpstreamTimeout         504  upstream_error         upstream_timeout

Third-party exceptions (httpx, the pipeline's) are mapped to these at one boundary each,
with ``raise ... from exc``. ``openai_envelope`` renders any of them in the OpenAI shape.
An error may carry response headers (``Retry-After`` on a 429 or a 503).
"""

from __future__ import annotations

from typing import Any, ClassVar

import orjson

__all__ = [
    "ClientDisconnected",
    "Forbidden",
    "GatewayError",
    "HeadersTooLarge",
    "InvalidRequest",
    "NotFound",
    "Overloaded",
    "PayloadTooLarge",
    "RateLimited",
    "RequestRejectedError",
    "RequestTimeout",
    "ShuttingDown",
    "StoreUnavailable",
    "UpstreamInvalidAnswer",
    "UpstreamStreamBroken",
    "UpstreamTimeout",
    "UpstreamUnreachable",
    "openai_envelope",
]


class GatewayError(Exception):
    """Base of the gateway's own errors."""

    status: int = 500
    type: str = "internal_error"
    default_code: ClassVar[str] = "internal_error"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        status: int | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.param = param
        self.headers = headers
        if status is not None:
            self.status = status
        if type is not None:
            self.type = type


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"
    default_code = "invalid_request"


class RequestRejectedError(InvalidRequest):
    """The pipeline refused to forward the request (its ``code`` is the pipeline's)."""


class PayloadTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"
    default_code = "request_too_large"


class Forbidden(GatewayError):
    """The caller is known but may not do this (a model outside its tenant's list)."""

    status = 403
    type = "permission_error"
    default_code = "model_not_allowed"


class RequestTimeout(GatewayError):
    """The client took longer than ``body_timeout`` to send its body."""

    status = 408
    type = "invalid_request_error"
    default_code = "request_timeout"


class HeadersTooLarge(GatewayError):
    status = 431
    type = "invalid_request_error"
    default_code = "headers_too_large"


class RateLimited(GatewayError):
    """Over a tenant's request rate or concurrency limit; ``Retry-After`` says when to
    try again."""

    status = 429
    type = "rate_limit_error"
    default_code = "rate_limit_exceeded"


class NotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    default_code = "not_found"


class StoreUnavailable(GatewayError):
    """The store a route reads (offloaded objects, the ledger) cannot be read now."""

    status = 503
    type = "api_error"
    default_code = "store_unavailable"


class ClientDisconnected(GatewayError):
    """The client closed the connection before the answer was ready (nginx's 499)."""

    status = 499
    type = "invalid_request_error"
    default_code = "client_closed_request"


class UpstreamUnreachable(GatewayError):
    status = 502
    type = "upstream_error"
    default_code = "upstream_unreachable"


class UpstreamStreamBroken(GatewayError):
    """The upstream's stream broke off after it began (sent as a terminal error event)."""

    status = 502
    type = "upstream_error"
    default_code = "upstream_stream_error"


class UpstreamInvalidAnswer(GatewayError):
    """The upstream answered with success and a body that is not the answer it should be
    (not JSON, or not an object of the API's shape), where the gateway must read it."""

    status = 502
    type = "upstream_error"
    default_code = "upstream_invalid_answer"


class ShuttingDown(GatewayError):
    """The gateway stopped on SIGTERM and its grace period ran out before this request
    finished (a 503, or a stream's terminal error event); sending it again reaches
    another replica."""

    status = 503
    type = "server_error"
    default_code = "gateway_shutting_down"


class Overloaded(GatewayError):
    """The process is past its ``max_in_flight``, or work waits longer than
    ``max_queue_delay`` (``gateway.edge.overload``); refused before any work, with
    ``Retry-After``. Sent again, it may reach another replica or a calmer moment."""

    status = 503
    type = "server_error"
    default_code = "gateway_overloaded"


class UpstreamTimeout(GatewayError):
    status = 504
    type = "upstream_error"
    default_code = "upstream_timeout"


def openai_envelope(
    message: str, *, type: str, code: str | None, param: str | None = None
) -> bytes:
    """An error body in the OpenAI shape: ``{"error": {message, type, param, code}}``."""
    error: dict[str, Any] = {"message": message, "type": type, "param": param, "code": code}
    return orjson.dumps({"error": error})


def envelope_of(error: GatewayError) -> bytes:
    return openai_envelope(error.message, type=error.type, code=error.code, param=error.param)
