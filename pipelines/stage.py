"""What a stage is, and what it is given: the Stage protocol and the per-request context.

A stage is a small callable object with a ``name``. It receives the conversation and the
request context and returns a conversation: the same object when it changed nothing, a new
one otherwise. It never mutates its input. Everything with I/O (the offload store, the
summary model, the summaries service, the clock) reaches it through the context, as one of
the protocols in ``pipelines.ports``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, runtime_checkable

from pipelines.budget import Budget
from pipelines.catalog import ModelInfo
from pipelines.conversation import Conversation
from pipelines.counting import ConversationTokens
from pipelines.errors import StoreError
from pipelines.messages import Message
from pipelines.native import NativePlan
from pipelines.policy import Policy
from pipelines.ports import Clock, OffloadStore, Rendering, Summaries, Summarizer
from pipelines.report import Report
from pipelines.session import ConversationState
from pipelines.tokens import TokenCounter

__all__ = ["REF_PATTERN", "Compacted", "Stage", "StageContext"]

REF_PATTERN: Final = re.compile(r"ctx_[A-Za-z0-9_-]{22,}")
"""What a ref looks like (docs/ARCHITECTURE.md, "The pipeline"): ``ctx_`` and at least 22
URL-safe characters."""


@runtime_checkable
class Stage(Protocol):
    """One step of the pipeline."""

    @property
    def name(self) -> str: ...

    async def __call__(self, conversation: Conversation, ctx: StageContext) -> Conversation: ...


@dataclass(frozen=True, slots=True)
class Compacted:
    """Where compress cut this request: ``source`` is the conversation it was given, and
    its messages ``start:cut`` are what its output's span stands for."""

    source: Conversation
    start: int
    cut: int
    basis: Conversation
    """What compress protected on: ``source`` before the cut, deduplicated after it
    (so its protected tail is the one compress kept)."""


@dataclass(slots=True)
class StageContext:
    """What every stage may consult for one request."""

    model: ModelInfo
    policy: Policy
    budget: Budget
    counter: TokenCounter
    clock: Clock
    tokens: ConversationTokens
    """Tokens of a conversation of this request (``tokens(conversation)``) or of one of
    its messages (``tokens.message(m)``); what was counted before is not recounted."""
    namespace: str = ""
    """Tenant namespace for offloaded objects."""
    model_name: str = ""
    """The model the request names (``model`` is its catalog entry)."""
    summary_model: ModelInfo | None = None
    """The catalog entry of ``policy.summary_model`` when one is set."""
    store: OffloadStore | None = None
    render: Rendering | None = None
    """How a run of removed messages is stored (``pipelines.ports.Rendering``); their JSON
    when ``None``."""
    summarizer: Summarizer | None = None
    summaries: Summaries | None = None
    """Where checkpoints are found and made (``summarize`` mode)."""
    received: Conversation | None = None
    """The conversation as the request brought it, before any stage."""
    compacted: Compacted | None = None
    """Set by compress when it cut the span."""
    boundary: Message | None = None
    """The last message of the compacted part of the conversation (the end of compress's
    span, or of what the summary replaced), as the stage that made it returned it: the
    compaction boundary, found again by identity."""
    state: ConversationState | None = None
    """The conversation's record from earlier requests (``None``: not known)."""
    cold: bool = True
    """Whether the provider's prompt cache is cold for this conversation: rewrites that
    break the cached prefix cost nothing then."""
    conversation: str = ""
    """The conversation's identity (the client's, or ``pipelines.conversation_id``)."""
    native: NativePlan | None = None
    """What the request's native context management asks of the pipeline
    (``pipelines.native``): ``None`` when it carries none."""
    report: Report | None = None
    """The request's report so far: what the stages before the running one did."""
    carry: dict[str, Any] = field(default_factory=dict)
    """Cuts a stage moved, for the conversation's next record (``ConversationState``
    field names); dropped for a stage that fails."""
    details: dict[str, Any] = field(default_factory=dict)
    """What the running stage wants reported (items touched, refs created); the runner
    gives each stage a fresh dict and files it under the stage's name."""
    off_the_wire: bool = False
    """Set by the running stage when what it changed is nothing a wire carries for this
    model (a field the codecs leave out): its tokens are reported, not an action. The
    runner clears it before each stage."""
    reencodings: dict[int, tuple[Message, Message]] = field(default_factory=dict)
    """Lossless re-encodings made for this request (a tool output as compact JSON): the
    message made and the message as received, by the id of either (both held, so their
    ids stay their own). See ``as_received`` and ``as_sent``."""

    def record(self, **details: Any) -> None:
        """Add ``details`` to the running stage's report."""
        self.details.update(details)

    def reencode(self, made: Message, received: Message) -> None:
        """Note that ``made`` says what ``received`` says, in other bytes."""
        self.reencodings[id(made)] = self.reencodings[id(received)] = (made, received)

    def as_received(self, message: Message) -> Message:
        """The message as the client sent it when ``message`` is a lossless re-encoding
        of it, else ``message``: what a stage offloads, so that a restore gives back the
        client's bytes, not the gateway's rewriting of them."""
        found = self.reencodings.get(id(message))
        return found[1] if found is not None and found[0] is message else message

    def as_sent(self, message: Message) -> Message:
        """The lossless re-encoding made of a received ``message``, else ``message``:
        what a model reading it (the summary model) is given."""
        found = self.reencodings.get(id(message))
        return found[0] if found is not None and found[1] is message else message

    async def offload(self, content: bytes) -> str | None:
        """Write ``content`` to the store for ``offload-ttl``: its ref once the write is
        acknowledged, ``None`` when the store did not take it (counted in the running
        stage's ``store_failures``; the content then stays in place)."""
        if self.store is None:
            return None
        try:
            return await self.store.put(self.namespace, content, ttl=self.policy.offload_ttl)
        except StoreError:
            self.details["store_failures"] = self.details.get("store_failures", 0) + 1
            return None

    async def confirmed(self, ref: str) -> bool:
        """Whether ``ref`` is still in the store (renewing it for ``offload-ttl``), asked
        cheaply where the store can (``touch``), else by reading it: what a rewrite made on
        an earlier request names must still be there before the rewrite is sent again.
        False when the store cannot say."""
        touch = getattr(self.store, "touch", None)
        try:
            if touch is None:  # a store that cannot be asked cheaply: read it back
                return (
                    self.store is not None and await self.store.get(self.namespace, ref) is not None
                )
            return bool(await touch(self.namespace, ref, self.policy.offload_ttl))
        except StoreError:
            return False

    def cut(self, name: str) -> int:
        """The cut ``name`` as the conversation's record has it (0 when not known)."""
        value = self.carry.get(name)
        if value is None:
            value = getattr(self.state, name, 0) if self.state is not None else 0
        return int(value)
