"""The pipeline's chat form of a Messages client's request -> the chat request an
OpenAI-compatible upstream takes (``openai_request``), for the inbound ``/v1/messages``
route when the model behind is not Claude. No I/O.

What only Anthropic understands stays behind (markers, citations, error flags, thinking
blocks, parts of non-OpenAI types, server tools, a function tool's Anthropic keys);
images in tool results move to a user message after them; a mid-conversation system
message becomes text in its place; a stream asks for its usage (``openai_request``'s
docstring has the whole of it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from gateway.codecs.chat_anthropic import OPENAI_PARTS, TOOL_RESULT_KEYS, TOOL_USE_KEYS
from pipelines.messages import is_system_turn

__all__ = ["openai_request"]

_ANTHROPIC_KEYS: Final = frozenset(
    {
        "cache_control",
        "citations",
        "thinking_blocks",
        "context_management",
        "compaction",
        *TOOL_USE_KEYS,
        *TOOL_RESULT_KEYS,
    }
)
"""Keys the chat form carries for Anthropic only, at any level."""

_USERS: Final = frozenset({"user", "tool"})


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
