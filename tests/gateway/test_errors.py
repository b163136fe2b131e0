"""The gateway's error tree and its OpenAI envelope."""

from __future__ import annotations

import orjson

from gateway.errors import (
    ClientDisconnected,
    GatewayError,
    InvalidRequest,
    PayloadTooLarge,
    UpstreamStreamBroken,
    UpstreamTimeout,
    UpstreamUnreachable,
    envelope_of,
)


def test_every_error_has_a_stable_status_type_and_code() -> None:
    """Each class carries the status, type and code the API documentation promises."""
    expected = {
        InvalidRequest: (400, "invalid_request_error", "invalid_request"),
        PayloadTooLarge: (413, "invalid_request_error", "request_too_large"),
        ClientDisconnected: (499, "invalid_request_error", "client_closed_request"),
        UpstreamUnreachable: (502, "upstream_error", "upstream_unreachable"),
        UpstreamStreamBroken: (502, "upstream_error", "upstream_stream_error"),
        UpstreamTimeout: (504, "upstream_error", "upstream_timeout"),
    }
    for cls, (status, type_, code) in expected.items():
        error = cls("message")
        assert isinstance(error, GatewayError)
        assert (error.status, error.type, error.code) == (status, type_, code)


def test_envelope_is_openai_shaped() -> None:
    """The body is {"error": {message, type, param, code}} and nothing else."""
    body = orjson.loads(envelope_of(InvalidRequest("bad", code="invalid_type", param="model")))
    assert body == {
        "error": {
            "message": "bad",
            "type": "invalid_request_error",
            "param": "model",
            "code": "invalid_type",
        }
    }
