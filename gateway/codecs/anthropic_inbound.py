"""Anthropic Messages requests <-> the OpenAI chat request the pipeline works on, for the
inbound ``/v1/messages`` route (Anthropic SDK clients, Claude-Code-style agents). No I/O.

``parse_request`` checks a body as the Messages API does and splits it with
``from_request`` into ``chat``, the OpenAI chat request the pipeline works on, and
``native``, the top-level fields the chat format has no exact place for, verbatim. After
the pipeline, ``to_request`` makes the Messages request for an Anthropic upstream
(``to_messages`` with ``native`` laid over it) and ``openai_request`` the chat request for
an OpenAI-compatible one. The answer side (``message_of``, ``EventTranslator``, errors)
lives in ``gateway.codecs.anthropic_answers`` and is re-exported here.

Messages -> chat:

- ``system`` -> one system message: a string, or its text blocks as text parts.
- a ``role: "system"`` turn (a mid-conversation system message) -> a system message in its
  place, marked as a turn of the history (``pipelines.messages.SYSTEM_TURN``), with its
  content (blocks as parts) and its other keys (``clear_at``, ``output_config``) as they
  came.
- user turn: each ``tool_result`` block -> a tool message (its content a string or parts;
  ``is_error`` and ``toolset_name`` kept; its ``cache_control`` as the message-level
  marker), then the turn's other blocks -> one user message (a string stays a string).
- blocks -> parts: text as it is (every key); an image with a base64 or url source ->
  ``image_url`` (a data URL, or the URL; ``cache_control`` kept); any other block, or an
  image the way back would not give again, as it is (a part of its own type).
- assistant turn: its leading ``thinking``/``redacted_thinking`` blocks ->
  ``thinking_blocks`` (their text joined as ``reasoning_content``); ``tool_use`` ->
  ``tool_calls`` (arguments the JSON of ``input``; ``cache_control``, ``caller``,
  ``toolset_name`` kept on the call); every other block -> content, in order (one plain
  text block -> a string; a thinking block after other blocks stays a part, in place).
- custom tools -> function tools, their other keys at the tool's top level; server tools
  (and any tool the way back would not give again) as they are. ``tools`` is kept in
  ``native`` too, as sent: the chat form keeps a tool's keys but not their order, and
  the way back gives each tool its keys in the client's order (below).
- ``max_tokens``, ``temperature``, ``top_p``, ``stream`` by name; ``stop_sequences`` ->
  ``stop`` and ``tool_choice`` -> its chat form (``disable_parallel_tool_use`` ->
  ``parallel_tool_calls: false``), ``cache_control`` (automatic caching, one of the
  four breakpoints the ``cache_markers`` stage counts) and ``context_management`` (the
  client's context editing, which the ``thinking`` stage reads) as they are, all four
  also kept in ``native``; every other field, and an empty ``system`` or ``tools``, ->
  ``native``.

So ``to_request`` gives back every valid request, in this canonical form: a string
``content`` or ``system`` is one text block (the API's documented shorthand); consecutive
turns of one role are one turn (the API joins them); an assistant turn's ``tool_use``
blocks come after its other blocks (the order Claude writes them in); a tool's
``"type": "custom"`` (the default) is left out. Each tool has its keys in the order the
client sent them, a key the gateway added (a cache marker) after them, so a tool the
gateway did not change is the client's bytes again: the provider's prompt cache and its
check of the thinking prefix compare them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from gateway.codecs.anthropic import (
    OPENAI_PARTS,
    TOOL_RESULT_KEYS,
    TOOL_USE_KEYS,
    anthropic_tool,
    image_block,
    to_messages,
)
from gateway.codecs.anthropic_answers import (
    EventTranslator,
    error_body,
    error_from_openai,
    error_type,
    message_of,
)
from gateway.codecs.anthropic_checks import checked_body
from pipelines.messages import SYSTEM_TURN, is_system_turn

__all__ = [
    "EventTranslator",
    "InboundRequest",
    "error_body",
    "error_from_openai",
    "error_type",
    "from_request",
    "message_of",
    "openai_request",
    "parse_request",
    "to_request",
]


@dataclass(frozen=True, slots=True)
class InboundRequest:
    """A Messages request as the pipeline sees it, plus what it does not need to see."""

    chat: dict[str, Any]
    """The OpenAI chat request the pipeline works on."""
    native: dict[str, Any]
    """Top-level Messages fields with no exact chat counterpart, verbatim."""


_BY_NAME: Final = ("max_tokens", "temperature", "top_p", "stream")
_REQUEST_FIRST: Final = ("system", "tools")
"""Fields the way back takes from ``native`` only when they are empty there and the chat
request gave none: ``native`` carries ``system`` only as the client sent it empty, and
``tools`` as the client sent them, for their key order (what the gateway added since,
the restore tool, stays)."""
_READ_FROM_NATIVE: Final = ("cache_control", "context_management")
"""``native`` fields the pipeline reads too: automatic caching (one of the four
breakpoints) and the client's context editing (``clear_thinking_20251015``)."""
_THINKING: Final = frozenset({"thinking", "redacted_thinking"})
_ANTHROPIC_KEYS: Final = frozenset(
    {
        "cache_control",
        "citations",
        "thinking_blocks",
        "context_management",
        *TOOL_USE_KEYS,
        *TOOL_RESULT_KEYS,
    }
)
"""Keys the chat form carries for Anthropic only, at any level."""
_USERS: Final = frozenset({"user", "tool"})


