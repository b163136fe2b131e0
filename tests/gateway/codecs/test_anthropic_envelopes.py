"""Anthropic's error envelope: an error's type is the one the Messages API gives for its
status."""

from __future__ import annotations

import orjson
import pytest

from gateway.codecs.anthropic_envelopes import error_body, error_type


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (402, "billing_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (422, "invalid_request_error"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (502, "api_error"),
        (504, "timeout_error"),
        (529, "overloaded_error"),
    ],
)
def test_statuses_have_the_anthropic_error_types(status: int, kind: str) -> None:
    """An error's type is the one the Messages API gives for its status."""
    assert error_type(status) == kind
    assert orjson.loads(error_body(status, "Nope.")) == {
        "type": "error",
        "error": {"type": kind, "message": "Nope."},
    }
