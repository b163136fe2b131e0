"""The stage: where the breakpoints go (Anthropic, Qwen) or the ``prompt_cache_key``
(OpenAI), then the cache-break prediction (``prediction.py``)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Final

from pipelines.cache_break import fingerprint
from pipelines.conversation import Conversation
from pipelines.stage import StageContext
from pipelines.stages.cache_markers.prediction import predict
from pipelines.stages.cache_markers.prompt import (
    LOOKBACK,
    TOOLS,
    ClientMarker,
    Prompt,
    ephemeral,
    with_marker,
)

__all__ = ["CacheMarkers", "cache_key"]

MAX_BREAKPOINTS: Final = 4


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
        predict(conversation, ctx)
        return result

    def _marked(
        self, conversation: Conversation, ctx: StageContext, *, anthropic: bool
    ) -> Conversation:
        messages = conversation.messages
        tools = conversation.tools or []
        prompt = Prompt(messages, tools, ctx, anthropic=anthropic)
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
                tools = [*tools[:-1], {**tools[-1], "cache_control": ephemeral()}]
            else:
                out[site] = with_marker(out[site], anthropic=anthropic)
        result = conversation.with_messages(out)
        if any(site == TOOLS for site, _ in taken):
            result = result.with_fields(tools=tools)
        ctx.tokens.remember(result, ctx.tokens(conversation))
        return result

    def _protective(self, prompt: Prompt, ctx: StageContext) -> int | None:
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
        prompt: Prompt,
        site: int,
        taken: list[tuple[int, str]],
        client: list[ClientMarker],
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