def parse_request(raw: bytes, *, counting: bool = False) -> InboundRequest:
    """The request in ``raw``, checked as the Messages API checks it (``InvalidRequest``
    otherwise, see ``anthropic_checks``; ``counting``: a ``count_tokens`` request, which
    has no ``max_tokens``), split for the pipeline."""
    return from_request(checked_body(raw, counting=counting))


def from_request(body: Mapping[str, Any]) -> InboundRequest:
    """``body``, a Messages request as ``parse_request`` accepts it, split for the pipeline."""
    chat: dict[str, Any] = {"model": body.get("model"), "messages": _messages(body)}
    native: dict[str, Any] = {}
    for key, value in body.items():
        if key in ("model", "messages") or (key == "system" and value):
            continue
        if key in _BY_NAME and value is not None:
            chat[key] = value
        elif key == "tools" and value:
            chat["tools"] = [_tool(tool) for tool in value]
            native["tools"] = value
        else:
            native[key] = value
            if key == "stop_sequences" and value:
                chat["stop"] = list(value)
            elif key in _READ_FROM_NATIVE and value:
                chat[key] = value
            elif key == "tool_choice":
                chat.update(_tool_choice(value))
    return InboundRequest(chat, native)


def to_request(
    chat: Mapping[str, Any], native: Mapping[str, Any], *, default_max_tokens: int
) -> dict[str, Any]:
    """The Messages request for an Anthropic upstream: ``chat`` as the pipeline left it,
    with the fields in ``native`` as the client sent them."""
    request = to_messages(chat, default_max_tokens=default_max_tokens)
    if native.get("tools") and request.get("tools"):
        request["tools"] = _in_client_order(request["tools"], native["tools"])
    request.update(
        {k: v for k, v in native.items() if k not in _REQUEST_FIRST or not (v or k in request)}
    )
    return request


def _in_client_order(tools: list[dict[str, Any]], sent: Sequence[Any]) -> list[dict[str, Any]]:
    """``tools`` with each one's keys in the order of the client's tool of its name in
    ``sent``, then the keys the gateway added to it; a tool the client did not send (the
    restore tool) as it is."""
    by_name: dict[str, Mapping[str, Any]] = {}
    for tool in sent:
        if isinstance(tool, Mapping) and isinstance(tool.get("name"), str):
            by_name.setdefault(tool["name"], tool)
    ordered = []
    for tool in tools:
        name = tool.get("name")
        client = by_name.get(name) if isinstance(name, str) else None
        if client is not None:
            tool = {**{key: tool[key] for key in client if key in tool}, **tool}
        ordered.append(tool)
    return ordered


def _messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        content = system if isinstance(system, str) else [dict(block) for block in system]
        messages.append({"role": "system", "content": content})
    for turn in body.get("messages") or ():
        role = turn.get("role")
        if role == "assistant":
            messages.append(_assistant(turn.get("content")))
        elif role == "system":
            messages.append(_system_turn(turn))
        else:
            messages.extend(_user(turn.get("content")))
    return messages


def _system_turn(turn: Mapping[str, Any]) -> dict[str, Any]:
    """A mid-conversation system message: a system message marked as a turn of the history
    (``SYSTEM_TURN``), its content as it came (text blocks as text parts, tool changes as
    parts of their own type) and its other keys (``clear_at``, ``output_config``) kept."""
    message = {key: value for key, value in turn.items() if key != "content"}
    message[SYSTEM_TURN] = True
    content = turn.get("content")
    if isinstance(content, list):
        message["content"] = [dict(block) for block in content]
    elif "content" in turn:
        message["content"] = content
    return message


