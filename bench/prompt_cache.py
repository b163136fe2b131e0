"""A model of Anthropic's prompt cache, for tests and benchmarks that replay traces.

    cache = PrefixCache(TokenCounter("o200k_base"))
    usage = cache.usage(messages_request, now=12.0)   # what the API would bill
    dollars = cost(usage)

The prompt is a sequence of block positions: each tool, each system block, each content
block of each message, in that order. Each position stands for the whole prefix up to it
(a hash of the blocks' content; ``cache_control`` is not content) and has a token count
(o200k over the block's JSON: a proxy for Claude's tokenizer, which is not public).

A block carrying ``cache_control`` (on itself or on a block nested in it, at any depth)
is a breakpoint (at most 4 per request, counting every marker, else
``TooManyBreakpoints``, as the API refuses it; a ``ttl: "1h"`` breakpoint after a 5-minute
one is refused too). At each breakpoint the cache is looked up at its position and up to
``lookback`` positions before it (the API checks about 20 blocks back); the read is the
longest prefix found over all breakpoints, and every hit has its lifetime renewed. An
entry is written at every breakpoint whose prefix has at least ``min_tokens`` tokens, and
lives ``ttl`` seconds (3,600 for a 1-hour marker) after its last write or read.

Billing, as the API reports it: ``cache_read_input_tokens`` up to the read point,
``cache_creation_input_tokens`` from there to the last breakpoint that was written,
``input_tokens`` the rest (all of it when nothing is marked).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Final

import orjson

from pipelines.cache_break import without_markers
from pipelines.tokens import TokenCounter

__all__ = ["PrefixCache", "TooManyBreakpoints", "cost"]

MAX_BREAKPOINTS: Final = 4
HOUR_TTL: Final = 3_600


class TooManyBreakpoints(ValueError):
    """The request has more ``cache_control`` markers than the API accepts."""


@dataclass(frozen=True, slots=True)
class Position:
    """One block of the prompt: the hash of the prefix that ends with it, its tokens and
    its ``cache_control`` marker, if any."""

    prefix: bytes
    tokens: int
    marker: Mapping[str, Any] | None


class PrefixCache:
    """The cache of one organisation's prompts, across requests and conversations."""

    __slots__ = ("_entries", "_tokens", "counter", "lookback", "min_tokens", "ttl")

    def __init__(
        self, counter: TokenCounter, *, ttl: int = 300, min_tokens: int = 1_024, lookback: int = 20
    ) -> None:
        self.counter = counter
        self.ttl, self.min_tokens, self.lookback = ttl, min_tokens, lookback
        self._entries: dict[bytes, tuple[float, int]] = {}
        """Prefix hash -> (expiry, lifetime)."""
        self._tokens: dict[bytes, int] = {}
        """Prefix hash -> tokens of the block that ends it: a replayed conversation sends the
        same blocks again with every request, and counting them again was most of a replay's
        time."""

    def positions(self, request: Mapping[str, Any]) -> list[Position]:
        """The request's blocks in the order the cache sees them."""
        out: list[Position] = []
        digest = hashlib.blake2b(str(request.get("model", "")).encode(), digest_size=16).digest()
        for kind, block in _blocks(request):
            plain = without_markers(block)
            data = orjson.dumps(plain, option=orjson.OPT_SORT_KEYS)
            digest = hashlib.blake2b(digest + kind.encode() + data, digest_size=16).digest()
            tokens = self._tokens.get(digest)
            if tokens is None:
                if len(self._tokens) >= 65_536:
                    self._tokens.clear()
                tokens = self._tokens[digest] = self.counter.count_text(data.decode())
            out.append(Position(digest, tokens, _marker(block)))
        return out

    def usage(self, request: Mapping[str, Any], now: float) -> dict[str, int]:
        """What the API would bill for ``request`` sent at ``now`` (seconds), updating the
        cache as the API would."""
        positions = self.positions(request)
        breakpoints = [i for i, p in enumerate(positions) if p.marker is not None]
        markers = [marker for _, block in _blocks(request) for marker in _markers(block)]
        if len(markers) > MAX_BREAKPOINTS:
            raise TooManyBreakpoints(
                f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided."
                f" Found {len(markers)}."
            )
        if any(a < b for a, b in pairwise(self._lifetime(m) for m in markers)):
            raise ValueError("a ttl='1h' cache_control must not come after a ttl='5m' one")
        lifetimes = [self._lifetime(positions[i].marker) for i in breakpoints]
        prefix: list[int] = []
        total = 0
        for position in positions:
            total += position.tokens
            prefix.append(total)
        read_at = -1
        for breakpoint in breakpoints:
            for index in range(breakpoint, max(-1, breakpoint - self.lookback - 1), -1):
                entry = self._entries.get(positions[index].prefix)
                if entry is not None and now < entry[0]:
                    self._entries[positions[index].prefix] = (now + entry[1], entry[1])
                    read_at = max(read_at, index)
                    break
        written = -1
        for breakpoint, lifetime in zip(breakpoints, lifetimes, strict=True):
            if prefix[breakpoint] >= self.min_tokens:
                key = positions[breakpoint].prefix
                expiry, kept = self._entries.get(key, (0.0, 0))
                if now >= expiry:
                    kept = 0
                self._entries[key] = (max(expiry, now + lifetime), max(kept, lifetime))
                written = breakpoint
        read = prefix[read_at] if read_at >= 0 else 0
        created = prefix[written] - read if written > read_at else 0
        self._forget_expired(now)
        return {
            "input_tokens": total - read - created,
            "cache_creation_input_tokens": created,
            "cache_read_input_tokens": read,
        }

    def _lifetime(self, marker: Mapping[str, Any] | None) -> int:
        return HOUR_TTL if marker is not None and marker.get("ttl") == "1h" else self.ttl

    def _forget_expired(self, now: float) -> None:
        if len(self._entries) > 4_096:
            self._entries = {k: v for k, v in self._entries.items() if now < v[0]}


