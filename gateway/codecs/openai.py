"""The OpenAI Chat Completions wire format: parsing and checking inbound request bodies.

The pipeline works in this format, so decoding is parsing plus the checks that make the
body safe for the pipeline to read. Anything the checks do not look at (unknown fields,
provider extensions) is kept as it is and forwarded untouched.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.codecs.json_body import json_object, shown, type_error
from gateway.errors import InvalidRequest

__all__ = ["parse_chat_request"]

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def parse_chat_request(raw: bytes) -> dict[str, Any]:
    """The request body as a dict, or ``InvalidRequest`` naming what is wrong."""
    body = json_object(raw)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise type_error("model", "a non-empty string", model)
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise type_error("stream", "a boolean", stream)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise type_error("messages", "a non-empty array", messages)
    for index, message in enumerate(messages):
        _check_message(index, message)
    for key in ("tools", "functions"):
        value = body.get(key)
        if value is not None and not (
            isinstance(value, list) and all(isinstance(t, dict) for t in value)
        ):
            raise type_error(key, "an array of objects", value)
    _check_nesting({key: value for key, value in body.items() if key != "messages"}, None, 0)
    return body


def _check_nesting(value: Any, param: str | None, depth: int) -> None:
    """Refuse structures too deep to serialise again: the pipeline writes JSON back out
    (orjson stops at 255 levels), while the parser accepts up to 1,024. ``depth`` is how
    deep ``value`` sits in the body."""
    wrapped = value
    for _ in range(depth):
        wrapped = [wrapped]
    try:
        orjson.dumps(wrapped)
    except orjson.JSONEncodeError as exc:
        raise InvalidRequest(
            f"The request is nested too deeply (over {_MAX_NESTING} levels).",
            code="nesting_too_deep",
            param=param,
        ) from exc


_MAX_NESTING = 255


_OPTIONAL_STRINGS = ("name", "tool_call_id", "reasoning_content")
_STRING_FIELDS = frozenset({"role", "content", *_OPTIONAL_STRINGS})
"""Fields a message may have as strings: a message of these and nothing else is plain."""


def _check_message(index: int, message: Any) -> None:
    # The common cases are checked with as little work as possible: this runs for every
    # message of every request. The error message is only built on failure.
    if not isinstance(message, dict):
        raise type_error(f"messages[{index}]", "an object", message)
    role = message.get("role")
    if message.keys() <= _STRING_FIELDS:
        for value in message.values():
            if type(value) is not str:
                break
        else:  # strings only, as most messages of any history are: only the role to check
            if role in _ROLES:
                return
    elif type(role) is str and role in _ROLES and _plain_tool_calls(message):
        return
    _check_fully(index, message)


def _check_fully(index: int, message: dict[str, Any]) -> None:
    role = message.get("role")
    if not isinstance(role, str) or role not in _ROLES:  # a list or object is unhashable
        param = f"messages[{index}].role"
        raise InvalidRequest(
            f"Invalid value for '{param}': expected one of {', '.join(sorted(_ROLES))},"
            f" got {shown(role)}.",
            code="invalid_value",
            param=param,
        )
    content = message.get("content")
    if content is not None and type(content) is not str:
        if not isinstance(content, list):
            raise type_error(
                f"messages[{index}].content", "a string, an array of parts or null", content
            )
        for position, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise type_error(
                    f"messages[{index}].content[{position}]",
                    "an object with a string 'type'",
                    part,
                )
    tool_calls = message.get("tool_calls")
    if tool_calls is not None and not (
        isinstance(tool_calls, list) and all(isinstance(c, dict) for c in tool_calls)
    ):
        raise type_error(f"messages[{index}].tool_calls", "an array of objects", tool_calls)
    for position, call in enumerate(tool_calls or ()):
        function = call.get("function")
        if function is not None and not (
            isinstance(function, dict)
            and isinstance(function.get("name", ""), str)
            and isinstance(function.get("arguments", ""), str)
        ):
            raise type_error(
                f"messages[{index}].tool_calls[{position}].function",
                "an object with string 'name' and 'arguments'",
                function,
            )
    for key in _OPTIONAL_STRINGS:
        value = message.get(key)
        if value is not None and type(value) is not str:
            raise type_error(f"messages[{index}].{key}", "a string", value)
    if not _shallow(message):
        _check_nesting(message, f"messages[{index}]", 2)


_TOOL_CALL_FIELDS = _STRING_FIELDS | {"tool_calls"}
_OPTIONAL_TEXT = ("content", *_OPTIONAL_STRINGS)
_CALL_FIELDS = frozenset({"id", "type", "function"})


def _plain_tool_calls(message: dict[str, Any]) -> bool:
    """Whether ``message`` is an assistant's tool calls the way nearly every one is: string
    fields (content also null) and ``tool_calls``, a list of calls of string fields and a
    ``function`` of exactly a string name and arguments. Such a message passes every check
    of ``_check_fully``, nesting included; this says so in under half the time."""
    calls = message.get("tool_calls")
    if type(calls) is not list or not message.keys() <= _TOOL_CALL_FIELDS:
        return False
    for key in _OPTIONAL_TEXT:
        value = message.get(key)
        if value is not None and type(value) is not str:
            return False
    for call in calls:
        if type(call) is not dict or not call.keys() <= _CALL_FIELDS:
            return False
        function = call.get("function")
        if (
            type(function) is not dict
            or type(function.get("name")) is not str
            or type(function.get("arguments")) is not str
            or len(function) != 2
            or type(call.get("id", "")) is not str
            or type(call.get("type", "")) is not str
        ):
            return False
    return True


_SCALARS = (str, int, float, bool, type(None))


def _shallow(message: dict[str, Any]) -> bool:
    """Whether ``message`` is at most four levels deep the way nearly every message is: its
    containers are lists of objects (tool calls, content parts) or objects, holding values
    that are scalars or objects of scalars. Cheaper than serialising it to find out."""
    for value in message.values():
        if type(value) is list:
            items = value
        elif type(value) is dict:
            items = [value]
        else:
            continue
        for item in items:
            if type(item) is not dict:
                return False
            for inner in item.values():
                if type(inner) in _SCALARS:
                    continue
                if type(inner) is not dict or any(type(v) not in _SCALARS for v in inner.values()):
                    return False
    return True
