"""Running summary jobs: how a checkpoint is made, and the library's ``Summaries``.

``run_job`` is the work itself, whoever schedules it (this module's ``LocalSummaries`` or
the gateway's service): the originals stored first, then the summary, with tool outputs
dropped from the input step by step when the summary model says its window was exceeded.
The gateway's service adds single-flight locks across replicas and a bounded queue;
``LocalSummaries`` is the library's, in-process and synchronous only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson

from pipelines.checkpoints import Checkpoint, SummaryJob
from pipelines.messages import Message
from pipelines.ports import OffloadStore, Summarizer
from pipelines.summary import Summary, SummaryFailed, SummaryOverflow

__all__ = ["DROP_STEPS", "LocalSummaries", "drop_tool_outputs", "run_job", "summarize_stepped"]

DROP_STEPS: Final = (0.0, 0.1, 0.2, 0.5, 1.0)
"""Shares of the input's tool outputs dropped, oldest first, after each overflow."""
_CHUNK_BYTES: Final = 64 * 1024
"""Originals are stored in chunks of about this size, at message boundaries."""
_OMITTED: Final = "[Tool output omitted from the summary's input; the original is stored.]"
_INDEX_NOTE: Final = (
    "The earlier messages a summary of this conversation stands for, stored in parts,"
    " oldest first. Restore a part by its ref to read its messages."
)


async def run_job(job: SummaryJob, summarizer: Summarizer, store: OffloadStore) -> Checkpoint:
    """Make the checkpoint of ``job``: the inputs stored first (their refs listed after
    the base's), then summarised, merged into the base's summary. Raises
    ``SummaryFailed`` (and ``StoreError`` when the originals cannot be stored)."""
    refs = list(job.base.refs) if job.base is not None else []
    for chunk in _chunks(job.originals):
        refs.append(await store.put(job.namespace, orjson.dumps(chunk), ttl=job.ttl))
    index = await store.put(
        job.namespace,
        orjson.dumps({"note": _INDEX_NOTE, "parts": refs}, option=orjson.OPT_INDENT_2),
        ttl=job.ttl,
    )
    previous = job.base.summary if job.base is not None else None
    summary, dropped = await summarize_stepped(summarizer, job.inputs, job.model, previous)
    made = {
        "model": job.model,
        "attempts": summary.attempts,
        "retention": round(summary.retention, 3),
        "guard": job.guard,
        "merged": job.base is not None,
    }
    if dropped:
        made["dropped_tool_outputs"] = dropped
    return Checkpoint(
        job.start, job.end, job.chain, summary.fields, tuple(refs), made=made, index=index
    )


async def summarize_stepped(
    summarizer: Summarizer,
    inputs: Sequence[Message],
    model: str,
    previous: Mapping[str, Any] | None,
) -> tuple[Summary, float]:
    """The summary of ``inputs``; when the summary model says its window was exceeded,
    asked again with 10%, 20%, 50%, then all of the tool outputs dropped, oldest first.
    Returns the summary and the share dropped."""
    for share in DROP_STEPS:
        try:
            summary = await summarizer.summarize(
                drop_tool_outputs(inputs, share), model=model, previous=previous
            )
        except SummaryOverflow:
            continue
        return summary, share
    raise SummaryFailed("the summary input overflowed the model even without tool outputs")


def drop_tool_outputs(messages: Sequence[Message], share: float) -> list[Message]:
    """``messages`` with ``share`` of their tool outputs (the oldest) replaced by a short
    placeholder; the tool-call structure stays."""
    tools = [i for i, m in enumerate(messages) if m.get("role") == "tool"]
    dropped = set(tools[: round(len(tools) * share)])
    return [{**m, "content": _OMITTED} if i in dropped else m for i, m in enumerate(messages)]


def _chunks(messages: Sequence[Message]) -> list[list[Message]]:
    chunks: list[list[Message]] = []
    current: list[Message] = []
    size = 0
    for message in messages:
        length = len(orjson.dumps(message))
        if current and size + length > _CHUNK_BYTES:
            chunks.append(current)
            current, size = [], 0
        current.append(message)
        size += length
    if current:
        chunks.append(current)
    return chunks


class LocalSummaries:
    """The library's summaries: made on the spot by ``summarizer`` and never in the
    background; the checkpoint a request applied lives in the conversation's record, so
    none is kept here."""

    __slots__ = ("store", "summarizer")

    background = False

    def __init__(self, summarizer: Summarizer, store: OffloadStore) -> None:
        self.summarizer, self.store = summarizer, store

    async def ready(self) -> Checkpoint | None:
        return None

    async def now(self, job: SummaryJob, *, within: float) -> Checkpoint:
        async with asyncio.timeout(within):
            return await run_job(job, self.summarizer, self.store)

    def later(self, job: SummaryJob) -> bool:
        return False
