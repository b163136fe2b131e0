"""Checking an inbound Anthropic Messages request body, for the ``/v1/messages`` route.

The checks mirror the Messages API's for what the codec reads, and what they accept is read
from the installed ``anthropic`` SDK's request types (its ``MessageParam`` and
``BetaMessageParam`` unions and the block types in them), so that a role, block or field
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

from collections.abc import Iterable, Mapping
from os import PathLike
from typing import IO, Any, Final, Literal, Required, Union, get_args, get_origin, get_type_hints

import anthropic.types as sdk
import anthropic.types.beta as beta
import orjson
from typing_extensions import is_typeddict

from gateway.codecs.chat_anthropic import OPENAI_PARTS
from gateway.codecs.json_body import json_object, shown, type_error
from gateway.errors import InvalidRequest

__all__ = ["ROLES", "THINKING_KINDS", "TURN_BLOCKS", "checked_body"]

_Fields = tuple[tuple[str, type], ...]


def _union(annotation: Any) -> tuple[Any, ...]:
    """The members of a union (an ``Iterable[...]``'s items, ``Optional`` unwrapped)."""
    origin = get_origin(annotation)
    if origin is Union:
        return tuple(m for arg in get_args(annotation) for m in _union(arg))
    if (
        origin is not None
        and origin is not Literal
        and issubclass(origin, Iterable)
        and not (issubclass(origin, Mapping))
    ):
        return tuple(m for arg in get_args(annotation) for m in _union(arg))
    return (annotation,)


def _runtime_type(annotation: Any) -> type | None:
    """The JSON type a field annotated ``annotation`` must have: ``str`` for strings and
    string literals, ``dict`` for objects (a ``TypedDict``, a ``Dict``, a union of them),
    ``bool``; ``None`` for anything else (not checked here)."""
    origin = get_origin(annotation)
    if annotation is str or (
        origin is Literal and all(isinstance(a, str) for a in get_args(annotation))
    ):
        return str
    if annotation is bool:
        return bool
    # Files the SDK would read and send as base64 are strings on the wire.
    members = (
        [m for m in _union(annotation) if not _is_file(m)] if origin is Union else [annotation]
    )
    if members == [str]:
        return str
    if members and all(_is_object(m) for m in members):
        return dict
    return None


def _is_file(annotation: Any) -> bool:
    return get_origin(annotation) is IO or annotation is PathLike


def _is_object(annotation: Any) -> bool:
    origin = get_origin(annotation) or annotation
    return isinstance(origin, type) and (issubclass(origin, dict) or issubclass(origin, Mapping))


def _required(typed: Any) -> dict[str, Any]:
    """The fields ``typed`` (an SDK ``TypedDict``) requires, with their annotations."""
    hints = get_type_hints(typed, include_extras=True)
    return {name: get_args(hint)[0] for name, hint in hints.items() if get_origin(hint) is Required}


def _kind(typed: Any) -> str | None:
    """The ``type`` literal of a block ``TypedDict``, if it has one."""
    hint = get_type_hints(typed).get("type")
    values = get_args(hint) if get_origin(hint) is Literal else ()
    return values[0] if len(values) == 1 and isinstance(values[0], str) else None


def _fields(typed: Any) -> _Fields:
    """The required fields of ``typed`` whose JSON type can be told, but ``type``."""
    found = ((name, _runtime_type(hint)) for name, hint in _required(typed).items())
    return tuple((name, kind) for name, kind in found if kind is not None and name != "type")


def _roles(*unions: Any) -> frozenset[str]:
    roles: set[str] = set()
    for union in unions:
        for member in get_args(union):
            roles.update(get_args(get_type_hints(member)["role"]))
    return frozenset(roles)


def _blocks(*annotations: Any) -> dict[str, Any]:
    """Block kind -> its ``TypedDict``, for the block types in ``annotations`` (content
    unions)."""
    found: dict[str, Any] = {}
    for annotation in annotations:
        for member in _union(annotation):
            kind = _kind(member) if is_typeddict(member) else None
            if kind is not None:
                found.setdefault(kind, member)
    return found


ROLES: Final = _roles(sdk.MessageParam, beta.BetaMessageParam)
"""The roles of ``messages`` the installed SDK knows."""
_CONVERTED: Final = ("text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking")
"""The block kinds the codec converts, whose fields are checked."""
_CONTENT: Final = _blocks(
    get_type_hints(sdk.UserMessageParam)["content"],
    get_type_hints(beta.BetaUserMessageParam)["content"],
)
_BLOCK_FIELDS: Final[dict[str, _Fields]] = {
    kind: _fields(_CONTENT[kind]) for kind in _CONVERTED if kind in _CONTENT
}
"""The fields the SDK requires of a block of each kind the codec converts, with their
types (other fields, and other kinds of block, are the API's to check)."""
_SOURCE_FIELDS: Final[dict[Any, _Fields]] = {
    _kind(source): _fields(source)
    for source in _union(_required(sdk.ImageBlockParam)["source"])
    if _kind(source) in ("base64", "url")
}
_SYSTEM_BLOCKS: Final = frozenset(
    _blocks(
        get_type_hints(sdk.message_create_params.MessageCreateParamsBase)["system"],
        get_type_hints(beta.message_create_params.MessageCreateParamsBase)["system"],
    )
)
"""The block kinds the top-level ``system`` takes."""
TURN_BLOCKS: Final[dict[str, _Fields]] = {
    kind: _fields(typed)
    for kind, typed in _blocks(
        get_type_hints(sdk.SystemMessageParam)["content"],
        get_type_hints(beta.BetaSystemMessageParam)["content"],
    ).items()
}
"""The block kinds a mid-conversation system message takes, with their required fields."""
THINKING_KINDS: Final = frozenset(
    _blocks(
        get_type_hints(sdk.message_create_params.MessageCreateParamsBase)["thinking"],
        get_type_hints(beta.message_create_params.MessageCreateParamsBase)["thinking"],
    )
)
"""The kinds of ``thinking`` setting the SDK knows (``enabled``, ``disabled``, ``adaptive``)."""
_CUSTOM_TOOL: Final[_Fields] = _fields(sdk.ToolParam)
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
        if block["type"] not in _SYSTEM_BLOCKS:
            kinds = ", ".join(repr(kind) for kind in sorted(_SYSTEM_BLOCKS))
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
            _check_fields(tool, f"tools.{index}", _CUSTOM_TOOL)


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
    _check_fields(block, param, _BLOCK_FIELDS.get(kind, ()))
    if kind == "image":
        source = block["source"]
        kind = source.get("type")
        if kind is not None:  # an object or array here is unhashable: refused, not looked up
            _check_fields(source, f"{param}.source", (("type", str),))
        _check_fields(source, f"{param}.source", _SOURCE_FIELDS.get(kind, ()))
    elif kind == "tool_result":
        if block.get("content") is not None:
            _check_content(block["content"], f"{param}.content")
        if block.get("is_error") is not None:
            _check_fields(block, param, (("is_error", bool),))


def _check_fields(value: dict[str, Any], param: str, fields: _Fields) -> None:
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
