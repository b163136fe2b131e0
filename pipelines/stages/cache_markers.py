"""Stage 8: provider prompt-cache hints, and cache-break prediction.

**Anthropic and Qwen/DashScope** cache only where told to: ``cache_control`` breakpoints,
at most 4 per request counting the client's own. The stage adds 5-minute (``ephemeral``)
ones, in this order of priority while slots last:

1. ``rolling``: the newest message. It writes the cache entry the next turn reads.
2. ``prefix``: the last system message (or, for Anthropic, with none, the last tool): the
   tools and system prompt, which new conversations with the same ones share too.
3. ``protective``: a breakpoint only finds entries up to about 20 blocks before it, so
   when a request added more than ``protect_after`` blocks since the previous request of
   the conversation (a long tool loop), the previous request's last message is marked
   again, where the previous rolling breakpoint wrote its entry. Without a record of the
   previous request, a message ``protect_after`` blocks before the end is marked instead.
4. ``compaction``: the last message of the compacted part (``StageContext.boundary``).

A breakpoint other than the rolling one is placed only when the prompt between it and the
breakpoint before it (or the start) holds ``min_tokens`` (an entry for less would not be
written, or would save little over the one before); the rolling one only needs the whole
prefix to hold ``min_tokens``. The client's markers are never moved or removed, a message
it marked is not marked again, and none is placed before a client's ``ttl: "1h"`` marker
(the API wants 1-hour entries before 5-minute ones). Every breakpoint other than the
rolling one stays where it is from turn to turn: on the system prompt, the compaction
boundary or the previous request's rolling message, so between compaction events no
breakpoint lands on a message that did not carry one before.

Where the markers go (a contract with the codecs): for Anthropic, a message-level
``cache_control`` key on the message (meaning its last Messages API block that can carry
one: not a thinking block, nor an empty text, which the codec leaves out) and a
tool-level one on the last tool; for Qwen, on the message's last content part (a string
content becomes one text part; a thinking or empty text part takes none), as DashScope
takes them over the OpenAI wire. The client's markers count wherever they are, nested
blocks included (a search result's text, a document's content).

Anthropic's automatic caching, a top-level ``cache_control``, is one of the client's
markers: the API puts it on the last block that can carry one, so it sits on the newest
message the rolling breakpoint would mark, with its TTL. It takes the rolling breakpoint's
place (none is added there), and a 1-hour one leaves no place for the stage's 5-minute
ones. The codecs must send it on as the client gave it: the inbound ``/v1/messages``
codec keeps it in the chat request for this stage and sends it back from ``native``.

**OpenAI** caches automatically (prompts of 1,024 tokens and more); the stage sets a
``prompt_cache_key`` per conversation (a hash of the namespace and the conversation's
identity) on requests that long unless the client set one, so that the conversation's
requests are routed to the same cache.

A policy with ``cache-markers=?0`` adds neither (the client places its own).

**Every family**: the stage predicts cache breaks (``pipelines.cache_break``) against the
conversation's record, and records the fingerprints for the next request.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from pipelines.cache_break import Fingerprints, fingerprint, predicted_break
from pipelines.conversation import Conversation
from pipelines.messages import Message, is_system_turn
from pipelines.stage import StageContext

__all__ = ["CacheMarkers", "cache_key"]

TOOLS: Final = -1
"""The site of the tools prefix (the last tool), beside message indices."""
MAX_BREAKPOINTS: Final = 4
LOOKBACK: Final = 20
"""Blocks before a breakpoint where the providers still look for a cached prefix."""
_SYSTEM_ROLES: Final = ("system", "developer")
_THINKING: Final = ("thinking", "redacted_thinking")


class _ClientMarker(NamedTuple):
    """A breakpoint the client placed."""

    site: int | None
    """The site it occupies (``None`` for a tool other than the last one)."""
    key: tuple[int, int]
    """Where it sits in the prompt (``_Prompt.key``)."""
    hour: bool
    """Whether it is a 1-hour one."""
    automatic: bool = False
    """Whether it is the top-level one, which moves to the newest block every turn."""


def cache_key(namespace: str, conversation: str) -> str:
    """The ``prompt_cache_key`` of a conversation: short, stable, and telling nothing."""
    data = f"{namespace}\0{conversation}".encode()
    return "cg-" + hashlib.blake2b(data, digest_size=12).hexdigest()


@dataclass(frozen=True, slots=True)
class CacheMarkers:
    name: str = "cache_markers"
    max_breakpoints: int = MAX_BREAKPOINTS
    """Breakpoints a request may carry, the client's included (the APIs refuse more)."""
    min_tokens: int = 1_024
    """Tokens a cached prefix (or the part of it since the breakpoint before) must hold."""
    protect_after: int = 15
    """Blocks a request may add after the previous request's end before that end gets a
    breakpoint of its own (the providers look about 20 blocks back)."""

    def __post_init__(self) -> None:
        if not 1 <= self.max_breakpoints <= MAX_BREAKPOINTS:
            raise ValueError(f"max_breakpoints must be in [1, {MAX_BREAKPOINTS}]")
        if self.min_tokens < 0 or self.protect_after < 1:
            raise ValueError("min_tokens must be >= 0 and protect_after >= 1")

    async def __call__(self, conversation: Conversation, ctx: StageContext) -> Conversation:
        family = ctx.model.family
        result = conversation
        if not ctx.policy.cache_markers:
            pass
        elif family in ("anthropic", "qwen"):
            result = self._marked(conversation, ctx, anthropic=family == "anthropic")
        elif family == "openai":
            result = _keyed(conversation, ctx, self.min_tokens)
        _predict(conversation, ctx)
        return result

    def _marked(
        self, conversation: Conversation, ctx: StageContext, *, anthropic: bool
    ) -> Conversation:
        messages = conversation.messages
        tools = conversation.tools or []
        prompt = _Prompt(messages, tools, ctx, anthropic=anthropic)
        automatic = conversation.get("cache_control") if anthropic else None
        client = prompt.client_markers(automatic)
        candidates = [
            (prompt.rolling(), "rolling"),
            (prompt.prefix(), "prefix"),
            (self._protective(prompt, ctx), "protective"),
            (prompt.find(ctx.boundary), "compaction"),
        ]
        free = self.max_breakpoints - len(client)
        occupied = {marker.site for marker in client if marker.site is not None}
        latest_hour = max((marker.key for marker in client if marker.hour), default=None)
        taken: list[tuple[int, str]] = []
        skipped: list[dict[str, Any]] = []
        for site, why in candidates:
            if site is None or any(site == s for s, _ in taken):
                continue
            because = None
            if site in occupied:
                because = "the client marked it"
            elif free <= len(taken):
                because = "no breakpoint left"
            elif latest_hour is not None and prompt.key(site) <= latest_hour:
                because = "before a client's 1-hour breakpoint"
            elif why == "rolling" and prompt.tokens(site) < self.min_tokens:
                because = f"prefix under {self.min_tokens} tokens"
            elif why != "rolling" and not self._segments_hold(prompt, site, taken, client):
                because = f"segment under {self.min_tokens} tokens"
            if because is not None:
                skipped.append({"why": why, "at": _where(site), "skipped": because})
                continue
            taken.append((site, why))
        if client:
            ctx.record(client_markers=len(client))
        if skipped:
            ctx.record(skipped=skipped)
        if not taken:
            return conversation
        ctx.record(markers=[{"at": _where(site), "why": why} for site, why in taken])
        out = list(messages)
        for site, _ in taken:
            if site == TOOLS:
                tools = [*tools[:-1], {**tools[-1], "cache_control": _ephemeral()}]
            else:
                out[site] = _with_marker(out[site], anthropic=anthropic)
        result = conversation.with_messages(out)
        if any(site == TOOLS for site, _ in taken):
            result = result.with_fields(tools=tools)
        ctx.tokens.remember(result, ctx.tokens(conversation))
        return result

    def _protective(self, prompt: _Prompt, ctx: StageContext) -> int | None:
        """Where the previous request's rolling breakpoint was, when this request added
        more blocks after it than a breakpoint looks back; without a record of it, the
        message ``protect_after`` blocks before the end."""
        state = ctx.state
        messages = prompt.messages
        if state is not None and state.sent_messages and state.sent_last:
            end = state.sent_messages - 1
            if end >= len(messages) - 1 or fingerprint(messages[end]) != state.sent_last:
                return None  # the prefix changed (an event) or nothing was added
            if prompt.blocks_after(end) <= self.protect_after:
                return None
            return prompt.markable_at_or_before(end)
        total = prompt.blocks_after(-1)
        if total <= LOOKBACK:
            return None  # the rolling breakpoint reaches back to the start
        return prompt.markable_at_or_before(prompt.message_of_block(total - self.protect_after))

    def _segments_hold(
        self,
        prompt: _Prompt,
        site: int,
        taken: list[tuple[int, str]],
        client: list[_ClientMarker],
    ) -> bool:
        """Whether a breakpoint at ``site`` has ``min_tokens`` since the breakpoint before
        it, and leaves as many to the next one already taken other than the rolling one
        (or the client's automatic one, which is where the rolling one would be)."""
        key, tokens = prompt.key(site), prompt.tokens(site)
        marks = [(prompt.key(s), prompt.tokens(s), why) for s, why in taken]
        marks += [
            (m.key, prompt.tokens_at(m.key), "rolling" if m.automatic else "client") for m in client
        ]
        before = max((t for k, t, _ in marks if k < key), default=0)
        after = min((t for k, t, why in marks if k > key and why != "rolling"), default=None)
        return tokens - before >= self.min_tokens and (
            after is None or after - tokens >= self.min_tokens
        )


