"""The prompt as a provider's cache reads it (sites, their prefix tokens, the blocks the
Messages API makes of each message) and the markers on it: the client's, found, and the
stage's, placed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, NamedTuple

from pipelines.messages import Message, is_system_turn
from pipelines.stage import StageContext

__all__ = [
    "LOOKBACK",
    "SYSTEM_ROLES",
    "TOOLS",
    "ClientMarker",
    "Prompt",
    "ephemeral",
    "with_marker",
]

TOOLS: Final = -1
"""The site of the tools prefix (the last tool), beside message indices."""
LOOKBACK: Final = 20
"""Blocks before a breakpoint where the providers still look for a cached prefix."""
SYSTEM_ROLES: Final = ("system", "developer")
_THINKING: Final = ("thinking", "redacted_thinking")


class ClientMarker(NamedTuple):
    """A breakpoint the client placed."""

    site: int | None
    """The site it occupies (``None`` for a tool other than the last one)."""
    key: tuple[int, int]
    """Where it sits in the prompt (``Prompt.key``)."""
    hour: bool
    """Whether it is a 1-hour one."""
    automatic: bool = False
    """Whether it is the top-level one, which moves to the newest block every turn."""


class Prompt:
    """The conversation as the provider's cache reads it: the tools, then (for Anthropic)
    the system messages, then the other messages; each site's prefix tokens and the
    blocks the Messages API makes of each message."""

    __slots__ = (
        "_ctx",
        "_key",
        "_prefix",
        "anthropic",
        "counted",
        "messages",
        "order",
        "system",
        "tools",
    )

    def __init__(
        self,
        messages: Sequence[Message],
        tools: Sequence[Any],
        ctx: StageContext,
        *,
        anthropic: bool,
    ) -> None:
        self.messages, self.tools, self.anthropic, self._ctx = messages, tools, anthropic, ctx
        # Anthropic takes system messages apart, before the history, but for a system
        # turn of the history, which stays in its place.
        flags = [m.get("role") in SYSTEM_ROLES and not is_system_turn(m) for m in messages]
        self.system = [i for i, is_system in enumerate(flags) if is_system]
        # The messages whose blocks follow one another in the Messages API's messages.
        self.counted = (
            [i for i, is_system in enumerate(flags) if not is_system]
            if anthropic
            else list(range(len(messages)))
        )
        order = [TOOLS] if tools else []
        order += [*self.system, *self.counted] if anthropic else self.counted
        self.order = order
        self._key = {site: rank for rank, site in enumerate(order)}
        self._prefix: dict[int, int] = {}
        total = 0
        for site in order:
            total += (
                ctx.counter.count_tools(tools)
                if site == TOOLS
                else ctx.tokens.message(messages[site])
            )
            self._prefix[site] = total

    def key(self, site: int) -> tuple[int, int]:
        """Where ``site``'s breakpoint sits in the prompt (ours go on a site's last block)."""
        return self._key[site], len(self.tools) - 1 if site == TOOLS else 0

    def tokens(self, site: int) -> int:
        """Tokens of the prompt up to and including ``site``."""
        return self._prefix[site]

    def tokens_at(self, key: tuple[int, int]) -> int:
        """Tokens up to a client marker at ``key`` (a tool's counted with the tools up to it)."""
        site = self.order[key[0]]
        if site == TOOLS:
            return self._ctx.counter.count_tools(self.tools[: key[1] + 1])
        return self._prefix[site]

    def client_markers(self, automatic: Any = None) -> list[ClientMarker]:
        """The client's markers: those on its tools and messages, and ``automatic``, its
        top-level ``cache_control`` if any, where the API puts it (the last block that
        can carry one)."""
        found: list[ClientMarker] = []
        last = len(self.tools) - 1
        for index, tool in enumerate(self.tools):
            marker = tool.get("cache_control") if isinstance(tool, dict) else None
            if marker:
                site = TOOLS if index == last else None
                found.append(ClientMarker(site, (self._key[TOOLS], index), is_hour(marker)))
        for index, message in enumerate(self.messages):
            # Most messages are a string and nothing else: looked at no further.
            if (
                "cache_control" in message
                or type(message.get("content")) is list
                or message.get("tool_calls")
            ):
                found.extend(
                    ClientMarker(index, self.key(index), is_hour(m)) for m in _markers(message)
                )
        if automatic:
            site = self.rolling()
            if site is None and self.tools:
                site = TOOLS
            if site is not None:
                # Counted even where the client marked that block too: one slot fewer for
                # the stage beats a fifth breakpoint, which the API refuses.
                found.append(ClientMarker(site, self.key(site), is_hour(automatic), True))
        return found

    def markable(self, index: int) -> bool:
        message = self.messages[index]
        if self.anthropic:
            return _markable_blocks(message) > 0
        content = message.get("content")
        if isinstance(content, list):
            return bool(content) and _takes_marker(content[-1])
        return isinstance(content, str) and bool(content)

    def rolling(self) -> int | None:
        """The newest message that can carry a marker."""
        return next((s for s in reversed(self.order) if s != TOOLS and self.markable(s)), None)

    def prefix(self) -> int | None:
        """The last system message, else (Anthropic) the last tool."""
        system = [s for s in self.system if self.markable(s)]
        if system:
            return system[-1]
        return TOOLS if self.anthropic and self.tools else None

    def find(self, message: Message | None) -> int | None:
        """The index of ``message`` (by identity) when it can carry a marker."""
        if message is None:
            return None
        index = next((i for i, m in enumerate(self.messages) if m is message), None)
        return index if index is not None and self.markable(index) else None

    def blocks_after(self, index: int) -> int:
        """Blocks of the messages after ``index``."""
        return sum(_blocks(self.messages[i]) for i in self.counted if i > index)

    def message_of_block(self, block: int) -> int:
        """The message holding the ``block``-th block (from 1)."""
        seen = 0
        for index in self.counted:
            seen += _blocks(self.messages[index])
            if seen >= block:
                return index
        return len(self.messages) - 1

    def markable_at_or_before(self, index: int) -> int | None:
        for site in reversed(self.counted):
            if site <= index and self.markable(site):
                return site
        return None


def _blocks(message: Message) -> int:
    """Blocks the Messages API makes of a message: a tool result is one; a string content
    one (none when empty); a list one per part; an assistant's thinking blocks and tool
    calls one each."""
    if message.get("role") == "tool":
        return 1
    content = message.get("content")
    count = (1 if content else 0) if isinstance(content, str) else 0
    if isinstance(content, list):
        count = len(content)
    if message.get("role") == "assistant":
        count += len(message.get("thinking_blocks") or ()) + len(message.get("tool_calls") or ())
    return count


def _markable_blocks(message: Message) -> int:
    """The blocks of ``_blocks`` that can carry a marker: not thinking blocks, nor empty
    text (which the codec leaves out)."""
    if message.get("role") == "tool":
        return 1
    content = message.get("content")
    if isinstance(content, list):
        count = sum(1 for part in content if _takes_marker(part))
    else:
        count = 1 if isinstance(content, str) and content else 0
    if message.get("role") == "assistant":
        count += len(message.get("tool_calls") or ())
    return count


def _takes_marker(part: Any) -> bool:
    """Whether a content part can carry a marker (a thinking block or an empty text
    cannot)."""
    if not isinstance(part, dict):
        return True
    return part.get("type") not in _THINKING and part.get("text") != ""


def _markers(message: Message) -> list[Any]:
    """The client's ``cache_control`` markers on a message: its own, its content parts'
    (and those of the blocks nested in a part, such as a search result's text), its tool
    calls'."""
    found = [message["cache_control"]] if message.get("cache_control") else []
    for key in ("content", "tool_calls"):
        items = message.get(key)
        if isinstance(items, list):
            _part_markers(items, found)
    return found


def _part_markers(parts: list[Any], found: list[Any]) -> None:
    for part in parts:
        if not isinstance(part, dict):
            continue
        if part.get("cache_control"):
            found.append(part["cache_control"])
        for key in ("content", "source"):  # where the Messages API nests blocks
            nested = part.get(key)
            if isinstance(nested, list):
                _part_markers(nested, found)
            elif isinstance(nested, dict):
                _part_markers([nested], found)


def is_hour(marker: Any) -> bool:
    return isinstance(marker, dict) and marker.get("ttl") == "1h"


def ephemeral() -> dict[str, str]:
    return {"type": "ephemeral"}


def with_marker(message: Message, *, anthropic: bool) -> Message:
    if anthropic:
        return {**message, "cache_control": ephemeral()}
    content = message["content"]
    if isinstance(content, str):
        return {
            **message,
            "content": [{"type": "text", "text": content, "cache_control": ephemeral()}],
        }
    last = content[-1]
    if not isinstance(last, dict):
        last = {"type": "text", "text": str(last)}
    return {**message, "content": [*content[:-1], {**last, "cache_control": ephemeral()}]}
