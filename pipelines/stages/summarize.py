"""Stage 7: the compacted span replaced by a structured summary a model wrote.

When compress cuts the span (from ``trigger``), this stage replaces what it made of it by
one recalled-context message holding the 11-field summary of those messages, listing the
refs of their stored originals. Summaries come as checkpoints (``pipelines.checkpoints``):
each stands for the received messages ``start:end`` and is recognised by their hash chain,
so it applies to any request that starts with them, whichever replica made it.

Making one takes a model call, so the stage avoids waiting for it:

- **Preparation**: from ``prepare`` (0.40) utilisation, from a conversation's second
  request on (a request never followed up costs no summary), once the compactable span holds
  500 tokens, and then each time it has grown by a grid step of compress
  (``(trigger - target) x budget``) beyond what the best known checkpoint covers, a job
  for it, merged into that checkpoint, is handed to the summaries service to run in the
  background: about one summary call per compaction event. The request is not held.
- **Use**: when compress cuts, the previous request's checkpoint is applied again while
  the cut is the same (same bytes, the prefix does not move). At a new cut, the
  checkpoint covering the most of the span is applied (the one prepared in the background,
  usually); what lies between its end and the cut becomes a note, as compress writes them.
  Without any, the summary is made now, within ``summary-timeout``.
- **Fallback**: anything failing (no answer in time, an invalid one, the store) leaves the
  span as compress wrote it, notes naming the refs: the deterministic fallback. The request
  never fails here.

A cut that was already sent with notes while the provider's cache is warm keeps its notes
until the next cut (hot-cache bypass): replacing them would break the cached prefix for a
few tokens' gain. Protected messages (the latest user message before a long agent loop)
are never summarised away: they follow the summary, as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from pipelines.checkpoints import Checkpoint, SummaryJob, chain_of
from pipelines.conversation import Conversation
from pipelines.errors import StoreError
from pipelines.messages import Message
from pipelines.notes import removal_note
from pipelines.ports import Summaries
from pipelines.stage import Compacted, StageContext
from pipelines.stages.compress import compactable
from pipelines.summary import SummaryFailed, summary_message

__all__ = ["Summarize"]

_INPUT_SHARE: Final = 0.8
"""Share of the summary model's window its input may take (the ratio guard)."""
_PROMPT_TOKENS: Final = 700
"""About what the summary prompt's instructions cost."""
_WORTH_SUMMARISING: Final = 500
"""Tokens of compactable span worth a first summary."""


class _Lookup:
    """What one request asks about checkpoints: the service, the conversation's prepared
    checkpoint (read at most once) and the hash chains of the received messages (each
    range hashed at most once)."""

    __slots__ = ("_chains", "_read", "_ready", "received", "summaries")

    def __init__(self, summaries: Summaries, received: Sequence[Message]) -> None:
        self.summaries, self.received = summaries, received
        self._ready: Checkpoint | None = None
        self._read = False
        self._chains: dict[tuple[int, int], str] = {}

    async def ready(self) -> Checkpoint | None:
        if not self._read:
            self._ready, self._read = await self.summaries.ready(), True
        return self._ready

    def chain(self, start: int, end: int) -> str:
        found = self._chains.get((start, end))
        if found is None:
            found = self._chains[start, end] = chain_of(self.received[start:end])
        return found

    def applies(self, checkpoint: Checkpoint, start: int, limit: int) -> bool:
        """Whether ``checkpoint`` stands for the received messages from ``start`` and
        ends by ``limit``."""
        return checkpoint.applies_to(self.received, start, limit, chains=self.chain)


