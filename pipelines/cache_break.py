"""Cache-break detection: what breaks a conversation's cached prefix, and whether it broke.

A provider's prompt cache holds a conversation's prefix: the model, the system prompt, the
tool schemas and the history up to where it was cached. Anything that changes one of those
makes the next request pay for its whole prompt again. Two halves:

- **Predicting**, before the request goes out (the ``cache_markers`` stage): the
  conversation's record keeps ``Fingerprints`` of its previous request and a digest of
  the messages it sent; a request whose fingerprints differ, whose messages do not start
  with the ones that went up last time (a compaction rewrote them), or that comes after
  the cache's TTL expired is a break, and its cause is named by ``predicted_break`` in
  this order of precedence: ``model``, ``system``, ``tools``, ``compaction``, ``ttl``.
- **Observing**, after the answer (the gateway, with the usage the provider reported):
  ``observed_break`` says whether cache reads dropped by more than 5% and by at least
  2,000 tokens since the previous request.

``cache_control`` markers are not content: the provider's cache keys on content, so moving
a marker breaks nothing, and fingerprints are taken without them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import takewhile
from typing import Any, Final, Literal

import orjson

from pipelines.messages import Message, is_system_turn

__all__ = [
    "BREAK_CAUSES",
    "DROP_SHARE",
    "DROP_TOKENS",
    "HOUR_TTL",
    "BreakCause",
    "Fingerprints",
    "cache_ttl",
    "fingerprint",
    "fingerprint_bytes",
    "observed_break",
    "predicted_break",
    "without_markers",
]

BreakCause = Literal["model", "system", "tools", "compaction", "ttl"]
BREAK_CAUSES: Final[tuple[BreakCause, ...]] = ("model", "system", "tools", "compaction", "ttl")
"""The causes ``predicted_break`` names, in order of precedence."""
DROP_SHARE: Final = 0.05
DROP_TOKENS: Final = 2_000
"""An observed break: cache reads fell by more than this share and by at least this many
tokens (below either, the difference is noise: a shorter tail, a rounding of the
provider's cache blocks)."""
_SYSTEM_ROLES: Final = ("system", "developer")
HOUR_TTL: Final = 3_600
"""Seconds a ``ttl: "1h"`` cache entry lives."""


def without_markers(value: Any) -> Any:
    """``value`` (a message, a tool, a part) with every ``cache_control`` key removed, at any
    depth; the same object when it has none."""
    if isinstance(value, dict):
        changed = "cache_control" in value
        out = {}
        for key, item in value.items():
            if key == "cache_control":
                continue
            plain = without_markers(item)
            changed = changed or plain is not item
            out[key] = plain
        return out if changed else value
    if isinstance(value, list):
        items = [without_markers(item) for item in value]
        if any(a is not b for a, b in zip(items, value, strict=True)):
            return items
    return value


def cache_ttl(messages: Sequence[Message], ttl: int, automatic: Any = None) -> int:
    """Seconds the provider keeps the newest cache entry of a conversation whose family
    keeps entries ``ttl`` seconds: an hour when the client marked its newest message with
    ``ttl: "1h"``, or asked for 1-hour automatic caching (``automatic``, a top-level
    ``cache_control``, which marks the newest block) (no breakpoint is placed after it, so
    every entry the request reads or writes lives an hour), else ``ttl``."""
    hourly = isinstance(automatic, dict) and automatic.get("ttl") == "1h"
    if hourly or (messages and _hour_marked(messages[-1])):
        return max(ttl, HOUR_TTL)
    return ttl


def _hour_marked(value: Any) -> bool:
    if isinstance(value, dict):
        marker = value.get("cache_control")
        if isinstance(marker, dict) and marker.get("ttl") == "1h":
            return True
        return any(_hour_marked(item) for item in value.values() if isinstance(item, list | dict))
    if isinstance(value, list):
        return any(_hour_marked(item) for item in value)
    return False


def fingerprint(value: Any) -> str:
    """A short digest of ``value``'s content, markers excluded, stable across processes."""
    return fingerprint_bytes(value).hex()


def fingerprint_bytes(value: Any) -> bytes:
    """``fingerprint`` as its 8 bytes."""
    data = orjson.dumps(without_markers(value), option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(data, digest_size=8).digest()


@dataclass(slots=True)
class Fingerprints:
    """What a provider's prefix cache keys on besides the history. Never changed once
    made, but not frozen: made twice a request, and a frozen dataclass's ``__init__``
    costs four times a plain one's."""

    model: str
    """Of the model name."""
    system: str
    """Of the system and developer messages, in order: all of them where the API sends
    them apart, before the history (Anthropic's ``system``; a system turn of the history
    stays in it there too), else the leading ones (a later one is history, and one
    appended leaves the cached prefix as it was)."""
    tools: tuple[str, ...] | None
    """Of each tool schema, in order: a changed tool and a reordered list differ."""
    # Empty (or None) where a conversation's record was written before it kept them.

    @classmethod
    def of(
        cls,
        model: str,
        messages: Sequence[Message],
        tools: Sequence[Any] | None,
        *,
        hoisted: bool,
    ) -> Fingerprints:
        """The fingerprints of a request; ``hoisted``: its provider sends every system
        message apart, before the history."""
        if hoisted:
            system = [
                m for m in messages if m.get("role") in _SYSTEM_ROLES and not is_system_turn(m)
            ]
        else:
            system = list(takewhile(lambda m: m.get("role") in _SYSTEM_ROLES, messages))
        return cls(
            fingerprint(model), fingerprint(system), tuple(fingerprint(t) for t in tools or ())
        )


def predicted_break(
    before: Fingerprints | None,
    now: Fingerprints,
    *,
    compaction: bool,
    expired: bool,
) -> tuple[BreakCause, str | None] | None:
    """Why the cached prefix of the conversation's previous request (``before``, with
    ``None`` for fingerprints it did not record) is of no use to this one, and for tools
    how they changed (``order``, ``added``, ``removed``, ``changed``); ``None`` when it is.
    ``compaction``: the messages the previous request sent are not the start of this
    one's; ``expired``: the cache's TTL passed since the previous request."""
    if before is not None:
        if before.model and before.model != now.model:
            return "model", None
        if before.system and before.system != now.system:
            return "system", None
        if before.tools is not None and now.tools is not None and before.tools != now.tools:
            return "tools", _tools_change(before.tools, now.tools)
    if compaction:
        return "compaction", None
    if expired:
        return "ttl", None
    return None


def _tools_change(before: tuple[str, ...], now: tuple[str, ...]) -> str:
    if sorted(before) == sorted(now):
        return "order"
    if set(before) < set(now):
        return "added"
    if set(now) < set(before):
        return "removed"
    return "changed"


def observed_break(previous_cached_tokens: int | None, cached_tokens: int | None) -> bool:
    """Whether the provider's cache reads show a break: ``cached_tokens`` (this request's
    cache reads, as the provider reported them) fell from the conversation's previous
    request's by more than 5% and by at least 2,000 tokens. Unknown figures say nothing."""
    if previous_cached_tokens is None or cached_tokens is None:
        return False
    drop = previous_cached_tokens - cached_tokens
    return drop >= DROP_TOKENS and drop > DROP_SHARE * previous_cached_tokens
