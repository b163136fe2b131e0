"""The ``Restorer``: answers one request's restore calls from the store.

Each call is answered in the caller's namespace with a tool message of at most the round's
share of ``RESTORE_TOKENS`` (and of what is left of the request's input budget): a larger
object, or range, is cut at a line boundary (a single line too long on its own, at a
character) and the answer says which lines came and how to ask for the next ones. A stored
media part (an image, a document) comes back as itself, in a user message after the
round's tool messages, since a tool message can only hold text. ``RestoreStats`` counts
what the loop did for the ``x-contextgate-restore`` header.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from gateway.store import REF_PATTERN
from pipelines import OffloadStore, StoreError, TokenCounter
from pipelines.stages.media import MEDIA_PARTS

__all__ = ["RESTORE_TOKENS", "RestoreStats", "Restorer"]

RESTORE_TOKENS: Final = 2_000
"""Largest restore round, in tokens (shared by the round's calls)."""
_MIN_ANSWER: Final = 200


@dataclass(slots=True)
class RestoreStats:
    """What the restore loop did for one request."""

    rounds: int = 0
    calls: int = 0
    mixed: int = 0
    """Answers that mixed client tool calls with restore calls (restore calls dropped)."""
    exhausted: bool = False
    """The model still asked to restore after ``MAX_ROUNDS`` rounds."""

    def header(self) -> str:
        parts = [f"rounds={self.rounds}", f"calls={self.calls}"]
        if self.mixed:
            parts.append(f"mixed={self.mixed}")
        if self.exhausted:
            parts.append("exhausted")
        return ", ".join(parts)


@dataclass(slots=True)
class Restorer:
    """Answers restore calls for one request."""

    store: OffloadStore
    namespace: str
    counter: TokenCounter
    stats: RestoreStats = field(default_factory=RestoreStats)
    room: int | None = None
    """Tokens the restore answers of this request may add in all (the input budget less
    what was sent); ``None``: only the per-round cap applies."""
    _media: list[dict[str, Any]] = field(default_factory=list)

    async def answer(self, call: Mapping[str, Any], budget: int = RESTORE_TOKENS) -> dict[str, Any]:
        """The tool message answering one restore call, in at most ``budget`` tokens."""
        self.stats.calls += 1
        return {
            "role": "tool",
            "tool_call_id": call.get("id"),
            "content": await self._content(_arguments(call), max(budget, _MIN_ANSWER)),
        }

    async def answer_all(self, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The messages answering ``calls``, which share this round's budget: a tool
        message each, then, if any restored object was an image (or other media part),
        one user message carrying them, since a tool message can only hold text."""
        round_budget = min(RESTORE_TOKENS, self.room) if self.room is not None else RESTORE_TOKENS
        each = round_budget // max(1, len(calls))
        messages = [await self.answer(call, each) for call in calls]
        if self.room is not None:
            self.room -= sum(self.counter.count_message(m) for m in messages)
        if self._media:
            parts: list[dict[str, Any]] = [
                {"type": "text", "text": "[Restored media, as requested with context_restore.]"}
            ]
            parts.extend(self._media)
            messages.append({"role": "user", "content": parts})
            self._media = []
        return messages

    async def _content(self, arguments: str, budget: int) -> str:
        wanted = _wanted(arguments)
        if isinstance(wanted, str):
            return wanted
        ref = wanted.ref
        try:
            content = await self.store.get(self.namespace, ref)
        except StoreError:
            return f"context_restore: the store is unavailable right now; {ref} cannot be read."
        if content is None:
            return f"context_restore: nothing is stored as {ref} (it may have expired)."
        media = _media_part(content)
        if media is not None:
            self._media.append(media)
            return f"[{ref} is a {media['type']} part; it follows in the next message.]"
        return _read(wanted, content, budget, self.counter)


@dataclass(frozen=True, slots=True)
class _Wanted:
    """What one restore call asks for: a ref, and where to start and end reading."""

    ref: str
    start: int | None
    end: int | None
    char: int | None


def _wanted(arguments: str) -> _Wanted | str:
    """The call's arguments, or the answer that says what is wrong with them."""
    try:
        args = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return 'context_restore: the arguments are not valid JSON; pass {"ref": "ctx_..."}.'
    ref = args.get("ref") if isinstance(args, dict) else None
    if not isinstance(ref, str) or not REF_PATTERN.fullmatch(ref.strip()):
        return 'context_restore: pass the ref named in a placeholder, e.g. {"ref": "ctx_..."}.'
    start, end, char = args.get("start_line"), args.get("end_line"), args.get("start_char")
    if not all(v is None or (type(v) is int and v >= 1) for v in (start, end, char)):
        return "context_restore: start_line, end_line and start_char must be whole numbers from 1."
    return _Wanted(ref.strip(), start, end, char)


def _read(wanted: _Wanted, content: bytes, budget: int, counter: TokenCounter) -> str:
    """The lines of ``content`` that ``wanted`` names, as many as ``budget`` tokens hold,
    headed by which came and how to ask for the next ones (a whole object comes bare)."""
    ref = wanted.ref
    # Lines as the objects route counts them (bytes.splitlines).
    lines = [line.decode("utf-8", "replace") for line in content.splitlines(keepends=True)]
    first = wanted.start or 1
    last = min(wanted.end or len(lines), len(lines))
    if first > len(lines) or first > last:
        return (
            f"context_restore: {ref} has {len(lines)} lines; lines {first}-{wanted.end or first}"
            " are not in it."
        )
    shown: list[str] = []
    used = 0
    offset = (wanted.char or 1) - 1
    for number in range(first, last + 1):
        line = lines[number - 1][offset:] if number == first else lines[number - 1]
        tokens = counter.count_text(line)
        if used + tokens <= budget:
            shown.append(line)
            used += tokens
            continue
        if shown:
            break
        # One line over the budget on its own: a piece of it, and where to go on.
        piece = _fitting(line, budget, counter)
        cut_at = offset + len(piece) + 1
        return (
            f"[{ref}: line {number} of {len(lines)}, characters {offset + 1}-{cut_at - 1}"
            f" of {len(lines[number - 1])}. Call again with start_line={number},"
            f" start_char={cut_at} for more.]\n{piece}"
        )
    through = first + len(shown) - 1
    if first == 1 and not offset and through == len(lines):
        return "".join(shown)
    more = f" Call again with start_line={through + 1} for more." if through < len(lines) else ""
    part = f", from character {offset + 1}" if offset else ""
    return f"[{ref}: lines {first}-{through} of {len(lines)}{part}.{more}]\n" + "".join(shown)


def _fitting(text: str, budget: int, counter: TokenCounter) -> str:
    """The longest head of ``text`` within ``budget`` tokens (a few halvings at most)."""
    size = min(len(text), budget * 4)
    while size > 1 and counter.count_text(text[:size]) > budget:
        size = size * budget // max(counter.count_text(text[:size]), 1) * 9 // 10 or size // 2
    return text[:size]


_PART_KEYS: Final = frozenset(
    {"type", "source", "file", "title", "context", "citations", "cache_control"}
)
"""Keys a stored media part may have besides its type-named payload (those of Anthropic's
image and document blocks, and a marker)."""
_PAYLOADS: Final = ("source", "file")
"""Keys that hold a part's payload whatever its type."""


def _media_part(content: bytes) -> dict[str, Any] | None:
    """The media part stored in ``content`` (the media stage stores each part's JSON), or
    ``None`` for anything else.

    A part is an object of a media type (``MEDIA_PARTS``) with its payload, in the form the
    request carried it: OpenAI's under a key named after the type (``image_url``,
    ``input_audio``, ``file``), Anthropic's under ``source`` (``image``, ``document``
    blocks), or a ``file`` object; and with no key a content part lacks, so that a tool's
    JSON output that merely has such a ``type`` comes back as the text it is."""
    # "type" is looked for anywhere: a part's keys may come in any order, the payload first.
    if not content.startswith(b"{") or b'"type"' not in content:
        return None
    try:
        part = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    kind = part.get("type") if isinstance(part, dict) else None
    if kind not in MEDIA_PARTS or not set(part) <= _PART_KEYS | {kind}:
        return None
    if isinstance(part.get(kind), dict | str) or any(
        isinstance(part.get(k), dict) for k in _PAYLOADS
    ):
        return part  # type: ignore[no-any-return]
    return None


def _arguments(call: Mapping[str, Any]) -> str:
    function = call.get("function")
    arguments = function.get("arguments") if isinstance(function, Mapping) else None
    return arguments if isinstance(arguments, str) else ""