@dataclass(frozen=True, slots=True)
class Summarize:
    name: str = "summarize"

    async def __call__(self, conversation: Conversation, ctx: StageContext) -> Conversation:
        if (
            ctx.policy.mode != "summarize"
            or ctx.summaries is None
            or ctx.store is None
            or ctx.received is None
        ):
            return conversation
        budget = ctx.budget.input_tokens
        # A conversation is prepared for once it has a record (its second request on):
        # a request that is never followed up costs no summary.
        preparing = (
            ctx.summaries.background
            and ctx.state is not None
            and ctx.tokens(ctx.received) >= ctx.policy.prepare * budget
        )
        compacted = ctx.compacted
        if compacted is None and not preparing:
            return conversation
        source = compacted.source if compacted is not None else conversation
        if len(source.messages) != len(ctx.received.messages):
            return conversation  # an earlier stage changed the messages' count: no mapping
        lookup = _Lookup(ctx.summaries, ctx.received.messages)
        # Where compaction may act, as compress saw it (its deduplicated messages).
        span = compactable(compacted.basis if compacted is not None else conversation, ctx)
        result, applied = conversation, None
        if compacted is not None:
            result, applied = await self._apply(conversation, compacted, span, lookup, ctx)
        if preparing and span is not None:
            await self._prepare(source, span, applied, lookup, ctx)
        return result

    async def _apply(
        self,
        conversation: Conversation,
        compacted: Compacted,
        span: tuple[int, int, tuple[int, ...]] | None,
        lookup: _Lookup,
        ctx: StageContext,
    ) -> tuple[Conversation, Checkpoint | None]:
        """The conversation with compress's span replaced by a checkpoint, and that
        checkpoint; the conversation as it is when there is none to use."""
        start, cut = compacted.start, compacted.cut
        limit, pinned = (max(span[1], cut), span[2]) if span is not None else (cut, ())
        state = ctx.state
        previous = Checkpoint.from_dict(state.checkpoint) if state is not None else None
        budget = ctx.budget.input_tokens
        if (
            previous is not None
            and previous.cut == cut
            and lookup.applies(previous, start, limit)
            and await self._stored(previous, ctx)
        ):
            # Rendered as last time, with the messages it kept as they were kept then
            # (one pinned then may no longer be the latest user message).
            checkpoint, path = previous, "checkpoint reused"
            if previous.kept is not None:
                pinned = previous.kept
        elif (
            not ctx.cold
            and state is not None
            and state.compacted_cut == cut
            and (previous is None or previous.cut != cut)
            and ctx.tokens(conversation) <= ctx.policy.emergency * budget
        ):
            ctx.record(path="notes kept: the cut went out with them and the cache is warm")
            return conversation, None
        else:
            chosen = await self._prepared_or_made(compacted, previous, limit, lookup, ctx)
            if chosen is None:
                return conversation, None
            checkpoint, path = chosen
        pinned = tuple(i for i in pinned if start <= i < max(checkpoint.end, cut))
        try:
            result = await self._replaced(conversation, compacted, checkpoint, pinned, ctx)
        except StoreError:
            ctx.record(path="fallback: store unavailable", store_failures=1)
            return conversation, None
        # A new summary must not make the request bigger than compress's notes above the
        # trigger; one already sent at this cut stays while the request fits (swapping it
        # for notes would break the cached prefix twice for nothing).
        ceiling = budget if path == "checkpoint reused" else ctx.policy.trigger * budget
        if ctx.tokens(result) > max(ctx.tokens(conversation), ceiling):
            ctx.record(path="fallback: the summary is larger than the notes")
            return conversation, None
        # The compaction boundary: the last message of what the summary replaced (the
        # summary itself, or the protected messages and notes that follow it).
        kept = len(compacted.source.messages) - max(cut, checkpoint.end)
        ctx.boundary = result.messages[len(result.messages) - kept - 1]
        checkpoint = checkpoint.applied_at(cut, tuple(pinned))
        ctx.carry["checkpoint"] = checkpoint.to_dict()
        ctx.record(
            path=path,
            covers=[checkpoint.start, checkpoint.end],
            summary=chain_of([result.messages[start]]),
            **checkpoint.made,
        )
        return result, checkpoint

    async def _prepared_or_made(
        self,
        compacted: Compacted,
        previous: Checkpoint | None,
        limit: int,
        lookup: _Lookup,
        ctx: StageContext,
    ) -> tuple[Checkpoint, str] | None:
        """The checkpoint to use at ``cut`` and how it was had: prepared in the background,
        extended from the previous one, or made now; ``None`` (the reason recorded) when
        there is none to use."""
        start, cut = compacted.start, compacted.cut
        ready = await lookup.ready()
        candidates = [
            k
            for k in (ready, previous)
            if k is not None and lookup.applies(k, start, limit) and await self._stored(k, ctx)
        ]
        found = max(candidates, key=lambda k: k.end, default=None)
        if found is not None and (found.end >= cut or lookup.summaries.background):
            return found, "prepared checkpoint used" if found is ready else "checkpoint extended"
        # Nothing prepared (or, with no background work, only part): made now.
        job = self._job(compacted.source, start, cut, found, lookup, ctx)
        try:
            checkpoint = await lookup.summaries.now(job, within=ctx.policy.summary_timeout)
        except (SummaryFailed, TimeoutError, StoreError) as exc:
            reason = str(exc) or "deadline"
            if found is None:
                ctx.record(path=f"fallback: {reason}")
                return None
            return found, f"checkpoint extended ({reason})"
        if not lookup.applies(checkpoint, start, limit):
            ctx.record(path="fallback: the summary made meanwhile covers another span")
            return None
        if not await self._stored(checkpoint, ctx):
            ctx.record(path="fallback: the summary's originals are no longer stored")
            return None
        return checkpoint, "summarised" if found is None else "merged"

    async def _replaced(
        self,
        conversation: Conversation,
        compacted: Compacted,
        checkpoint: Checkpoint,
        pinned: Sequence[int],
        ctx: StageContext,
    ) -> Conversation:
        """Compress's span (and, when the checkpoint reaches past the cut, the messages up
        to its end) replaced by the summary, the protected messages in that range as they
        are, and a note for each run of messages between the checkpoint's end and the cut
        (what compress kept there too: the background summary catches up with them)."""
        source = compacted.source.messages
        out = conversation.messages
        start, cut, end = compacted.start, compacted.cut, checkpoint.end
        tail_at = len(out) - (len(source) - cut)
        middle: list[Message] = [summary_message(checkpoint.summary, checkpoint.listed)]
        protected = set(pinned)
        middle.extend(source[i] for i in range(start, end) if i in protected)
        run: list[Message] = []
        for index in range(end, cut):
            if index in protected:
                if run:
                    middle.append(await removal_note(run, ctx))
                    run = []
                middle.append(source[index])
            else:
                run.append(source[index])
        if run:
            middle.append(await removal_note(run, ctx))
        rest = out[tail_at + max(0, end - cut) :]
        return conversation.with_messages([*out[:start], *middle, *rest])

    async def _prepare(
        self,
        source: Conversation,
        span: tuple[int, int, tuple[int, ...]],
        applied: Checkpoint | None,
        lookup: _Lookup,
        ctx: StageContext,
    ) -> None:
        """Schedule the summary of the compactable ``span`` when it has outgrown the best
        known checkpoint enough."""
        start, end, _ = span
        state = ctx.state
        previous = Checkpoint.from_dict(state.checkpoint) if state is not None else None
        candidates = [
            k
            for k in (applied, await lookup.ready(), previous)
            if k is not None and lookup.applies(k, start, end)
        ]
        known = max(candidates, key=lambda k: k.end, default=None)
        covered = known.end if known is not None else start
        size = sum(ctx.tokens.message(m) for m in source.messages[covered:end])
        step = (ctx.policy.trigger - ctx.policy.target) * ctx.budget.input_tokens
        if size < (step if known is not None else min(step, _WORTH_SUMMARISING)):
            return
        job = self._job(source, start, end, known, lookup, ctx)
        taken = lookup.summaries.later(job)
        ctx.record(prepare=[covered, end] if taken else "not scheduled")

    def _job(
        self,
        source: Conversation,
        start: int,
        end: int,
        base: Checkpoint | None,
        lookup: _Lookup,
        ctx: StageContext,
    ) -> SummaryJob:
        first = base.end if base is not None else start
        received = lookup.received
        originals = [_richest(received[i], source.messages[i], ctx) for i in range(first, end)]
        # Stored as received, summarised in their lossless re-encoding (compact JSON):
        # the same content in fewer tokens for the summary model.
        shown = [ctx.as_sent(original) for original in originals]
        model, inputs, guard = self._guarded(shown, base.summary if base is not None else None, ctx)
        return SummaryJob(
            start=start,
            end=end,
            chain=lookup.chain(start, end),
            originals=tuple(originals),
            inputs=tuple(inputs),
            base=base,
            model=model,
            namespace=ctx.namespace,
            ttl=ctx.policy.offload_ttl,
            guard=guard,
        )

    @staticmethod
    async def _stored(checkpoint: Checkpoint, ctx: StageContext) -> bool:
        """Whether the originals a checkpoint names are all still stored."""
        for ref in checkpoint.stored:
            if not await ctx.confirmed(ref):
                return False
        return True

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


def _richest(received: Message, sent: Message, ctx: StageContext) -> Message:
    """The version of a message a summary is made from, and stored as: as received,
    unless the hygiene stages had good reason to replace it (media parts, an output over
    ``filter-tokens``); their replacement names the stored original. A lossless
    re-encoding (compact JSON) is no such reason."""
    if ctx.as_received(sent) is received:
        return received
    if not isinstance(received.get("content"), str):
        return sent
    return received if ctx.tokens.message(received) <= ctx.policy.filter_tokens else sent
