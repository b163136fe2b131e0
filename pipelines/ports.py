"""What the pipeline needs from outside: the protocols its host implements.

The pipeline does no I/O of its own. Whatever reaches a store, a model or the time comes
in through these protocols, passed to ``Pipeline`` and handed to the stages in their
``StageContext``: the offload store (``OffloadStore``) that keeps what a stage removes, the
summary model (``Summarizer``), the service that makes and keeps checkpoints for a
conversation (``Summaries``), and the ``Clock``. The gateway implements them over Redis or
memory and its upstreams; the library's own are ``LocalSummaries``
(``pipelines.local_summaries``) and ``time.monotonic``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from pipelines.checkpoints import Checkpoint, SummaryJob
from pipelines.messages import Message
from pipelines.summary import Summary

__all__ = ["Clock", "OffloadStore", "Rendering", "Summaries", "Summarizer"]

Clock = Callable[[], float]
"""Seconds on a monotonic scale."""

Rendering = Callable[[Sequence[Message]], bytes]
"""How a run of removed messages is stored, so that its ref restores them in the form the
client sent them: by default their JSON (the chat form is the client's on the chat
route); a host whose client speaks another API gives its own (the gateway's Responses
route: the items the messages came from)."""


@runtime_checkable
class OffloadStore(Protocol):
    """Where removed content goes so that it can be restored by ref."""

    async def put(self, namespace: str, content: bytes, *, ttl: int) -> str:
        """Store ``content`` for ``ttl`` seconds; return its ref once the write is
        acknowledged, or raise ``StoreError``. The same content in the same namespace
        always gets the same ref."""
        ...

    async def get(self, namespace: str, ref: str) -> bytes | None:
        """The content behind ``ref`` in ``namespace``, or ``None``."""
        ...


@runtime_checkable
class Summarizer(Protocol):
    """Writes a structured summary of messages with an auxiliary model."""

    async def summarize(
        self,
        messages: Sequence[Message],
        *,
        model: str,
        previous: Mapping[str, Any] | None = None,
    ) -> Summary:
        """The summary of ``messages`` (merging ``previous``), or ``SummaryFailed``."""
        ...


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
