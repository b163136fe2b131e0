"""The pipeline as a library: ``Pipeline.compact`` and the module-level ``compact``."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Final

from opentelemetry.trace import Tracer

from pipelines.budget import Budget
from pipelines.cache_break import cache_ttl
from pipelines.catalog import ModelCatalog, ModelInfo
from pipelines.conversation import Conversation
from pipelines.counting import ConversationTokens
from pipelines.local_summaries import LocalSummaries
from pipelines.native import NativePlan
from pipelines.policy import Policy
from pipelines.ports import Clock, OffloadStore, Rendering, Summaries, Summarizer
from pipelines.report import Report
from pipelines.runner import TRACER, run_stages
from pipelines.session import ConversationState, cache_status, conversation_id
from pipelines.stage import Stage, StageContext
from pipelines.stages import DEFAULT_STAGES
from pipelines.tokens import TokenCounter

__all__ = ["COUNTS_KEPT", "CompactResult", "Pipeline", "compact"]

COUNTS_KEPT: Final = 10_000
"""Messages whose token count (and prompt-cache fingerprint) a pipeline's counter keeps,
per encoding: about 250 bytes each, 2.4 MiB full (just under a resize of the dicts' tables,
which would double them); the histories of several long conversations at once, and a
message that drops out is only counted again (docs/DEPLOY.md, "Sizing memory")."""

log = logging.getLogger("contextgate.pipeline")


@dataclass(frozen=True, slots=True)
class CompactResult:
    """The request to send, the report, and whether any stage changed the request."""

    request: dict[str, Any]
    report: Report
    changed: bool
    state: ConversationState
    """The conversation's record with the cuts this request applied; the caller stores it
    (after marking when the request went upstream: ``ConversationState.answered``)."""


class Pipeline:
    """The stages, the model catalog and the token counters, with the injected I/O.
    ``tracer`` takes the runner's spans (default: the process's tracer provider's)."""

    __slots__ = (
        "_background",
        "_counters",
        "catalog",
        "clock",
        "stages",
        "store",
        "summarizer",
        "tracer",
    )

    def __init__(
        self,
        *,
        stages: Sequence[Stage] = DEFAULT_STAGES,
        catalog: ModelCatalog | None = None,
        store: OffloadStore | None = None,
        summarizer: Summarizer | None = None,
        clock: Clock = time.monotonic,
        tracer: Tracer = TRACER,
    ) -> None:
        self.stages = tuple(stages)
        self.catalog = catalog or ModelCatalog()
        self.store = store
        self.summarizer = summarizer
        self.clock = clock
        self.tracer = tracer
        self._counters: dict[str, TokenCounter] = {}
        self._background: asyncio.Task[None] | None = None

    def _measure_later(self, job: Callable[[], object]) -> None:
        """Run ``job`` on a worker thread in the background, one job at a time; while one
        runs, further jobs are dropped (their messages are measured on a later request)."""
        if self._background is not None and not self._background.done():
            return
        self._background = asyncio.get_running_loop().create_task(_in_thread(job))

    async def settled(self) -> None:
        """Wait until background measuring, if any, has finished."""
        if self._background is not None:
            await asyncio.shield(self._background)

    def using(
        self, *, store: OffloadStore | None = None, summarizer: Summarizer | None = None
    ) -> Pipeline:
        """This pipeline with other I/O, sharing its catalog, stages and token caches."""
        other = Pipeline(
            stages=self.stages,
            catalog=self.catalog,
            store=store,
            summarizer=summarizer,
            clock=self.clock,
            tracer=self.tracer,
        )
        other._counters = self._counters
        return other

    def counter(self, encoding: str) -> TokenCounter:
        """The shared, caching token counter for ``encoding``."""
        counter = self._counters.get(encoding)
        if counter is None:
            counter = self._counters[encoding] = TokenCounter(encoding, max_entries=COUNTS_KEPT)
        return counter

    async def compact(
        self,
        request: Mapping[str, Any],
        *,
        model: str | None = None,
        policy: Policy | None = None,
        namespace: str = "",
        state: ConversationState | None = None,
        now: float | None = None,
        store: OffloadStore | None = None,
        summarizer: Summarizer | None = None,
        summaries: Summaries | None = None,
        conversation: str | None = None,
        render: Rendering | None = None,
        native: NativePlan | None = None,
    ) -> CompactResult:
        """Run every stage over ``request`` (an OpenAI chat request body).

        ``state`` is the conversation's record from its earlier requests, ``now`` the wall
        clock (default: the current time); together they say whether the provider's prompt
        cache is still warm. Without a state the conversation counts as new, so cold.
        ``store`` and ``summarizer`` replace the pipeline's for this call; ``summaries``
        (the gateway's: background preparation, checkpoints shared by replicas) replaces
        the summarizer's default, which makes each summary when it is needed.
        ``conversation`` is the conversation's identity (the gateway's; by default
        ``conversation_id`` of the namespace and the messages). ``render`` stores a run of
        removed messages in the client's own form (``pipelines.ports.Rendering``).
        ``native`` is what the request's native context management asks of the pipeline
        (``pipelines.native``); the report carries it.
        """
        started = perf_counter()
        policy = policy or Policy()
        received = Conversation.from_request(request)
        if conversation is None:
            conversation = conversation_id(namespace, received.messages)
        name = model or received.model
        info = self.catalog.lookup(name)
        budget = Budget.for_request(info, policy, request)
        counter = self.counter(info.encoding)
        await counter.ready()
        tokens = ConversationTokens(counter)
        threshold = int(min(policy.prepare, policy.trigger) * budget.input_tokens)
        before = await tokens.first(received, threshold=threshold, defer=self._measure_later)
        report = Report(name, budget.window, budget.output_reserve, budget.input_tokens, before)
        report.exact = tokens.exact
        report.native = native.as_dict() if native is not None else None
        state, cold, report.cache = _warmth(info, received, state, now)
        store = store if store is not None else self.store
        summarizer = summarizer if summarizer is not None else self.summarizer
        if summaries is None and summarizer is not None and store is not None:
            summaries = LocalSummaries(summarizer, store)
        ctx = StageContext(
            model=info,
            policy=policy,
            budget=budget,
            counter=counter,
            clock=self.clock,
            tokens=tokens,
            namespace=namespace,
            model_name=name,
            summary_model=self.catalog.lookup(policy.summary_model)
            if policy.summary_model
            else None,
            store=store,
            render=render,
            summarizer=summarizer,
            summaries=summaries,
            received=received,
            state=state,
            cold=cold,
            conversation=conversation,
            native=native,
            report=report,
        )
        result = await run_stages(self.stages, received, ctx, report, tokens, self.tracer)
        report.ms = (perf_counter() - started) * 1000
        changed = result is not received
        after = _recorded(state, ctx, received, report, cold=cold)
        return CompactResult(
            result.to_request() if changed else dict(request), report, changed, after
        )


