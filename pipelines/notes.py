"""The note that stands in a conversation for a run of messages moved to the store."""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from pipelines.messages import Message
from pipelines.stage import StageContext

__all__ = ["removal_note"]


async def removal_note(removed: Sequence[Message], ctx: StageContext) -> Message:
    """Store ``removed`` and return the short user-role note naming its ref and the tools
    it called. Raises ``StoreError`` (nothing is removed then) when the store fails."""
    assert ctx.store is not None
    # As the client sent them: a restore gives back its bytes, not a re-encoding.
    originals = [ctx.as_received(message) for message in removed]
    content = ctx.render(originals) if ctx.render is not None else orjson.dumps(originals)
    ref = await ctx.store.put(ctx.namespace, content, ttl=ctx.policy.offload_ttl)
    calls: dict[str, int] = {}
    for message in removed:
        for call in message.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, dict) else None
            name = str(function.get("name", "?")) if isinstance(function, dict) else "?"
            calls[name] = calls.get(name, 0) + 1
    described = ", ".join(f"{name} x{count}" for name, count in sorted(calls.items()))
    what = f"{len(removed)} earlier messages" + (f" (tool calls: {described})" if calls else "")
    return {
        "role": "user",
        "content": f"[Context note: {what} were removed to fit the context window."
        f" They are stored as {ref} and can be restored. This note is not a new request.]",
    }
