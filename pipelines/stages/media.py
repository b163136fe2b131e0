"""Stage 3: media only in the last ``keep-images`` media-bearing messages.

Base64 screenshots resent on every turn are the classic way a long agent session outgrows
its window (and its request-size limit). Image, audio, video, file and document (PDF)
parts are kept in the newest ``keep-images`` messages that carry any, whatever their role
(tool results too); each part of an older message is offloaded whole and replaced by a
text part naming its ref. Offloading comes first: a part whose write the store does not
acknowledge stays as it is, and without a store nothing is removed.

Moving the window rewrites a message that the provider has cached, so while the cache is
warm the window moves in batches: the older media stay until ``batch`` of them have piled
up beyond the window (or utilisation reaches 0.90), then all go at once. A cold cache (a
new conversation, an idle one) moves it at once. How many media-bearing messages lost their
media is kept in the conversation's record (``media_cut``), so the next request strips the
same ones and its prefix does not move.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from pipelines.conversation import Conversation
from pipelines.errors import StoreError
from pipelines.messages import MEDIA_PART_TYPES, Message
from pipelines.stage import StageContext

__all__ = ["MEDIA_PARTS", "Media"]

MEDIA_PARTS: Final = MEDIA_PART_TYPES
"""Image, audio, video, file and document parts (``pipelines.messages``)."""
_KIND: Final = {
    "input_audio": "audio",
    "audio": "audio",
    "video": "video",
    "video_url": "video",
    "file": "file",
    "input_file": "file",
    "document": "document",
}


@dataclass(frozen=True, slots=True)
class Media:
    name: str = "media"
    batch: int = 4
    """Media-bearing messages beyond the window that a warm cache lets pile up."""

    async def __call__(self, conversation: Conversation, ctx: StageContext) -> Conversation:
        messages = conversation.messages
        bearing = [
            i
            for i, message in enumerate(messages)
            if type(message.get("content")) is list and _media_count(message)
        ]
        window = max(0, len(bearing) - ctx.policy.keep_images)
        previous = min(ctx.cut("media_cut"), window)
        if not window:
            return conversation
        if ctx.store is None:
            ctx.record(media_messages_kept_without_store=window)
            return conversation
        moving = ctx.cold or window - previous >= self.batch
        cut = window if moving else previous
        rewritten = list(messages)
        refs: list[str] = []
        failures = await self._strip(messages, bearing[:cut], rewritten, refs, ctx)
        if cut < window:
            # Pressure is judged on what is being sent: the last request as it went out
            # plus what is new since. Judged on the raw history (before compress) it would
            # hold in every long session and move the window every turn.
            limit = max(ctx.policy.emergency, ctx.policy.trigger) * ctx.budget.input_tokens
            if _expected(conversation, rewritten if refs else None, ctx) >= limit:
                failures += await self._strip(messages, bearing[cut:window], rewritten, refs, ctx)
                cut = window
            else:
                ctx.record(deferred=window - cut)
        ctx.record(
            parts_offloaded=len(refs), refs=refs, store_failures=failures, moved=cut != previous
        )
        # Recorded even when a part could not be stored (it stays in this request and is
        # tried again next time): without it the next request would undo every strip.
        ctx.carry["media_cut"] = cut
        if not refs:
            return conversation
        return conversation.with_messages(rewritten)

    async def _strip(
        self,
        messages: Sequence[Message],
        indices: list[int],
        rewritten: list[Message],
        refs: list[str],
        ctx: StageContext,
    ) -> int:
        """Offload the media parts of ``messages[indices]`` into ``rewritten``; append the
        refs to ``refs``; return how many parts the store refused."""
        assert ctx.store is not None
        failures = 0
        for index in indices:
            message = messages[index]
            parts: list[Any] = []
            for part in message["content"]:
                if isinstance(part, dict) and part.get("type") in MEDIA_PARTS:
                    try:
                        ref = await ctx.store.put(
                            ctx.namespace, orjson.dumps(part), ttl=ctx.policy.offload_ttl
                        )
                    except StoreError:
                        failures += 1
                        parts.append(part)
                        continue
                    refs.append(ref)
                    parts.append({"type": "text", "text": _placeholder(part, ref)})
                else:
                    parts.append(part)
            rewritten[index] = {**message, "content": parts}
        return failures


def _expected(
    conversation: Conversation, rewritten: list[Message] | None, ctx: StageContext
) -> int:
    """Tokens the request is expected to go out with: the previous request's as sent plus
    the messages added since, or (without a record) this request as it stands."""
    state = ctx.state
    if state is not None and state.sent_tokens is not None and state.seen:
        added = conversation.messages[state.seen :]
        return state.sent_tokens + sum(ctx.tokens.message(m) for m in added)
    current = conversation.with_messages(rewritten) if rewritten is not None else conversation
    return ctx.tokens(current)


def _media_count(message: Message) -> int:
    content = message.get("content")
    if not isinstance(content, list):
        return 0
    return sum(1 for p in content if isinstance(p, dict) and p.get("type") in MEDIA_PARTS)


def _placeholder(part: dict[str, Any], ref: str) -> str:
    kind = _KIND.get(str(part.get("type")), "image")
    return (
        f"[An earlier {kind} was removed from the context to save space. It is stored as"
        f" {ref} and can be restored.]"
    )
