"""OpenAI chat messages -> the Anthropic Messages API's system prompt and turns, for
requests to Claude (``chat_anthropic.request``), and where a message's cache marker lands.
No I/O.

- user content: text parts -> text blocks (every key kept); ``image_url`` parts -> image
  blocks (a data URL becomes a base64 source, any other URL a url source); ``file`` parts
  whose ``file_data`` is a base64 data URL -> document blocks (a PDF as a base64 source,
  plain text as a text source; the ``filename`` as the ``title``); a part of a type
  OpenAI does not have (``document``, ``search_result``, ... as the inbound
  ``/v1/messages`` codec carries them) is an Anthropic block already and goes as it is;
  ``refusal`` parts (an assistant's own earlier refusal) -> text blocks. What Claude cannot
  be given (``input_audio``, a ``file`` by OpenAI Files API ``file_id`` or of another
  media type) is a 400 ``unsupported_content`` naming the part (``messages[i].content[j]``),
  never left out: the model would answer without it and the client would not know. Tool
  results and the media restored by ``context_restore`` go through the same conversion.
- assistant: ``thinking_blocks`` (``thinking`` with its signature, ``redacted_thinking``
  with its data) first, as they came (less the ``index`` of a streamed entry), then the
  content's blocks, then each tool call as a
  ``tool_use`` block whose ``input`` is the parsed arguments (a call's ``cache_control``,
  ``caller`` and ``toolset_name`` kept on it).
- a tool message's content -> its ``tool_result``'s ``content`` (a string as it is,
  parts as blocks); a marker inside the content, where the API takes none, marks the
  ``tool_result``.
- a message-level ``cache_control`` (LiteLLM's convention, and the ``cache_markers``
  stage's) goes on the last block the message becomes that can carry one (not a thinking
  block): a tool message's ``tool_result``, an assistant's last ``tool_use`` if any.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson

from gateway.errors import InvalidRequest
from pipelines.cache_break import without_markers
from pipelines.messages import SYSTEM_TURN, is_system_turn

__all__ = [
    "OPENAI_PARTS",
    "TOOL_RESULT_KEYS",
    "TOOL_USE_KEYS",
    "assistant_blocks",
    "content_blocks",
    "image_block",
    "marked",
    "result_content",
    "text_blocks",
    "turns_of",
]

OPENAI_PARTS: Final = frozenset({"text", "image_url", "input_audio", "file", "refusal"})
"""The chat format's content part types; a part of another type is an Anthropic block."""

TOOL_USE_KEYS: Final = ("cache_control", "caller", "toolset_name")
"""Keys of a ``tool_use`` block that its tool call carries as they are."""

TOOL_RESULT_KEYS: Final = ("is_error", "toolset_name")
"""Keys of a ``tool_result`` block that its tool message carries as they are (its
``cache_control`` is the message-level marker)."""

_DATA_URL: Final = re.compile(
    r"data:(?P<type>[\w.+-]+/[\w.+-]+)(?:;[\w.+-]+=[^;,]*)*;base64,(?P<data>.*)", re.S
)
"""A base64 data URL, its parameters (``charset=utf-8``, ``name=...``) skipped."""