def _user(content: Any) -> list[dict[str, Any]]:
    if not isinstance(content, list):
        return [{"role": "user", "content": content}]
    out = [_tool_message(block) for block in content if block.get("type") == "tool_result"]
    rest = [_part(block) for block in content if block.get("type") != "tool_result"]
    if rest or not out:
        out.append({"role": "user", "content": rest})
    return out


def _tool_message(block: Mapping[str, Any]) -> dict[str, Any]:
    content = block.get("content")
    message: dict[str, Any] = {
        "role": "tool",
        "tool_call_id": block.get("tool_use_id"),
        "content": [_part(b) for b in content] if isinstance(content, list) else content,
    }
    message.update(
        {key: block[key] for key in (*TOOL_RESULT_KEYS, "cache_control") if key in block}
    )
    return message


def _part(block: Mapping[str, Any]) -> dict[str, Any]:
    """The chat part for a user or tool-result block."""
    if block.get("type") == "image":
        part = _image_part(block)
        if part is not None and image_block(part) == block:
            return part
    return dict(block)


def _image_part(block: Mapping[str, Any]) -> dict[str, Any] | None:
    source = block.get("source")
    if not isinstance(source, Mapping):
        return None
    if source.get("type") == "url":
        url = source.get("url")
    elif source.get("type") == "base64":
        url = f"data:{source.get('media_type')};base64,{source.get('data')}"
    else:
        return None
    if not isinstance(url, str):
        return None
    part: dict[str, Any] = {"type": "image_url", "image_url": {"url": url}}
    if "cache_control" in block:
        part["cache_control"] = block["cache_control"]
    return part


def _assistant(content: Any) -> dict[str, Any]:
    if not isinstance(content, list):
        return {"role": "assistant", "content": content}
    thinking: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for block in content:
        kind = block.get("type")
        if kind in _THINKING and not parts and not calls:
            thinking.append(dict(block))
        elif kind == "tool_use":
            calls.append(_tool_call(block))
        else:
            parts.append(dict(block))
    message: dict[str, Any] = {"role": "assistant", "content": _assistant_content(parts)}
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message["thinking_blocks"] = thinking
        reasoning = "".join(b["thinking"] for b in thinking if isinstance(b.get("thinking"), str))
        if reasoning:
            message["reasoning_content"] = reasoning
    return message


def _assistant_content(parts: list[dict[str, Any]]) -> Any:
    if len(parts) == 1 and parts[0].keys() == {"type", "text"}:
        text = parts[0]["text"]
        if parts[0]["type"] == "text" and isinstance(text, str) and text:
            return text
    return parts or None


def _tool_call(block: Mapping[str, Any]) -> dict[str, Any]:
    call: dict[str, Any] = {
        "id": block.get("id"),
        "type": "function",
        "function": {
            "name": block.get("name"),
            "arguments": orjson.dumps(block.get("input")).decode(),
        },
    }
    call.update({key: block[key] for key in TOOL_USE_KEYS if key in block})
    return call


def _tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    """The chat tool for ``tool``: a function tool for a custom one, when the way back
    gives the same tool; else ``tool`` as it is."""
    if tool.get("type", "custom") != "custom":
        return dict(tool)
    custom = {key: value for key, value in tool.items() if key != "type"}
    function = {key: tool[key] for key in ("name", "description") if key in tool}
    function["parameters"] = tool.get("input_schema")
    extra = {k: v for k, v in custom.items() if k not in ("name", "description", "input_schema")}
    chat_tool = {"type": "function", "function": function, **extra}
    return chat_tool if anthropic_tool(chat_tool) == custom else dict(tool)


def _tool_choice(choice: Any) -> dict[str, Any]:
    """The chat ``tool_choice`` and ``parallel_tool_calls`` for a Messages ``tool_choice``."""
    if not isinstance(choice, Mapping):
        return {}
    out: dict[str, Any] = {}
    kind = choice.get("type")
    if kind in ("auto", "none"):
        out["tool_choice"] = kind
    elif kind == "any":
        out["tool_choice"] = "required"
    elif kind == "tool":
        out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    if choice.get("disable_parallel_tool_use") is True:
        out["parallel_tool_calls"] = False
    return out


