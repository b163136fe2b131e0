"""The pipeline as a library: ``Pipeline.compact`` and the module-level ``compact``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Final

from pipelines.budget import Budget
from pipelines.catalog import ModelCatalog
from pipelines.conversation import Conversation
from pipelines.policy import Policy
from pipelines.report import Report
from pipelines.runner import ConversationTokens, run_stages
from pipelines.stage import Clock, OffloadStore, Stage, StageContext, Summarizer
from pipelines.stages import DEFAULT_STAGES
from pipelines.tokens import TokenCounter

__all__ = ["CompactResult", "Pipeline", "compact"]

THREAD_COUNT_CHARS: Final = 64_000
"""Histories with more text than this are first counted on a worker thread (tiktoken
releases the GIL), so a cold long history does not stall other requests."""


@dataclass(frozen=True, slots=True)
class CompactResult:
    """The request to send, the report, and whether any stage changed the request."""

    request: dict[str, Any]
    report: Report
    changed: bool


class Pipeline:
    """The stages, the model catalog and the token counters, with the injected I/O."""

    __slots__ = ("_counters", "catalog", "clock", "stages", "store", "summarizer")

    def __init__(
        self,
        *,
        stages: Sequence[Stage] = DEFAULT_STAGES,
        catalog: ModelCatalog | None = None,
        store: OffloadStore | None = None,
        summarizer: Summarizer | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.stages = tuple(stages)
        self.catalog = catalog or ModelCatalog()
        self.store = store
        self.summarizer = summarizer
        self.clock = clock
        self._counters: dict[str, TokenCounter] = {}

    def counter(self, encoding: str) -> TokenCounter:
        """The shared, caching token counter for ``encoding``."""
        counter = self._counters.get(encoding)
        if counter is None:
            counter = self._counters[encoding] = TokenCounter(encoding)
        return counter

    async def compact(
        self,
        request: Mapping[str, Any],
        *,
        model: str | None = None,
        policy: Policy | None = None,
        namespace: str = "",
    ) -> CompactResult:
        """Run every stage over ``request`` (an OpenAI chat request body)."""
        started = perf_counter()
        policy = policy or Policy()
        conversation = Conversation.from_request(request)
        name = model or conversation.model
        info = self.catalog.lookup(name)
        budget = Budget.for_request(info, policy, request)
        counter = self.counter(info.encoding)
        tokens = ConversationTokens(counter)
        if _text_chars(conversation) > THREAD_COUNT_CHARS:
            before = await asyncio.to_thread(tokens, conversation)
        else:
            before = tokens(conversation)
        report = Report(name, budget.window, budget.output_reserve, budget.input_tokens, before)
        ctx = StageContext(
            model=info,
            policy=policy,
            budget=budget,
            counter=counter,
            clock=self.clock,
            namespace=namespace,
            store=self.store,
            summarizer=self.summarizer,
        )
        result = await run_stages(self.stages, conversation, ctx, report, tokens)
        report.ms = (perf_counter() - started) * 1000
        changed = result is not conversation
        return CompactResult(result.to_request() if changed else dict(request), report, changed)


def _text_chars(conversation: Conversation) -> int:
    total = 0
    for message in conversation.messages:
        content = message.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(p.get("text") or "") for p in content if isinstance(p, dict))
    return total


_default: Pipeline | None = None


async def compact(
    request: Mapping[str, Any],
    *,
    model: str | None = None,
    policy: Policy | None = None,
    store: OffloadStore | None = None,
    summarizer: Summarizer | None = None,
    namespace: str = "",
) -> CompactResult:
    """Compact one chat request with the default stages and catalog.

    The counters are shared between calls; ``store`` and ``summarizer`` are this call's.
    """
    global _default
    if _default is None:
        _default = Pipeline()
    pipeline = _default
    if store is not None or summarizer is not None:
        pipeline = Pipeline(
            stages=pipeline.stages, catalog=pipeline.catalog, store=store, summarizer=summarizer
        )
        pipeline._counters = _default._counters
    return await pipeline.compact(request, model=model, policy=policy, namespace=namespace)
