"""What compress writes to the offload store before it removes or shortens anything.

Every text compress takes out is stored first and named by its ref where it stood. When
the store cannot take an object, ``NoStore`` abandons the whole compaction (the stage then
sends the request as it was, or shortens it with no copy kept only if it cannot be sent
otherwise), so nothing is ever lost. ``shortened`` is the one way a long text is cut here,
for the final answers in the span and for the emergency alike.
"""

from __future__ import annotations

from typing import Final

from pipelines.errors import StoreError
from pipelines.messages import Message, original_bytes
from pipelines.preview import preview
from pipelines.stage import StageContext

__all__ = ["NOT_KEPT", "NoStore", "offload", "shortened"]

NOT_KEPT: Final = "no copy is kept (the offload store could not take it)"


class NoStore(Exception):
    """The store could not take an object: compaction is abandoned, nothing is lost."""


async def offload(ctx: StageContext, content: bytes) -> str:
    """The ref of ``content`` once stored for ``offload-ttl``; ``NoStore`` when the store
    fails."""
    assert ctx.store is not None
    try:
        return await ctx.store.put(ctx.namespace, content, ttl=ctx.policy.offload_ttl)
    except StoreError as exc:
        raise NoStore from exc


async def shortened(
    message: Message, ctx: StageContext, keep_chars: int, *, lossy: bool = False
) -> Message:
    """``message`` with its text cut to a preview of ``keep_chars`` (none at 0) under a
    note naming the stored original, or saying none is kept (``lossy``); the message
    itself when its text is short or not a string."""
    content = message.get("content")
    if not isinstance(content, str) or len(content) <= max(keep_chars, 120):
        return message
    if lossy:
        note = f"[Shortened to fit the context window; {NOT_KEPT}]"
    else:
        ref = await offload(ctx, original_bytes(ctx.as_received(message)))
        note = f"[Shortened; the full text is stored as {ref}.]"
    short = preview(content, keep_chars) if keep_chars else ""
    return {**message, "content": f"{note}\n{short}" if short else note}
