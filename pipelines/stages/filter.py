"""Stage 4: JSON tool outputs made compact; outputs over ``filter-tokens`` offloaded whole,
behind a preview.

One oversized tool result (a database dump, a build log, a page of HTML) can take most of
a window on its own. Each tool message whose output is over the limit is written to the
store first; once the write is acknowledged its content becomes a header naming the ref
and sizes, followed by a structural preview (``pipelines.preview``). The message keeps its
role, ``tool_call_id`` and name, so the call/result pairing is untouched. Without a store,
or when a write fails, the output stays as it is. This is hygiene: it applies to every
message, the protected tail included, at any utilisation.

Before that, with ``compact-json`` (the default), an output that is a JSON object or array
loses its insignificant whitespace (``pipelines.compact_json``: lossless, the same bytes
every turn); the size limit applies to what would be sent, so compaction can keep an
output whole that would otherwise be offloaded. The compact message is registered with
the request context (``StageContext.reencode``) so that every later stage that offloads
it stores, and restores, the output exactly as the client sent it. The report counts the
outputs compacted (``json_compacted``) and the tokens that saved (``json_tokens_saved``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from pipelines.compact_json import JsonCompaction
from pipelines.conversation import Conversation
from pipelines.errors import StoreError
from pipelines.lru import Lru, text_bytes
from pipelines.messages import Message, original_bytes
from pipelines.preview import preview, text_digest
from pipelines.stage import StageContext

__all__ = ["Filter"]

_PREVIEWS_KEPT: Final = 2_048
_PREVIEWS_BYTES: Final = 512 * 1024


@dataclass(frozen=True, slots=True)
class Filter:
    name: str = "filter"
    preview_chars: int = 3_000
    """Largest preview, in characters (about 750 tokens)."""
    _compaction: JsonCompaction = field(default_factory=JsonCompaction, repr=False, compare=False)
    """Compact JSON of the outputs seen: the same output gives the same bytes each turn."""
    _previews: Lru[tuple[bytes, int], str] = field(
        default_factory=lambda: Lru(entries=_PREVIEWS_KEPT, max_bytes=_PREVIEWS_BYTES),
        repr=False,
        compare=False,
    )
    """Previews already made, by (digest, budget) of the output: a resent history
    repeats its large outputs on every request, and parsing them again is the cost."""

    def __post_init__(self) -> None:
        if self.preview_chars < 200:
            raise ValueError("preview_chars must be at least 200")

    async def __call__(self, conversation: Conversation, ctx: StageContext) -> Conversation:
        limit = ctx.policy.filter_tokens
        rewritten = list(conversation.messages)
        refs: list[str] = []
        kept_without_store = failures = compacted = compacted_saving = 0
        # The rewritten conversation's total is counted from this one's, message by message
        # replaced: counting it afresh would be another pass over the whole history.
        total = ctx.tokens(conversation)
        for index, message in enumerate(conversation.messages):
            if message.get("role") != "tool":
                continue
            text = _output_text(message)
            if text is None:
                continue
            sent = self._compacted(message) if ctx.policy.compact_json else message
            # A token is at least one UTF-8 byte: an output of no more bytes than the limit
            # cannot be over it, and is not tokenized at all. Compact JSON that fits is
            # sent whole rather than offloaded.
            if (
                _utf8_size(text) > limit
                and ctx.tokens.message(message) > limit
                and (sent is message or ctx.tokens.message(sent) > limit)
            ):
                if ctx.store is None:
                    kept_without_store += 1
                else:
                    try:
                        ref = await ctx.store.put(
                            ctx.namespace, original_bytes(message), ttl=ctx.policy.offload_ttl
                        )
                    except StoreError:
                        kept_without_store += 1
                        failures += 1
                    else:
                        refs.append(ref)
                        tokens = ctx.tokens.message(message)
                        shown = self._preview(text, min(self.preview_chars, limit * 2))
                        header = _header(text, tokens, ref)
                        rewritten[index] = offloaded = {**message, "content": header + "\n" + shown}
                        total += ctx.tokens.message(offloaded) - tokens
                        continue
            if sent is not message:
                rewritten[index] = sent
                ctx.reencode(sent, message)
                compacted += 1
                saving = ctx.tokens.message(message) - ctx.tokens.message(sent)
                compacted_saving += saving
                total -= saving
        ctx.record(
            outputs_offloaded=len(refs),
            refs=refs,
            kept_without_store=kept_without_store,
            store_failures=failures,
            json_compacted=compacted,
            json_tokens_saved=compacted_saving,
        )
        if not refs and not compacted:
            return conversation
        result = conversation.with_messages(rewritten)
        ctx.tokens.remember(result, total)
        return result

    def _compacted(self, message: Message) -> Message:
        """``message`` with its output (each text part of it) as compact JSON where that
        is JSON and shorter; ``message`` itself when nothing changes."""
        content: Any = message["content"]
        if isinstance(content, str):
            compact = self._compaction(content)
            return message if compact is content else {**message, "content": compact}
        parts = [
            part
            if (text := self._compaction(part["text"])) is part["text"]
            else {**part, "text": text}
            for part in content
        ]
        if all(new is old for new, old in zip(parts, content, strict=True)):
            return message
        return {**message, "content": parts}

    def _preview(self, text: str, budget: int) -> str:
        key = (text_digest(text), budget)
        cached = self._previews.get(key)
        if cached is None:
            cached = preview(text, budget)
            self._previews.put(key, cached, text_bytes(cached) + len(key[0]))
        return cached


_TEXT_PARTS: Final = frozenset({"text", "input_text"})
"""Text parts of a tool result: the chat API's, and the Responses API's in an output."""


def _output_text(message: Message) -> str | None:
    """The text of a tool message, or None for other messages and non-text results."""
    if message.get("role") != "tool":
        return None
    content: Any = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") in _TEXT_PARTS and isinstance(p.get("text"), str)
        for p in content
    ):
        return "\n".join(p["text"] for p in content)
    return None


def _utf8_size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode())


def _header(text: str, tokens: int, ref: str) -> str:
    lines = text.count("\n") + 1
    return (
        f"[Tool output offloaded: {tokens:,} tokens, {lines:,} lines, {len(text):,} characters,"
        f" stored as {ref}. A preview follows; the full output can be restored. Do not guess"
        " at what the preview leaves out.]"
    )