def openai_request(chat: Mapping[str, Any]) -> dict[str, Any]:
    """``chat`` as an OpenAI-compatible upstream takes it: without what only Anthropic
    understands (``cache_control``, ``citations``, ``is_error``, thinking blocks, parts of
    non-OpenAI types such as documents and server-tool blocks, server tools, a function
    tool's Anthropic keys), images in tool results moved to a user message right after
    them (OpenAI takes images from users only), and usage asked for when streaming (the
    Messages stream ends with it). A content list left empty becomes ``""`` (``null`` for
    an assistant). A mid-conversation system message stays a system message in its place
    (OpenAI's chat API takes them anywhere) as text, with a line for each tool change in
    it; one the client asked to show only until the next user turn
    (``clear_at: "next_user_message"``) is left out once one follows, and one with no
    content (``output_config`` alone) is left out."""
    request = {
        key: value
        for key, value in chat.items()
        if key not in ("messages", "tools") and key not in _ANTHROPIC_KEYS
    }
    request["messages"] = _openai_messages(chat.get("messages") or ())
    tools = [
        {"type": "function", "function": tool.get("function")}
        for tool in chat.get("tools") or ()
        if tool.get("type") == "function"
    ]
    names = [(tool["function"] or {}).get("name") for tool in tools]
    choice = request.get("tool_choice")
    if tools:
        request["tools"] = tools
    if not tools or (
        isinstance(choice, Mapping) and (choice.get("function") or {}).get("name") not in names
    ):
        request.pop("tool_choice", None)
    if not tools:
        request.pop("parallel_tool_calls", None)
    if request.get("stream") is True:
        request.setdefault("stream_options", {"include_usage": True})
    return request


def _openai_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    media: list[dict[str, Any]] = []  # from the tool results just passed
    # On Anthropic's wire tool results are user turns too.
    last_user = max((i for i, m in enumerate(messages) if m.get("role") in _USERS), default=-1)
    for index, message in enumerate(messages):
        if media and message.get("role") != "tool":
            out.append({"role": "user", "content": media})
            media = []
        if is_system_turn(message):
            shown = index > last_user or message.get("clear_at") != "next_user_message"
            text = _system_turn_text(message.get("content")) if shown else ""
            if text:
                out.append({"role": "system", "content": text})
            continue
        converted = _openai_message(message)
        content = converted.get("content")
        if converted.get("role") == "tool" and isinstance(content, list):
            media.extend(part for part in content if part.get("type") != "text")
            converted["content"] = [part for part in content if part.get("type") == "text"] or ""
        out.append(converted)
    if media:
        out.append({"role": "user", "content": media})
    return out


def _system_turn_text(content: Any) -> str:
    """A mid-conversation system message as the text an OpenAI-compatible model is given
    in its place: its text, and a line for each tool it makes available or withdraws (the
    request's ``tools`` list them all on that wire)."""
    if not isinstance(content, list):
        return content if isinstance(content, str) else ""
    lines = []
    for block in content:
        kind = block.get("type")
        tool: Mapping[str, Any] = block["tool"] if isinstance(block.get("tool"), Mapping) else {}
        definition = tool.get("definition")
        definition = definition if isinstance(definition, Mapping) else {}
        name = tool.get("name") or definition.get("name") or tool.get("server_name")
        which = f"The tool {name}" if isinstance(name, str) and name else "A tool"
        if kind == "text" and block.get("text"):
            lines.append(str(block["text"]))
        elif kind == "tool_addition":
            lines.append(f"[{which} is available from here on.]")
        elif kind == "tool_removal":
            lines.append(f"[{which} is no longer available from here on.]")
    return "\n\n".join(lines)


def _openai_message(message: Mapping[str, Any]) -> dict[str, Any]:
    out = {key: value for key, value in message.items() if key not in _ANTHROPIC_KEYS}
    content = out.get("content")
    if isinstance(content, list):
        parts = [
            {key: value for key, value in part.items() if key not in _ANTHROPIC_KEYS}
            for part in content
            if isinstance(part, Mapping) and part.get("type") in OPENAI_PARTS
        ]
        out["content"] = parts or (None if out.get("role") == "assistant" else "")
    elif content is None and out.get("role") == "tool":
        out["content"] = ""
    if isinstance(out.get("tool_calls"), list):
        out["tool_calls"] = [
            {key: value for key, value in call.items() if key not in _ANTHROPIC_KEYS}
            for call in out["tool_calls"]
        ]
    return out