class _Prompt:
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
        flags = [m.get("role") in _SYSTEM_ROLES and not is_system_turn(m) for m in messages]
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

    def client_markers(self, automatic: Any = None) -> list[_ClientMarker]:
        """The client's markers: those on its tools and messages, and ``automatic``, its
        top-level ``cache_control`` if any, where the API puts it (the last block that
        can carry one)."""
        found: list[_ClientMarker] = []
        last = len(self.tools) - 1
        for index, tool in enumerate(self.tools):
            marker = tool.get("cache_control") if isinstance(tool, dict) else None
            if marker:
                site = TOOLS if index == last else None
                found.append(_ClientMarker(site, (self._key[TOOLS], index), _is_hour(marker)))
        for index, message in enumerate(self.messages):
            # Most messages are a string and nothing else: looked at no further.
            if (
                "cache_control" in message
                or type(message.get("content")) is list
                or message.get("tool_calls")
            ):
                found.extend(
                    _ClientMarker(index, self.key(index), _is_hour(m)) for m in _markers(message)
                )
        if automatic:
            site = self.rolling()
            if site is None and self.tools:
                site = TOOLS
            if site is not None:
                # Counted even where the client marked that block too: one slot fewer for
                # the stage beats a fifth breakpoint, which the API refuses.
                found.append(_ClientMarker(site, self.key(site), _is_hour(automatic), True))
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


