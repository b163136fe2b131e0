"""Stage 2: media only in the last ``keep-images`` media-bearing messages.

Base64 screenshots resent on every turn are the classic way a long agent session outgrows
its window (and its request-size limit). Image, audio, video and file parts are kept in the
newest ``keep-images`` messages that carry any, whatever their role (tool results too);
each part of an older message is offloaded whole and replaced by a text part naming its
ref. Offloading comes first: a part whose write the store does not acknowledge stays as it
is, and without a store nothing is removed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import orjson

from pipelines.conversation import Conversation
from pipelines.errors import StoreError
from pipelines.messages import Message
from pipelines.stage import StageContext

__all__ = ["MEDIA_PARTS", "Media"]

MEDIA_PARTS: Final = frozenset(
    {
        "image_url",
        "image",
        "input_image",
        "input_audio",
        "audio",
        "video",
        "video_url",
        "file",
        "input_file",
    }
)
_KIND: Final = {
    "input_audio": "audio",
    "audio": "audio",
    "video": "video",
    "video_url": "video",
    "file": "file",
    "input_file": "file",
}


@dataclass(frozen=True, slots=True)
class Media:
    name: str = "media"

    async def __call__(self, conversation: Conversation, ctx: StageContext) -> Conversation:
        messages = conversation.messages
        bearing = [
            i
            for i, message in enumerate(messages)
            if type(message.get("content")) is list and _media_count(message)
        ]
        keep = ctx.policy.keep_images
        older = bearing[: max(0, len(bearing) - keep)]
        if not older:
            return conversation
        if ctx.store is None:
            ctx.record(media_messages_kept_without_store=len(older))
            return conversation
        rewritten = list(messages)
        refs: list[str] = []
        failures = 0
        for index in older:
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
        ctx.record(parts_offloaded=len(refs), refs=refs, store_failures=failures)
        if not refs:
            return conversation
        return conversation.with_messages(rewritten)


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
