"""Chat messages as the pipeline sees them: OpenAI Chat Completions message objects.

The pipeline works on plain dicts in the OpenAI chat format (the gateway's codecs translate
other wire formats to it). A message is never mutated in place: a stage that rewrites one
builds a new dict, so an unchanged message stays the very same object from stage to stage.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Final, Literal

import orjson

__all__ = [
    "CARRIED",
    "MEDIA_PART_TYPES",
    "SYSTEM_TURN",
    "Message",
    "PartKind",
    "is_system_turn",
    "iter_parts",
    "message_text",
]

Message = dict[str, Any]
"""One chat message: ``role``, ``content`` (a string, a list of parts, or null) and the
optional ``name``, ``tool_calls``, ``tool_call_id``, ``reasoning_content`` fields."""

CARRIED: Final = "carried"
"""The key under which a host carries data of its own with a message (the gateway's
Responses codec: the items the message came from). Stages copy it along with the message
and never read it; the token counter neither counts it nor keys its cache on it."""

SYSTEM_TURN: Final = "system_turn"
"""The key (``true``) of a system message that is a turn of the history rather than part
of the system prompt: an Anthropic ``role: "system"`` entry of ``messages`` (Claude
Code's mid-conversation instructions). Its place in the history matters: no wire hoists it
into the system prompt, and a new one at the end leaves the cached prefix as it was."""


def is_system_turn(message: Mapping[str, Any]) -> bool:
    """Whether ``message`` is a system turn (``SYSTEM_TURN``)."""
    return message.get(SYSTEM_TURN) is True


PartKind = Literal["text", "image", "media", "other"]

_IMAGE_PARTS = frozenset({"image_url", "image", "input_image", "image_generation_call"})
"""``image_generation_call`` is an OpenAI Responses item carried as a part: the image the
model made, which the model sees again as an image."""
_MEDIA_PARTS = frozenset(
    {"input_audio", "audio", "video", "video_url", "file", "input_file", "document"}
)
"""Non-image media; ``document`` is an Anthropic PDF (base64 or a URL), not text to count
(a plain-text document is read as the text it is)."""
_SCREENSHOT: Final = "computer_screenshot"
"""An OpenAI computer-use screenshot (a ``computer_call_output``): counted as an image, but
not media the image window may offload, since the call's output must be a screenshot."""
MEDIA_PART_TYPES = _IMAGE_PARTS | _MEDIA_PARTS
"""Every content-part type that carries media rather than text."""


def iter_parts(content: Any) -> Iterator[tuple[PartKind, str]]:
    """Yield ``(kind, text)`` for every part of a message's content.

    Text-bearing parts (and a plain-text document) give their text; image and other media
    parts give an empty string; a part of a type the pipeline does not know gives its
    JSON, so it is still counted.
    """
    if isinstance(content, str):
        yield "text", content
        return
    if not isinstance(content, list):
        return
    for part in content:
        if isinstance(part, str):
            yield "text", part
            continue
        if not isinstance(part, dict):
            continue
        part_type = part.get("type")
        if part_type in _IMAGE_PARTS or part_type == _SCREENSHOT:
            yield "image", ""
        elif part_type in _MEDIA_PARTS:
            text = _document_text(part) if part_type == "document" else None
            yield ("media", "") if text is None else ("text", text)
        elif part_type == "reasoning":
            yield "text", _reasoning_text(part)
        elif part_type == "compaction":
            # Its encrypted content is opaque (the token counter estimates it); an
            # Anthropic block's readable summary is text the model reads.
            summary = part.get("content")
            if isinstance(summary, str):
                yield "text", summary
        else:
            text = part.get("text", part.get("thinking", part.get("refusal")))
            if isinstance(text, str):
                yield "text", text
            else:
                yield "other", orjson.dumps(part).decode()


def _reasoning_text(part: dict[str, Any]) -> str:
    """The readable text of an OpenAI Responses ``reasoning`` item carried as a part: its
    summary and any plain reasoning text (its ``encrypted_content`` is opaque: the token
    counter estimates what it stands for)."""
    texts = [
        piece["text"]
        for key in ("summary", "content")
        for piece in (part[key] if isinstance(part.get(key), list) else ())
        if isinstance(piece, dict) and isinstance(piece.get("text"), str)
    ]
    return "\n".join(texts)


def _document_text(part: dict[str, Any]) -> str | None:
    """The text of an Anthropic ``document`` whose source is plain text; ``None`` for a
    PDF or a file."""
    source = part.get("source")
    if isinstance(source, dict) and source.get("type") == "text":
        data = source.get("data")
        return data if isinstance(data, str) else None
    return None


def message_text(message: Message) -> str:
    """The text parts of a message's content, joined by newlines."""
    return "\n".join(text for kind, text in iter_parts(message.get("content")) if kind == "text")


def original_bytes(message: Message) -> bytes:
    """A message's content as stored when offloaded: a string's UTF-8, else its JSON."""
    content = message["content"]
    return content.encode() if isinstance(content, str) else orjson.dumps(content)
