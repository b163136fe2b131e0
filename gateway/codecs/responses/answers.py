"""An OpenAI Responses answer as the gateway reads it: its usage in the chat form the
conversation's record keeps, its id, and a stream's first event when it is an error. The
answer itself reaches the client as it came. No I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson

__all__ = ["chat_usage", "error_event", "response_of"]

_ERROR_STATUS: Final = {
    "context_length_exceeded": 400,
    "invalid_prompt": 400,
    "invalid_request_error": 400,
    "rate_limit_exceeded": 429,
    "insufficient_quota": 429,
    "server_error": 500,
    "server_is_overloaded": 503,
}


_TYPES: Final = {400: "invalid_request_error", 429: "rate_limit_error", 500: "server_error"}
"""The envelope's ``type`` for an error event that names none (the API's flat form, whose
``type`` is the event's own, ``error``), by the status it stands for."""


def chat_usage(usage: Any) -> dict[str, Any] | None:
    """Responses ``usage`` (``input_tokens``, ``input_tokens_details.cached_tokens``, ...)
    in the chat form (``prompt_tokens``, ``prompt_tokens_details.cached_tokens``, ...)."""
    if not isinstance(usage, Mapping):
        return None
    prompt, completion = usage.get("input_tokens"), usage.get("output_tokens")
    if not isinstance(prompt, int):
        return None
    details = usage.get("input_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion if isinstance(completion, int) else 0,
        "total_tokens": usage.get("total_tokens", prompt + (completion or 0)),
        "prompt_tokens_details": {"cached_tokens": cached if isinstance(cached, int) else 0},
    }
    reasoning = usage.get("output_tokens_details")
    if isinstance(reasoning, Mapping) and isinstance(reasoning.get("reasoning_tokens"), int):
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning["reasoning_tokens"]}
    return out


def response_of(data: bytes) -> Mapping[str, Any] | None:
    """The response object of a whole answer (``data``) or of a stream event that carries
    one (``response.created``, ``response.completed``, ...)."""
    try:
        found = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(found, dict):
        return None
    inner = found.get("response")
    if isinstance(inner, dict) and isinstance(found.get("type"), str):
        return inner
    return found if found.get("object") == "response" else None


def error_event(data: bytes) -> tuple[int, bytes] | None:
    """When a stream's event ``data`` is an ``error`` event (or ``response.failed``), the
    status it stands for and OpenAI's error envelope for it."""
    if b'"error"' not in data and b"response.failed" not in data[:80]:
        return None
    try:
        event = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(event, dict):
        return None
    kind = event.get("type")
    if kind == "error":
        error = event.get("error") if isinstance(event.get("error"), dict) else event
    elif kind == "response.failed":
        response = event.get("response")
        error = response.get("error") if isinstance(response, dict) else None
    else:
        return None
    error = error if isinstance(error, dict) else {}
    code = error.get("code")
    kind = error.get("type") if error is not event else None
    status = _ERROR_STATUS.get(str(code), _ERROR_STATUS.get(str(kind), 502))
    body = {
        "error": {
            "message": str(error.get("message") or "The upstream failed the response."),
            "type": str(kind or _TYPES.get(status, "upstream_error")),
            "param": error.get("param"),
            "code": code,
        }
    }
    return status, orjson.dumps(body)