def _warmth(
    info: ModelInfo, received: Conversation, state: ConversationState | None, now: float | None
) -> tuple[ConversationState | None, bool, str]:
    """The conversation's record if the request follows it (``None`` if the history
    diverged), whether the provider's prompt cache is cold, and the report's word for it."""
    diverged = state is not None and not state.follows(received.messages)
    if diverged:
        state = None
    ttl = info.cache_ttl
    if info.family == "anthropic":
        ttl = cache_ttl(received.messages, ttl, received.get("cache_control"))
    cold, cache = cache_status(state, ttl=ttl, now=time.time() if now is None else now)
    return state, cold, "diverged" if diverged else cache


def _recorded(
    state: ConversationState | None,
    ctx: StageContext,
    received: Conversation,
    report: Report,
    *,
    cold: bool,
) -> ConversationState:
    """The conversation's record after this request: what the stages carry to the next
    request, and the history as received."""
    # A request that breaks its cached prefix misses the cache as a cold one does: the
    # provider's hit rate on it says nothing about the cache for the next request.
    missed = cold or report.cache_break is not None
    return (state or _NEW).with_history(
        received.messages, sent_tokens=report.tokens_after, cold=missed, cuts=ctx.carry
    )


_NEW: Final = ConversationState()
"""The record of a conversation not seen before (frozen, so one serves every request)."""


async def _in_thread(job: Callable[[], object]) -> None:
    try:
        await asyncio.to_thread(job)
    except Exception:
        log.warning("background token measuring failed", exc_info=True)


_default: Pipeline | None = None


async def compact(
    request: Mapping[str, Any],
    *,
    model: str | None = None,
    policy: Policy | None = None,
    store: OffloadStore | None = None,
    summarizer: Summarizer | None = None,
    namespace: str = "",
    state: ConversationState | None = None,
    conversation: str | None = None,
) -> CompactResult:
    """Compact one chat request with the default stages and catalog.

    The counters are shared between calls; ``store`` and ``summarizer`` are this call's.
    """
    global _default
    if _default is None:
        _default = Pipeline()
    pipeline = _default
    if store is not None or summarizer is not None:
        pipeline = pipeline.using(store=store, summarizer=summarizer)
    return await pipeline.compact(
        request,
        model=model,
        policy=policy,
        namespace=namespace,
        state=state,
        conversation=conversation,
    )
