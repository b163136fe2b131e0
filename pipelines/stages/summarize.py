"""Stage 6: the compacted span replaced by a structured summary a model wrote.

Compress (stage 5) leaves the span it compacted as a run of notes naming stored refs, with
the user messages and answers it kept in between. In ``summarize`` mode, with a summarizer
at hand, this stage replaces that whole run by one recalled-context message holding the
11-field summary of everything in it (the removed messages read back from the store),
listing the refs of what it stands for.

A summary is a model's answer, so it is not computed again for the same span: the
conversation's record keeps it as a checkpoint under the span's refs (content-addressed,
so the same refs mean the same messages) and a later request with the same span gets the
same message, byte for byte. When the span grows (compress moved its cut), only what is
new is summarised, merged into the previous summary. Anything failing (no summarizer
answer in time, an invalid one, the store) leaves the notes as compress wrote them: the
deterministic fallback. The request never fails here.

Still to come (issue 5): preparing the summary in the background from 0.40, sharing
checkpoints across replicas and single-flight locks, the auxiliary-model ratio guard
beyond trimming, the circuit breaker.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Final

import orjson

from pipelines.conversation import Conversation
from pipelines.errors import StoreError
from pipelines.messages import Message
from pipelines.stage import REF_PATTERN, StageContext
from pipelines.summary import SummaryFailed, summary_message

__all__ = ["Summarize"]

_NOTE: Final = "[Context note: "
_INPUT_SHARE: Final = 0.8
"""Share of the summary model's window its input may take (the ratio guard)."""
_PROMPT_TOKENS: Final = 700
"""About what the summary prompt's instructions cost."""


@dataclass(frozen=True, slots=True)
class Summarize:
    name: str = "summarize"

    async def __call__(self, conversation: Conversation, ctx: StageContext) -> Conversation:
        if ctx.policy.mode != "summarize" or ctx.summarizer is None or ctx.store is None:
            return conversation
        messages = conversation.messages
        notes = [i for i, m in enumerate(messages) if _is_note(m)]
        if not notes:
            return conversation
        first, last = notes[0], notes[-1]
        span = messages[first : last + 1]
        refs = [REF_PATTERN.search(str(m["content"])).group() for m in span if _is_note(m)]  # type: ignore[union-attr]
        previous = ctx.state.checkpoint if ctx.state is not None else None
        if previous is not None and previous.get("refs") == refs:
            ctx.record(path="checkpoint reused")
            return self._replaced(conversation, first, last, previous, ctx)
        merge = (
            previous
            if previous is not None and refs[: len(previous.get("refs", []))] == previous["refs"]
            else None
        )
        new_refs = refs[len(merge["refs"]) :] if merge is not None else refs
        try:
            inputs = await self._inputs(span, new_refs, ctx)
        except StoreError:
            ctx.record(path="fallback: store unavailable")
            return conversation
        model, inputs, guard = self._guarded(inputs, previous if merge else None, ctx)
        try:
            async with asyncio.timeout(ctx.policy.summary_timeout):
                summary = await ctx.summarizer.summarize(
                    inputs,
                    model=model,
                    previous=merge["summary"] if merge is not None else None,
                )
        except (SummaryFailed, TimeoutError) as exc:
            ctx.record(path=f"fallback: {exc or 'deadline'}")
            return conversation
        checkpoint = {"refs": refs, "summary": summary.fields}
        ctx.carry["checkpoint"] = checkpoint
        ctx.record(
            path="merged" if merge is not None else "summarised",
            attempts=summary.attempts,
            retention=round(summary.retention, 3),
            model=model,
            guard=guard,
        )
        return self._replaced(conversation, first, last, checkpoint, ctx)

    def _replaced(
        self,
        conversation: Conversation,
        first: int,
        last: int,
        checkpoint: dict[str, Any],
        ctx: StageContext,
    ) -> Conversation:
        message = summary_message(checkpoint["summary"], checkpoint["refs"])
        ctx.carry["checkpoint"] = checkpoint
        messages = conversation.messages
        return conversation.with_messages([*messages[:first], message, *messages[last + 1 :]])

    async def _inputs(
        self, span: tuple[Message, ...] | list[Message], refs: list[str], ctx: StageContext
    ) -> list[Message]:
        """The messages the span stands for, as sent before compaction: each note's stored
        messages in its place, the kept messages as they are; when merging (``refs`` is
        only the new part), from the first new note on."""
        assert ctx.store is not None
        start = next(
            (
                i
                for i, m in enumerate(span)
                if _is_note(m) and refs and refs[0] in str(m.get("content"))
            ),
            0,
        )
        out: list[Message] = []
        for message in span[start:]:
            if not _is_note(message):
                out.append(message)
                continue
            ref = REF_PATTERN.search(str(message["content"])).group()  # type: ignore[union-attr]
            stored = await ctx.store.get(ctx.namespace, ref)
            if stored is None:
                raise StoreError(f"{ref} is no longer stored")
            removed = orjson.loads(stored)
            out.extend(m for m in removed if isinstance(m, dict))
        return out

    def _guarded(
        self, inputs: list[Message], previous: dict[str, Any] | None, ctx: StageContext
    ) -> tuple[str, list[Message], str]:
        """The auxiliary-model ratio guard: the summary model, the inputs it gets, and which
        path was taken. The input must fit 0.8 of the summary model's window less the
        prompt; if it does not, the request's own model is used when it fits there, else
        the newest inputs that fit are kept."""
        size = sum(ctx.counter.count_message(m) for m in inputs)
        prompt = _PROMPT_TOKENS + (
            ctx.counter.count_text(orjson.dumps(previous).decode()) if previous else 0
        )
        own = ctx.model_name
        chosen = ctx.summary_model
        name = ctx.policy.summary_model or own
        window = chosen.context_window if chosen is not None else ctx.model.context_window
        if size <= _INPUT_SHARE * window - prompt:
            return name, inputs, "fits"
        if chosen is not None and size <= _INPUT_SHARE * ctx.model.context_window - prompt:
            return own, inputs, "main model"
        allowance = _INPUT_SHARE * max(window, ctx.model.context_window) - prompt
        model = own if chosen is not None and ctx.model.context_window > window else name
        kept: list[Message] = []
        used = 0
        for message in reversed(inputs):
            used += ctx.counter.count_message(message)
            if used > allowance and kept:
                break
            kept.append(message)
        kept.reverse()
        return model, kept, f"trimmed {len(inputs) - len(kept)} oldest inputs"


def _is_note(message: Message) -> bool:
    content = message.get("content")
    return message.get("role") == "user" and isinstance(content, str) and content.startswith(_NOTE)
