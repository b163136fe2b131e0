"""The Anthropic Messages API's own envelopes: an error body,
``{"type": "error", "error": {"type", "message"}}``, with the error type for an HTTP status
(and the status for a type, which an error event in a stream does not carry), and one
server-sent event of a Messages stream. No I/O.

They belong to no one pair: an OpenAI client's errors from Claude
(``chat_anthropic.openai_error``), a Messages client's answers from an OpenAI-compatible
model (``messages_openai``), the restore loop on the Messages wire, and the HTTP layer's
error responses to Messages clients all write or read them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson

__all__ = ["error_body", "error_status", "error_type", "messages_event"]

_ERROR_TYPES: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_STATUSES: Final = {kind: status for status, kind in _ERROR_TYPES.items()} | {"api_error": 500}


def error_type(status: int) -> str:
    """The Anthropic error type for HTTP ``status``."""
    return _ERROR_TYPES.get(status) or (
        "invalid_request_error" if 400 <= status < 500 else "api_error"
    )


def error_status(kind: str) -> int | None:
    """The HTTP status an Anthropic error type stands for (an error event carries none);
    ``None`` for a type the API does not have."""
    return _STATUSES.get(kind)


def error_body(status: int, message: str) -> bytes:
    """An error body in the Anthropic shape, its type the one for ``status``."""
    return orjson.dumps(
        {"type": "error", "error": {"type": error_type(status), "message": message}}
    )


def messages_event(kind: str, data: Mapping[str, Any]) -> bytes:
    """One server-sent event of a Messages stream."""
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"
