"""Checking an inbound Anthropic Messages request body, for the ``/v1/messages`` route.

The checks mirror the Messages API's for what the codec reads, and what they accept is read
from the installed ``anthropic`` SDK's request types (its ``MessageParam`` and
``BetaMessageParam`` unions and the block types in them, written out in ``sdk_tables.py``
by ``derive.py`` so that the SDK is not imported for them), so that a role, block or field
the SDK has learnt is not refused here: the body is a JSON object; ``model`` a non-empty
string; ``max_tokens`` an integer of at least 1 (required, as the API requires it);
``messages`` a non-empty array of turns of a role the SDK names (``user``, ``assistant``,
``system``: a mid-conversation system message) whose ``content`` is a string or an array
of blocks, each an object with a string ``type`` that is not an OpenAI part type
(``image_url``, ...; the API has no such blocks) and, for the kinds the codec converts,
the fields the SDK requires of them, of the right types; a system turn's blocks of the
kinds its type allows, and its ``content`` may be left out (``output_config`` alone);
``system`` a string or an array of blocks of the kinds the SDK allows there (text);
``tools`` an array of objects (a custom tool with what the SDK requires of one);
``stream`` a boolean; ``tool_choice`` an object (naming a tool by a string);
``temperature`` and ``top_p`` numbers; ``stop_sequences`` strings. Everything else is the
API's to check, and is forwarded untouched.

Errors are ``InvalidRequest`` with the codes of ``codecs/openai.py`` (``invalid_json``,
``invalid_body``, ``missing_required_parameter``, ``invalid_type``, ``invalid_value``,
``nesting_too_deep``) and an Anthropic-style ``param`` path, such as
``messages.2.content.0.input``.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from gateway.codecs.chat_anthropic import OPENAI_PARTS
from gateway.codecs.json_body import json_object, shown, type_error
from gateway.codecs.messages.sdk_tables import (
    BLOCK_FIELDS,
    CUSTOM_TOOL,
    ROLES,
    SOURCE_FIELDS,
    SYSTEM_BLOCKS,
    THINKING_KINDS,
    TURN_BLOCKS,
)
from gateway.errors import InvalidRequest

__all__ = ["ROLES", "THINKING_KINDS", "TURN_BLOCKS", "checked_body"]

_NAMES: Final[dict[type, str]] = {str: "a string", dict: "an object", bool: "a boolean"}
_MAX_NESTING: Final = 255


def checked_body(raw: bytes, *, counting: bool = False) -> dict[str, Any]:
    """The Messages request in ``raw``, or ``InvalidRequest`` naming what is wrong;
    ``counting``: a ``count_tokens`` request, which has no ``max_tokens``."""
    body = json_object(raw)
    # First: the checks below recurse into tool results.
    _check_nesting(body)
    _check_top_level(body, counting)
    _check_messages(body.get("messages"))
    _check_system(body.get("system"))
    _check_tools(body.get("tools"))
    return body


def _check_top_level(body: dict[str, Any], counting: bool) -> None:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise type_error("model", "a non-empty string", model)
    max_tokens = body.get("max_tokens")
    if not (counting and max_tokens is None):
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
            raise type_error("max_tokens", "an integer", max_tokens)
        if max_tokens < 1:
            raise _value_error("max_tokens", "an integer of at least 1", max_tokens)
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise type_error("stream", "a boolean", stream)
    for name in ("temperature", "top_p"):
        value = body.get(name)
        if value is not None and (not isinstance(value, int | float) or isinstance(value, bool)):
            raise type_error(name, "a number", value)
    stops = body.get("stop_sequences")
    if stops is not None and not (
        isinstance(stops, list) and all(isinstance(s, str) for s in stops)
    ):
        raise type_error("stop_sequences", "an array of strings", stops)
    choice = body.get("tool_choice")
    if choice is not None:
        if not isinstance(choice, dict):
            raise type_error("tool_choice", "an object", choice)
        _check_fields(choice, "tool_choice", (("type", str),))
        if choice["type"] == "tool":
            _check_fields(choice, "tool_choice", (("name", str),))


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list):
        raise type_error("messages", "an array of messages", messages)
    if not messages:
        raise _value_error("messages", "at least one message", messages)
    for index, turn in enumerate(messages):
        param = f"messages.{index}"
        if not isinstance(turn, dict):
            raise type_error(param, "an object", turn)
        role = turn.get("role")
        if not isinstance(role, str):
            raise type_error(f"{param}.role", "a string", role)
        if role not in ROLES:
            raise _value_error(f"{param}.role", f"one of {', '.join(sorted(ROLES))}", role)
        if role == "system":
            _check_system_turn(turn, param)
        else:
            _check_content(turn.get("content"), f"{param}.content")


def _check_system_turn(turn: dict[str, Any], param: str) -> None:
    """A mid-conversation system message: its content (which may be left out) a string or
    blocks of the kinds its type allows."""
    content = turn.get("content")
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise type_error(f"{param}.content", "a string or an array of content blocks", content)
    for index, block in enumerate(content):
        where = f"{param}.content.{index}"
        _check_block(block, where)
        kind = block["type"]
        if kind not in TURN_BLOCKS:
            raise _value_error(f"{where}.type", f"one of {', '.join(sorted(TURN_BLOCKS))}", kind)
        _check_fields(block, where, TURN_BLOCKS[kind])


def _check_system(system: Any) -> None:
    if system is None or isinstance(system, str):
        return
    if not isinstance(system, list):
        raise type_error("system", "a string or an array of text blocks", system)
    for index, block in enumerate(system):
        _check_block(block, f"system.{index}")
        if block["type"] not in SYSTEM_BLOCKS:
            kinds = ", ".join(repr(kind) for kind in sorted(SYSTEM_BLOCKS))
            raise _value_error(f"system.{index}.type", kinds, block["type"])


def _check_tools(tools: Any) -> None:
    if tools is None:
        return
    if not isinstance(tools, list):
        raise type_error("tools", "an array of tools", tools)
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise type_error(f"tools.{index}", "an object", tool)
        if tool.get("type", "custom") == "custom":
            _check_fields(tool, f"tools.{index}", CUSTOM_TOOL)


def _check_content(content: Any, param: str) -> None:
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise type_error(param, "a string or an array of content blocks", content)
    for index, block in enumerate(content):
        _check_block(block, f"{param}.{index}")


def _check_block(block: Any, param: str) -> None:
    if not isinstance(block, dict):
        raise type_error(param, "an object", block)
    _check_fields(block, param, (("type", str),))
    kind = block["type"]
    if kind in OPENAI_PARTS and kind != "text":
        # The chat form tells OpenAI parts from Anthropic blocks by their type.
        raise _value_error(f"{param}.type", "a Messages content block type", kind)
    _check_fields(block, param, BLOCK_FIELDS.get(kind, ()))
    if kind == "image":
        source = block["source"]
        kind = source.get("type")
        if kind is not None:  # an object or array here is unhashable: refused, not looked up
            _check_fields(source, f"{param}.source", (("type", str),))
        _check_fields(source, f"{param}.source", SOURCE_FIELDS.get(kind, ()))
    elif kind == "tool_result":
        if block.get("content") is not None:
            _check_content(block["content"], f"{param}.content")
        if block.get("is_error") is not None:
            _check_fields(block, param, (("is_error", bool),))


def _check_fields(value: dict[str, Any], param: str, fields: tuple[tuple[str, type], ...]) -> None:
    for name, kind in fields:
        if not isinstance(value.get(name), kind):
            raise type_error(f"{param}.{name}", _NAMES[kind], value.get(name))


def _check_nesting(body: dict[str, Any]) -> None:
    """Refuse a body nested too deeply to be written out again (orjson stops at 255
    levels, the parser at 1,024), with a level to spare: the chat form is a level deeper
    in places (a tool's ``function``)."""
    if not _too_deep(body, 1):
        return
    param = next((key for key, value in body.items() if _too_deep(value, 2)), None)
    if param == "messages" and isinstance(body["messages"], list):
        index = next(i for i, turn in enumerate(body["messages"]) if _too_deep(turn, 3))
        param = f"messages.{index}"
    raise InvalidRequest(
        f"The request is nested too deeply (over {_MAX_NESTING - 1} levels).",
        code="nesting_too_deep",
        param=param,
    )


def _too_deep(value: Any, depth: int) -> bool:
    """Whether ``value``, ``depth`` levels down, is deeper than orjson writes."""
    for _ in range(depth):
        value = [value]
    try:
        orjson.dumps(value)
    except orjson.JSONEncodeError:
        return True
    return False


def _value_error(param: str, expected: str, got: Any) -> InvalidRequest:
    return InvalidRequest(
        f"Invalid value for '{param}': expected {expected}, got {shown(got)}.",
        code="invalid_value",
        param=param,
    )
