"""Cache-break prediction, for every family: against the conversation's record, and the
record kept for the next request."""

from __future__ import annotations

import hashlib

from pipelines.cache_break import Fingerprints, fingerprint, predicted_break
from pipelines.conversation import Conversation
from pipelines.messages import is_system_turn
from pipelines.stage import StageContext
from pipelines.stages.cache_markers.prompt import SYSTEM_ROLES

__all__ = ["predict"]


def predict(conversation: Conversation, ctx: StageContext) -> None:
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
        if not (hoisted and m.get("role") in SYSTEM_ROLES and not is_system_turn(m))
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