def cost(
    usage: Mapping[str, int], *, input: float = 3.0, write: float = 3.75, read: float = 0.30
) -> float:
    """Dollars for ``usage`` at prices per million tokens (Claude Sonnet's: uncached input
    3.00, cache writes 3.75, cache reads 0.30)."""
    return (
        usage["input_tokens"] * input
        + usage["cache_creation_input_tokens"] * write
        + usage["cache_read_input_tokens"] * read
    ) / 1_000_000


def _blocks(request: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """``(kind, block)`` for every block, in cache order; a message's first block's kind
    names its role and that it starts the message, so that blocks moved across a message
    boundary do not hash alike."""
    for tool in request.get("tools") or ():
        yield "tool", tool
    system = request.get("system")
    if isinstance(system, str):
        if system:
            yield "system", {"type": "text", "text": system}
    else:
        for block in system or ():
            yield "system", block
    for message in request.get("messages") or ():
        role = str(message.get("role"))
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        for index, block in enumerate(blocks or ()):
            yield (f"{role}:start" if index == 0 else role), block


def _marker(block: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The block's ``cache_control``, or one set on a block nested in it (a search
    result's text, a document's content), which marks the same position."""
    found = _markers(block)
    return found[-1] if found else None


def _markers(value: Any) -> list[Mapping[str, Any]]:
    """Every ``cache_control`` marker in ``value``, at any depth, in prompt order: a
    block's own marker after those nested in it (it marks the end of its content)."""
    found: list[Mapping[str, Any]] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            if key != "cache_control" and isinstance(item, Mapping | list):
                found += _markers(item)
        if value.get("cache_control"):
            found.append(value["cache_control"])
    elif isinstance(value, list):
        for item in value:
            found += _markers(item)
    return found
