"""Checkpoints: summaries standing for a conversation's oldest compactable messages.

A checkpoint says "the messages ``start:end`` of this conversation, as received, are
summarised by this 11-field summary; their originals are stored under these refs". It is
identified by the hash chain of those messages (``chain``), so it applies to any request
whose history starts with them, on any replica, and to nothing else.

Checkpoints are made by ``SummaryJob``s: the stage decides what to summarise (the span, the
inputs after the ratio guard, the checkpoint to merge into) and hands the job to a
``Summaries`` service, which runs it now (the request waits, within ``summary-timeout``) or
later (in the background, from 0.40 utilisation). ``run_job`` is the work itself: the
originals stored first, then the summary, with tool outputs dropped from the input step by
step when the summary model says its window was exceeded. The gateway's service adds
single-flight locks across replicas and a bounded queue; ``LocalSummaries`` is the
library's, in-process and synchronous only.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Protocol, runtime_checkable

import orjson

from pipelines.messages import Message
from pipelines.stage import OffloadStore, Summarizer
from pipelines.summary import FIELDS, Summary, SummaryFailed, SummaryOverflow

__all__ = [
    "DROP_STEPS",
    "Checkpoint",
    "LocalSummaries",
    "Summaries",
    "SummaryJob",
    "chain_of",
    "run_job",
]

DROP_STEPS: Final = (0.0, 0.1, 0.2, 0.5, 1.0)
"""Shares of the input's tool outputs dropped, oldest first, after each overflow."""
_CHUNK_BYTES: Final = 64 * 1024
"""Originals are stored in chunks of about this size, at message boundaries."""
_OMITTED: Final = "[Tool output omitted from the summary's input; the original is stored.]"
_INDEX_NOTE: Final = (
    "The earlier messages a summary of this conversation stands for, stored in parts,"
    " oldest first. Restore a part by its ref to read its messages."
)


def chain_of(messages: Sequence[Message]) -> str:
    """The hash chain of ``messages``: each message's canonical JSON folded into the
    digest in order, so two chains are equal only for the same messages in the same order."""
    digest = hashlib.blake2b(digest_size=16)
    for message in messages:
        digest.update(orjson.dumps(message, option=orjson.OPT_SORT_KEYS))
        digest.update(b"\x1e")
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A summary standing for ``messages[start:end]`` as received."""

    start: int
    end: int
    chain: str
    summary: dict[str, Any]
    refs: tuple[str, ...]
    """Where the originals are stored (in order)."""
    cut: int = 0
    """Compress's cut when this checkpoint was last applied (0: not applied yet): while
    the cut stays, the same checkpoint is applied again, so the prefix does not move."""
    made: dict[str, Any] = field(default_factory=dict)
    """How it was made (model, attempts, retention, guard, dropped tool outputs)."""
    kept: tuple[int, ...] | None = None
    """Protected messages kept as they are beside the summary when last applied
    (``None``: not known, as in a record written before this was kept)."""
    index: str = ""
    """Ref of the stored list of ``refs``: what the summary message names, one ref
    however many merges the checkpoint has been through."""

    @property
    def listed(self) -> tuple[str, ...]:
        """The refs the summary message names."""
        return (self.index,) if self.index else self.refs

    @property
    def stored(self) -> tuple[str, ...]:
        """Every object the checkpoint needs."""
        return (*self.refs, self.index) if self.index else self.refs

    def applies_to(
        self,
        messages: Sequence[Message],
        start: int,
        limit: int,
        *,
        chains: Callable[[int, int], str] | None = None,
    ) -> bool:
        """Whether this checkpoint stands for ``messages[start:self.end]`` and ends by
        ``limit``; ``chains(start, end)``, when given, hashes ranges of ``messages`` (a
        caller asking about several checkpoints hashes each range once)."""
        if self.start != start or not start < self.end <= min(limit, len(messages)):
            return False
        found = chains(start, self.end) if chains else chain_of(messages[start : self.end])
        return found == self.chain

    def applied_at(self, cut: int, kept: tuple[int, ...]) -> Checkpoint:
        return replace(self, cut=cut, kept=kept)

    def to_dict(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "end": self.end,
            "chain": self.chain,
            "summary": self.summary,
            "refs": list(self.refs),
            "cut": self.cut,
            "made": self.made,
            "kept": list(self.kept) if self.kept is not None else None,
            "index": self.index,
        }

    @classmethod
    def from_dict(cls, data: object) -> Checkpoint | None:
        """The checkpoint in ``data``, or ``None`` when it is not one (an older record's
        shape, or damage)."""
        if not isinstance(data, Mapping):
            return None
        start, end, chain = data.get("start"), data.get("end"), data.get("chain")
        summary, refs = data.get("summary"), data.get("refs")
        if (
            not isinstance(start, int)
            or not isinstance(end, int)
            or not isinstance(chain, str)
            or not isinstance(summary, dict)
            or set(summary) != set(FIELDS)
            or not isinstance(refs, list)
            or not all(isinstance(r, str) for r in refs)
        ):
            return None
        cut, made = data.get("cut", 0), data.get("made")
        kept, index = data.get("kept"), data.get("index")
        return cls(
            start,
            end,
            chain,
            summary,
            tuple(refs),
            cut if isinstance(cut, int) else 0,
            made if isinstance(made, dict) else {},
            tuple(i for i in kept if isinstance(i, int)) if isinstance(kept, list) else None,
            index if isinstance(index, str) else "",
        )

    @classmethod
    def from_json(cls, data: bytes | None) -> Checkpoint | None:
        if not data:
            return None
        try:
            return cls.from_dict(orjson.loads(data))
        except orjson.JSONDecodeError:
            return None

    def to_json(self) -> bytes:
        return orjson.dumps(self.to_dict())


@dataclass(frozen=True, slots=True)
class SummaryJob:
    """What to summarise: the messages ``start:end`` (identified by ``chain``), of which
    the ones after ``base`` (the checkpoint merged into) are new."""

    start: int
    end: int
    chain: str
    originals: tuple[Message, ...]
    """The messages after ``base``'s end up to ``end``: stored, and summarised..."""
    inputs: tuple[Message, ...]
    """...as these (all of them, or the newest that fit the summary model: ``guard``)."""
    base: Checkpoint | None
    model: str
    namespace: str
    ttl: int
    """Seconds the stored originals are kept (``offload-ttl``)."""
    guard: str = "fits"
    """The ratio guard's path for ``inputs``."""


@runtime_checkable
class Summaries(Protocol):
    """Where the summarize stage gets checkpoints for one request's conversation."""

    @property
    def background(self) -> bool:
        """Whether jobs can run in the background (``later``): else everything is made
        when it is needed."""
        ...

    async def ready(self) -> Checkpoint | None:
        """The conversation's latest prepared checkpoint, if any."""
        ...

    async def now(self, job: SummaryJob, *, within: float) -> Checkpoint:
        """The checkpoint of ``job`` within ``within`` seconds (single-flight: when the
        conversation's summary is already being made, that one is awaited and returned,
        whatever it covers); ``SummaryFailed`` or ``TimeoutError`` otherwise."""
        ...

    def later(self, job: SummaryJob) -> bool:
        """Schedule ``job`` without waiting for it; whether it was taken (it is not when
        one is already queued or running for the conversation, or the queue is full)."""
        ...


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
