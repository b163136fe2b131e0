"""Checkpoints: summaries standing for a conversation's oldest compactable messages.

A checkpoint says "the messages ``start:end`` of this conversation, as received, are
summarised by this 11-field summary; their originals are stored under these refs". It is
identified by the hash chain of those messages (``chain``), so it applies to any request
whose history starts with them, on any replica, and to nothing else.

Checkpoints are made by ``SummaryJob``s: the stage decides what to summarise (the span, the
inputs after the ratio guard, the checkpoint to merge into) and hands the job to a
``Summaries`` service (``pipelines.ports``), which runs it now (the request waits, within
``summary-timeout``) or later (in the background, from 0.40 utilisation). This module holds
what a checkpoint and a job are; running a job (``run_job``) and the library's in-process
service (``LocalSummaries``) are in ``pipelines.local_summaries``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from pipelines.messages import Message
from pipelines.summary import FIELDS

__all__ = ["Checkpoint", "SummaryJob", "chain_of"]


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
