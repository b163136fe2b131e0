"""A Messages request's system prompt and turns -> the chat messages the pipeline works on,
for ``messages.request.from_request``. No I/O.

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

The way back is ``chat_anthropic``'s (``to_messages``), whose conversion of each part
(``image_block``) decides which images become ``image_url`` parts here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson

from gateway.codecs.chat_anthropic import TOOL_RESULT_KEYS, TOOL_USE_KEYS, image_block
from pipelines.messages import SYSTEM_TURN

__all__ = ["chat_messages"]

_THINKING: Final = frozenset({"thinking", "redacted_thinking"})


def chat_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The chat messages for Messages request ``body``: its system prompt, then its turns."""
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
