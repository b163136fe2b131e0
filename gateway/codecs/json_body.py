"""A JSON request body read and checked, for the codecs of every inbound API: the body as
an object, and errors that name the field and what was wrong with it."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import InvalidRequest

__all__ = ["json_dict", "json_object", "json_type", "shown", "type_error"]


def json_object(raw: bytes) -> dict[str, Any]:
    """The JSON object in ``raw``, or ``InvalidRequest`` (``invalid_json``,
    ``invalid_body``)."""
    if not raw.strip():
        raise InvalidRequest("The request body is empty; send a JSON object.", code="invalid_json")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(
            f"The request body is not valid JSON: {exc}", code="invalid_json"
        ) from exc
    if not isinstance(body, dict):
        raise InvalidRequest(
            f"The request body must be a JSON object, got {json_type(body)}.", code="invalid_body"
        )
    return body


def json_dict(data: bytes) -> dict[str, Any] | None:
    """The JSON object in ``data``, or ``None`` when it holds none: an answer or an event
    read leniently, to add to or take from it what is there."""
    try:
        found = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return found if isinstance(found, dict) else None


def type_error(param: str, expected: str, got: Any) -> InvalidRequest:
    """``missing_required_parameter`` when ``got`` is absent (or null), else
    ``invalid_type``, naming ``param`` and what was ``expected``."""
    if got is None:
        return InvalidRequest(
            f"Missing required parameter: '{param}' (expected {expected}).",
            code="missing_required_parameter",
            param=param,
        )
    return InvalidRequest(
        f"Invalid type for '{param}': expected {expected}, but got {json_type(got)}.",
        code="invalid_type",
        param=param,
    )


def json_type(value: Any) -> str:
    """What kind of JSON value ``value`` is, as an error message says it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def shown(value: Any) -> str:
    """``value`` as JSON, cut to 40 characters, for an error message; a value nested too
    deep to write out (the parser accepts more levels than the writer) is named by kind."""
    if value is None:
        return "nothing"
    try:
        text = orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        return json_type(value)
    return text if len(text) <= 40 else text[:37] + "..."