def turns_of(
    messages: Sequence[Mapping[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The system prompt's blocks and the turns of the Messages API's ``messages`` for chat
    ``messages``: consecutive messages of one role joined in a turn, a system turn of the
    history in its place, empty turns (an assistant answer that was empty, a user message
    of parts it cannot carry; the API refuses them) left out."""
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        role = message.get("role")
        where = f"messages[{index}].content"
        if is_system_turn(message):
            turns.append(_system_turn(message))
        elif role in ("system", "developer"):
            system.extend(marked(text_blocks(message.get("content")), message))
        elif role == "tool":
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": message.get("tool_call_id"),
            }
            if message.get("content") is not None:
                block.update(result_content(message["content"], where))
            block.update({key: message[key] for key in TOOL_RESULT_KEYS if key in message})
            _append(turns, "user", marked([block], message))
        elif role == "assistant":
            _append(turns, "assistant", marked(assistant_blocks(message, where), message))
        else:
            _append(turns, "user", marked(content_blocks(message.get("content"), where), message))
    return system, _joined([t for t in turns if t["role"] == "system" or t["content"]])


def marked(blocks: list[dict[str, Any]], message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``blocks`` with ``message``'s message-level ``cache_control``, if any, on the last
    block that can carry one."""
    if "cache_control" in message:
        for index in range(len(blocks) - 1, -1, -1):
            if blocks[index].get("type") not in ("thinking", "redacted_thinking"):
                blocks[index] = {**blocks[index], "cache_control": message["cache_control"]}
                break
    return blocks


def text_blocks(content: Any) -> list[dict[str, Any]]:
    """The text blocks of ``content`` (a system message's, or one text part): its
    non-empty text, every key of a part kept."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return [
        dict(part)
        for part in content or ()
        if isinstance(part, Mapping) and part.get("type") == "text" and part.get("text")
    ]


def content_blocks(content: Any, where: str) -> list[dict[str, Any]]:
    """The blocks for a message's ``content`` (found at ``where``, for errors)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks: list[dict[str, Any]] = []
    for index, part in enumerate(content or ()):
        if not isinstance(part, Mapping):
            continue
        kind = part.get("type")
        if kind == "image_url":
            blocks.append(image_block(part))
        elif kind == "text":
            blocks.extend(text_blocks([part]))
        elif kind == "file":
            blocks.append(_document_block(part, where=f"{where}[{index}]"))
        elif kind == "refusal":
            refusal = part.get("refusal")
            if isinstance(refusal, str) and refusal:
                blocks.append({"type": "text", "text": refusal})
        elif kind not in OPENAI_PARTS:
            blocks.append(dict(part))
        else:
            raise _unsupported(f"{where}[{index}]", f"Claude does not take {kind} parts")
    return blocks


def image_block(part: Mapping[str, Any]) -> dict[str, Any]:
    """The image block for OpenAI ``image_url`` part ``part``."""
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, Mapping) else image
    url = url if isinstance(url, str) else ""
    found = _DATA_URL.fullmatch(url)
    if found is not None:
        source = {"type": "base64", "media_type": found["type"], "data": found["data"]}
    else:
        source = {"type": "url", "url": url}
    block: dict[str, Any] = {"type": "image", "source": source}
    if "cache_control" in part:
        block["cache_control"] = part["cache_control"]
    return block


def _document_block(part: Mapping[str, Any], *, where: str) -> dict[str, Any]:
    """The document block for OpenAI ``file`` part ``part`` (found at ``where``): a PDF
    data URL as a base64 source, a plain-text one as a text source. ``InvalidRequest``
    for a file Claude cannot be given so: one named by a Files API ``file_id`` (OpenAI's
    ids mean nothing to Anthropic), or of another media type."""
    file = part.get("file")
    file = file if isinstance(file, Mapping) else {}
    data = file.get("file_data")
    found = _DATA_URL.fullmatch(data) if isinstance(data, str) else None
    if found is None:
        raise _unsupported(
            where,
            "Claude takes a file as its content, a base64 data URL in file.file_data"
            " (data:application/pdf;base64,...), not by an uploaded file's file_id",
        )
    media_type = found["type"].lower()
    source: dict[str, Any]
    if media_type == "application/pdf":
        source = {"type": "base64", "media_type": media_type, "data": found["data"]}
    elif media_type == "text/plain":
        source = {"type": "text", "media_type": media_type, "data": _text_of(found["data"], where)}
    else:
        raise _unsupported(where, f"Claude reads PDF and plain-text files, not {media_type}")
    block: dict[str, Any] = {"type": "document", "source": source}
    filename = file.get("filename")
    if isinstance(filename, str) and filename:
        block["title"] = filename
    if "cache_control" in part:
        block["cache_control"] = part["cache_control"]
    return block


def _text_of(data: str, where: str) -> str:
    try:
        return base64.b64decode(data, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise InvalidRequest(
            f"{where}: the file's data is not base64 of UTF-8 text.",
            code="invalid_value",
            param=where,
        ) from exc


def _unsupported(where: str, why: str) -> InvalidRequest:
    return InvalidRequest(f"{where}: {why}.", code="unsupported_content", param=where)


def result_content(content: Any, where: str) -> dict[str, Any]:
    """A ``tool_result``'s ``content``, and its ``cache_control``: the API takes none
    inside the content (``invalid_cache``), so the last marker there marks the result."""
    if isinstance(content, str):
        return {"content": content}
    blocks = content_blocks(content, where)
    marker = _last_marker(blocks)
    if marker is None:
        return {"content": blocks}
    return {"content": without_markers(blocks), "cache_control": marker}


def _last_marker(value: Any) -> Any:
    """The last ``cache_control`` in ``value`` in prompt order (a block's own after those
    of the blocks nested in it), or ``None``."""
    found = None
    if isinstance(value, list):
        for item in value:
            found = _last_marker(item) or found
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if key != "cache_control":
                found = _last_marker(item) or found
        found = value.get("cache_control") or found
    return found


def assistant_blocks(message: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    """The blocks for assistant message ``message`` (its content found at ``where``):
    its thinking blocks, its content's, then its tool calls; ``InvalidRequest`` for a
    call whose arguments are not a JSON object."""
    blocks = [
        _thinking_block(b) for b in message.get("thinking_blocks") or () if isinstance(b, Mapping)
    ]
    blocks.extend(content_blocks(message.get("content"), where))
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        arguments = function.get("arguments") or "{}"
        try:
            parsed = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict):
            raise InvalidRequest(
                f"tool call {call.get('id')} has arguments that are not a JSON object",
                param="messages",
            )
        block = {
            "type": "tool_use",
            "id": call.get("id"),
            "name": function.get("name"),
            "input": parsed,
        }
        block.update({key: call[key] for key in TOOL_USE_KEYS if key in call})
        blocks.append(block)
    return blocks


def _thinking_block(block: Mapping[str, Any]) -> dict[str, Any]:
    """A ``thinking_blocks`` entry as the Messages API takes it back: without the
    ``index`` that streamed entries carry (``ChunkTranslator``)."""
    return {key: value for key, value in block.items() if key != "index"}


def _append(turns: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    """Add ``blocks`` as a turn of ``role``, joining the previous turn when it has the same
    role (tool results and the user message after them make one user turn)."""
    if turns and turns[-1]["role"] == role:
        turns[-1]["content"].extend(blocks)
    else:
        turns.append({"role": role, "content": list(blocks)})


def _system_turn(message: Mapping[str, Any]) -> dict[str, Any]:
    """A system message that is a turn of the history, as the ``role: "system"`` entry of
    ``messages`` it came as: its content as it is (a message-level marker on its last
    block), its other keys (``clear_at``, ``output_config``) kept. Never joined with a
    neighbour."""
    turn = {
        key: value
        for key, value in message.items()
        if key not in (SYSTEM_TURN, "cache_control", "name")
    }
    turn["role"] = "system"
    if "cache_control" in message:
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        turn["content"] = marked([dict(b) for b in blocks or ()], message)
    return turn


def _joined(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for turn in turns:
        if out and out[-1]["role"] == turn["role"] and turn["role"] != "system":
            out[-1]["content"].extend(turn["content"])
        else:
            out.append(turn)
    return out
