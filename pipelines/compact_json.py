"""Compact JSON: a tool output that is a JSON object or array, without its insignificant
whitespace.

Tools print JSON with Python's default separators (``", "`` and ``": "``) or indented;
the spaces, newlines and indentation are tokens the model pays for on every turn and
that say nothing. ``JsonCompaction`` removes them and nothing else: the text is stripped
of whitespace *outside* string literals, so strings (spaces, escapes such as ``\\"`` and
``\\u00e9``, non-ASCII), numbers (``1.10``, ``1e5``, ``-0``), key order and duplicate keys
are kept as the client sent them, character for character. The result is checked by
parsing both texts and comparing the values; any doubt (not an object or array, invalid
JSON, a value orjson cannot read exactly, no saving) leaves the text as it is.

The same output comes back on every turn of a conversation and must compact to the same
bytes each time (the provider's prompt cache keys on them), so results are kept per text,
in a bounded cache (not for texts found not to be JSON within their first ``EARLY``
characters: a log line that opens with ``[`` is rejected again at once). What the client
sent is never lost: a stage that offloads a compacted output stores the message as
received (``StageContext.as_received``).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import Final

import orjson

__all__ = ["JsonCompaction", "compact_json"]

_OPENING: Final = re.compile(r"[ \t\n\r]*[\[{]")
"""What an object or array starts with."""
_TOKENS: Final = re.compile(r'("[^"\\]*(?:\\.[^"\\]*)*")|[ \t\n\r]+', re.DOTALL)
"""A JSON string literal (kept, group 1) or a run of JSON whitespace (dropped)."""

_UNSEEN: Final = ""
"""Not in the cache (no compact text is empty)."""

MAX_CHARS: Final = 4_000_000
"""Longer outputs are left alone: they are far over any ``filter-tokens`` and offloaded
whole anyway, and parsing them twice per new output is what a cap bounds."""


EARLY: Final = 1_024
"""Characters within which a text that is not JSON is found out (the parser stops at its
first error): such a text is rejected again as cheaply as a cache lookup, so the cache does
not keep it."""


def compact_json(text: str) -> str:
    """``text`` without insignificant whitespace when it is a JSON object or array
    (surrounding whitespace allowed) and that makes it strictly shorter; else ``text``
    itself (the same object)."""
    return _compacted(text)[0]


def _compacted(text: str) -> tuple[str, bool]:
    """``compact_json(text)``, and whether the answer is worth keeping: not when the text
    was found not to be JSON within its first ``EARLY`` characters."""
    if _OPENING.match(text) is None or len(text) > MAX_CHARS:
        return text, False
    try:
        value = orjson.loads(text)  # first: a text that is not JSON fails at once
    except orjson.JSONDecodeError as exc:
        return text, exc.pos > EARLY
    compact = _TOKENS.sub(r"\1", text)
    if len(compact) >= len(text):
        return text, True
    try:
        same = orjson.loads(compact) == value
    except orjson.JSONDecodeError:
        return text, True
    return (compact if same else text), True


class JsonCompaction:
    """``compact_json`` with its results kept for the ``entries`` most recently used texts,
    texts and results together at most ``chars`` characters.

    Kept by the text itself: the lookup hashes it, and Python caches a string's hash, which
    the token counter has taken already for the same request (a digest per output per
    request cost 0.4 ms on a warm 100K-token conversation); a found key is compared whole,
    so two texts can never share a result."""

    __slots__ = ("_chars", "_kept", "chars", "entries")

    def __init__(self, *, entries: int = 1_024, chars: int = 1_000_000) -> None:
        if entries < 1 or chars < 1:
            raise ValueError("entries and chars must be positive")
        self.entries, self.chars = entries, chars
        self._kept: OrderedDict[str, str | None] = OrderedDict()
        """Text -> its compact text, or ``None`` when it stays as it is."""
        self._chars = 0

    def __call__(self, text: str) -> str:
        """``compact_json(text)``, from the cache when this text was seen before."""
        if _OPENING.match(text) is None:
            return text  # the common cheap refusal, not worth keeping
        kept = self._kept.get(text, _UNSEEN)
        if kept is not _UNSEEN:
            self._kept.move_to_end(text)
            return text if kept is None else kept
        compact, keep = _compacted(text)
        if not keep:
            return compact
        found = None if compact is text else compact
        self._kept[text] = found
        self._chars += len(text) + (len(found) if found is not None else 0)
        while len(self._kept) > self.entries or self._chars > self.chars:
            dropped, result = self._kept.popitem(last=False)
            self._chars -= len(dropped) + (len(result) if result is not None else 0)
        return compact
