"""Errors a client of the gateway can see, each with a stable status, ``type`` and ``code``.

    GatewayError
    ├── InvalidRequest          400  invalid_request_error  (bad JSON, wrong types, bad policy)
    ├── RequestRejectedError    400  invalid_request_error  (pipeline refusal: payload_too_large)
    ├── PayloadTooLarge         413  invalid_request_error  request_too_large
    ├── NotFound                404  invalid_request_error  not_found
    ├── ClientDisconnected      499  invalid_request_error  client_closed_request
    ├── UpstreamUnreachable     502  upstream_error         upstream_unreachable
    ├── UpstreamStreamBroken    502  upstream_error         upstream_stream_error
    ├── UpstreamInvalidAnswer   502  upstream_error         upstream_invalid_answer
    └── UpstreamTimeout         504  upstream_error         upstream_timeout

Third-party exceptions (httpx, the pipeline's) are mapped to these at one boundary each,
with ``raise ... from exc``. ``openai_envelope`` renders any of them in the OpenAI shape.
"""

from __future__ import annotations

from typing import Any, ClassVar

import orjson

__all__ = [
    "ClientDisconnected",
    "GatewayError",
    "InvalidRequest",
    "NotFound",
    "PayloadTooLarge",
    "RequestRejectedError",
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
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.param = param
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


class NotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    default_code = "not_found"


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