def _is_hour(marker: Any) -> bool:
    return isinstance(marker, dict) and marker.get("ttl") == "1h"


def _ephemeral() -> dict[str, str]:
    return {"type": "ephemeral"}


def _with_marker(message: Message, *, anthropic: bool) -> Message:
    if anthropic:
        return {**message, "cache_control": _ephemeral()}
    content = message["content"]
    if isinstance(content, str):
        return {
            **message,
            "content": [{"type": "text", "text": content, "cache_control": _ephemeral()}],
        }
    last = content[-1]
    if not isinstance(last, dict):
        last = {"type": "text", "text": str(last)}
    return {**message, "content": [*content[:-1], {**last, "cache_control": _ephemeral()}]}


def _where(site: int) -> int | str:
    return "tools" if site == TOOLS else site


def _keyed(conversation: Conversation, ctx: StageContext, min_tokens: int) -> Conversation:
    if conversation.get("prompt_cache_key") is not None:
        ctx.record(prompt_cache_key="the client's")
        return conversation
    if ctx.tokens(conversation) < min_tokens:
        return conversation  # OpenAI caches no prompt this short: nothing to route
    ctx.record(prompt_cache_key="set")
    return conversation.with_fields(prompt_cache_key=cache_key(ctx.namespace, ctx.conversation))


def _predict(conversation: Conversation, ctx: StageContext) -> None:
    """Name the cache break this request causes, if any, and keep what the next request of
    the conversation is compared with: its fingerprints, the digest of its messages as
    they go up, and where its rolling breakpoint was.

    A break is what the provider's cache will see: the model, the system prompt or the
    tools changed, the messages the previous request sent are not the start of this one's
    (a compaction rewrote them), or the cache's TTL ran out. Whether a stage ran says
    nothing by itself: a compaction that keeps its cut sends the same prefix again."""
    messages = conversation.messages
    hoisted = ctx.model.family == "anthropic"
    now = Fingerprints.of(ctx.model_name, messages, conversation.tools, hoisted=hoisted)
    report, state = ctx.report, ctx.state
    prints = [
        ctx.counter.fingerprint(m)
        for m in messages
        if not (hoisted and m.get("role") in _SYSTEM_ROLES and not is_system_turn(m))
    ]
    prompt = hashlib.blake2b(digest_size=16)
    kept: bool | None = None
    for count, print_ in enumerate(prints, 1):
        prompt.update(print_)
        if state is not None and count == state.sent_prompt_messages:
            kept = prompt.hexdigest() == state.sent_prompt
    if state is not None:
        if state.sent_prompt and kept is None:
            kept = False  # fewer messages than went up last time
        before = Fingerprints(state.model_hash, state.system_hash, state.tool_hashes)
        expired = report is not None and report.cache == "expired"
        found = predicted_break(before, now, compaction=kept is False, expired=expired)
        if found is not None:
            cause, detail = found
            ctx.record(cache_break=cause)
            if detail is not None:
                ctx.record(cache_break_tools=detail)
    ctx.carry.update(
        model_hash=now.model,
        system_hash=now.system,
        tool_hashes=now.tools,
        sent_messages=len(messages),
        sent_last=fingerprint(messages[-1]) if messages else "",
        sent_prompt=prompt.hexdigest(),
        sent_prompt_messages=len(prints),
    )
