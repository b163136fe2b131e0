"""What the gateway remembers about one conversation between its requests
(docs/ARCHITECTURE.md, "The pipeline").

Chat clients resend the whole history every time, so the pipeline can work statelessly,
except for two things it cannot see in a request: whether the provider's prompt cache still
holds this conversation, and which rewrites that depend on later messages (the media window,
the cache-TTL prune) were already applied. A ``ConversationState`` carries both. Rewrites
are applied up to *cuts* kept in the state, so a request whose history extends the previous
one gets the same rewrites again (the same bytes: refs are content-addressed) and its
outgoing prefix does not move; cuts advance only while the cache is cold, when moving them
costs nothing, or under pressure.

A conversation is identified by the client (``x-contextgate-conversation``) or by a hash of
the namespace, the client's session id (Claude Code's, Codex's) when it sends one, the
system prompt and the first user message (``conversation_id``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, Final

import orjson

from pipelines.cache_break import without_markers
from pipelines.messages import Message

__all__ = [
    "HOT_HIT_RATE",
    "NATIVE_EDITS",
    "ConversationState",
    "cache_status",
    "conversation_id",
    "usage_of",
]

HOT_HIT_RATE: Final = 0.35
"""Provider cache-hit rate at or above which the cache is taken to be working."""
COLD_HIT_RATE: Final = 0.12
"""Hit rate under which, on a stable sample, the cache is taken not to be working."""
NATIVE_EDITS: Final = "native_edits"
"""The key of a usage dict (the host's) that counts the context edits the provider applied
to the request (``context_management.applied_edits``, compactions)."""
ANSWER_IDS: Final = 16
"""Answer ids a conversation's record keeps."""
_STABLE_CALLS: Final = 2
_STABLE_TOKENS: Final = 4_000


@dataclass(frozen=True, slots=True)
class ConversationState:
    """One conversation's record. Times are wall-clock seconds (shared across replicas)."""

    last_seen: float | None = None
    """When the previous request of this conversation was sent upstream."""
    calls: int = 0
    """Requests sent upstream so far."""
    prompt_tokens: int | None = None
    """Input tokens the provider reported for the previous request."""
    cached_tokens: int | None = None
    """Of those, read from the provider's cache (``None``: the provider does not say)."""
    media_cut: int = 0
    """Media-bearing messages, oldest first, whose media parts are offloaded."""
    soft_cut: int = 0
    """Tool results before this message index are soft-trimmed by the cache-TTL prune."""
    archive_cut: int = 0
    """Tool results before this message index are archived by the cache-TTL prune."""
    restore_tool: bool = False
    """The gateway has added its restore tool to this conversation's requests: it keeps
    doing so, so that the tools array does not change from turn to turn."""
    seen: int = 0
    """Messages in the previous request."""
    last_digest: str = ""
    """Digest of the previous request's last message: a request that does not have it at
    the same place is not a continuation (another conversation under the same identity,
    or an edited history), and the record does not apply to it."""
    also_seen: int = 0
    """Messages of another history the previous request stands for (0: none): when the
    gateway compacted it for its client, the record follows the checkpoint's history, and
    this is the client's own, which a client that never got the compaction sends again."""
    also_digest: str = ""
    """Digest of that history's last message."""
    sent_tokens: int | None = None
    """Tokens the pipeline sent for the previous request."""
    checkpoint: dict[str, Any] | None = None
    """The checkpoint the previous request applied (``pipelines.checkpoints.Checkpoint``
    as a dict), applied again while compress's cut stays."""
    compacted_cut: int = 0
    """Compress's cut on the previous request (0: it did not cut)."""
    compacted_pins: tuple[int, ...] = ()
    """Messages before that cut kept whole because they were protected then."""
    thin_compactions: int = 0
    """Compaction events in a row that each saved under 10% of the request."""
    cold_sent: bool = False
    """The previous request went out on a cold cache, or broke its cached prefix (a cache
    break the pipeline predicted: a compaction event, changed tools, ...), so the
    provider's cache-hit feedback on it says nothing about the cache now."""
    # What the provider's prefix cache keyed on in the previous request, for cache-break
    # detection (``pipelines.cache_break``); empty in records written before they were kept.
    model_hash: str = ""
    """Fingerprint of the model name."""
    system_hash: str = ""
    """Fingerprint of the system and developer messages."""
    tool_hashes: tuple[str, ...] | None = None
    """Fingerprint of each tool schema, in order (``None``: not recorded)."""
    sent_messages: int = 0
    """Messages the previous request sent upstream (after compaction)."""
    sent_last: str = ""
    """Fingerprint of the last of them, markers excluded: where the previous request's
    rolling cache breakpoint was, found again in this request's outgoing messages."""
    sent_prompt: str = ""
    """Digest of the previous request's messages as they went up, in the order the
    provider's prompt cache reads them (markers excluded; for Anthropic, less the system
    messages it sends apart, which ``system_hash`` covers): a request whose first
    ``sent_prompt_messages`` messages have the same digest extends that prompt."""
    sent_prompt_messages: int = 0
    """How many messages ``sent_prompt`` covers."""
    native_edits: int = 0
    """Context edits applied to this conversation's requests so far at the client's asking
    (``context_management``): by the provider (its ``applied_edits`` and compactions, as
    its answers report them) or by the gateway for it: the prefix changes the
    conversation went through at its client's asking, kept for its record (a break a
    provider's edit makes is judged from that request's own answer,
    ``gateway.context.cache_breaks``)."""
    answer_ids: tuple[str, ...] = ()
    """The ids the upstream gave the conversation's last answers (at most
    ``ANSWER_IDS``), oldest first: an answer translated for another API gets an id of the
    gateway's own when the upstream's repeats one of them (or is empty)."""

    def follows(self, messages: Sequence[Message]) -> bool:
        """Whether ``messages`` continue the previous request of this record."""
        if not self.seen:
            return True
        if len(messages) >= self.seen and digest(messages[self.seen - 1]) == self.last_digest:
            return True
        also = self.also_seen
        return (
            bool(also)
            and len(messages) >= also
            and digest(messages[also - 1]) == (self.also_digest)
        )

    def with_history(
        self,
        messages: Sequence[Message],
        *,
        sent_tokens: int,
        cold: bool,
        cuts: Mapping[str, Any] | None = None,
    ) -> ConversationState:
        """This state after sending ``messages`` (as ``sent_tokens``), with the ``cuts``
        the request applied first (``with_cuts``); ``cold``: they went out on a cold
        cache or broke the cached prefix."""
        history = {
            "seen": len(messages),
            "last_digest": digest(messages[-1]) if messages else "",
            "also_seen": 0,
            "also_digest": "",
            "sent_tokens": sent_tokens,
            "cold_sent": cold,
        }
        return _replace(self, **{**cuts, **history} if cuts else history)

    def standing_for(
        self, messages: Sequence[Message], *, sent_tokens: int, cold: bool
    ) -> ConversationState:
        """This state with ``messages`` as its history (a checkpoint's), the history it
        had still followed as well (``also_seen``)."""
        after = self.with_history(messages, sent_tokens=sent_tokens, cold=cold)
        return _replace(after, also_seen=self.seen, also_digest=self.last_digest)

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_json(cls, data: bytes) -> ConversationState:
        """The state in ``data``; fields it does not know are ignored, so states written by
        a newer replica can be read by an older one."""
        raw = orjson.loads(data)
        if not isinstance(raw, dict):
            raise ValueError("a conversation state is a JSON object")
        known = {f.name for f in fields(cls)}
        values: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k in known
        }
        return cls(**values)

    def answered(
        self,
        *,
        at: float,
        usage: Mapping[str, Any] | None = None,
        answer_id: str | None = None,
        edits: int = 0,
    ) -> ConversationState:
        """This state after a request sent upstream at ``at`` with ``usage`` reported and
        its answer's id ``answer_id``; ``edits``: the native edits the gateway applied to it
        (those the provider applied are in ``usage``)."""
        prompt, cached = usage_of(usage)
        provider = usage.get(NATIVE_EDITS) if usage is not None else None
        edits += provider if isinstance(provider, int) else 0
        ids = self.answer_ids
        if answer_id:
            ids = (*ids, answer_id)[-ANSWER_IDS:]
        return _replace(
            self,
            last_seen=at,
            calls=self.calls + 1,
            prompt_tokens=prompt,
            cached_tokens=cached,
            answer_ids=ids,
            native_edits=self.native_edits + edits,
        )

    def with_restore_tool(self) -> ConversationState:
        return _replace(self, restore_tool=True)

    def with_cuts(self, **cuts: Any) -> ConversationState:
        """This state with the cuts a request applied."""
        return _replace(self, **cuts)


def _replace(state: ConversationState, **changes: Any) -> ConversationState:
    """``state`` with ``changes``, made as the dataclass's ``__init__`` makes a state but
    through each field's slot directly: a frozen class's ``__init__`` sets its 28 fields
    one ``object.__setattr__`` call each, after taking them as keywords, twice the work
    (a request makes two new states). The class has no ``__post_init__`` to run."""
    if not changes.keys() <= _NAMES:
        unknown = ", ".join(sorted(changes.keys() - _NAMES))
        raise TypeError(f"ConversationState has no field {unknown}")
    new = object.__new__(ConversationState)
    for name, get, put in _SLOTS:
        put(new, changes[name] if name in changes else get(state))
    return new


_FIELDS: Final = tuple(f.name for f in fields(ConversationState))
"""Looked up once: ``dataclasses.fields`` builds its answer on every call."""
_NAMES: Final = frozenset(_FIELDS)
_SLOTS: Final = tuple(
    (name, ConversationState.__dict__[name].__get__, ConversationState.__dict__[name].__set__)
    for name in _FIELDS
)
"""Each field's name and its slot's getter and setter."""


def cache_status(state: ConversationState | None, *, ttl: int, now: float) -> tuple[bool, str]:
    """Whether the provider's prompt cache is cold for the conversation, and why.

    A conversation never seen is cold (nothing of it can be cached). Time decides first:
    past the model family's TTL the entry is gone whatever the provider said before. Within
    it, provider feedback on a stable sample (2+ calls or 4,000+ tokens) can say the cache
    is not working (hit rate under 0.12), unless that request itself went out cold (its
    misses were expected); otherwise it is hot.
    """
    if state is None or state.last_seen is None:
        return True, "new"
    if now - state.last_seen > ttl:
        return True, "expired"
    if state.cached_tokens is not None and state.prompt_tokens and not state.cold_sent:
        stable = state.calls >= _STABLE_CALLS or state.prompt_tokens >= _STABLE_TOKENS
        if stable and state.cached_tokens / state.prompt_tokens < COLD_HIT_RATE:
            return True, "low hit rate"
    return False, "hot"


def usage_of(usage: Mapping[str, Any] | None) -> tuple[int | None, int | None]:
    """Prompt and cached tokens from an OpenAI ``usage`` object (``None`` when absent)."""
    if not isinstance(usage, Mapping):
        return None, None
    prompt = usage.get("prompt_tokens")
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    return (
        prompt if isinstance(prompt, int) and not isinstance(prompt, bool) else None,
        cached if isinstance(cached, int) and not isinstance(cached, bool) else None,
    )


def digest(message: Message) -> str:
    """A digest of one message, stable across processes. Its ``cache_control`` markers are
    left out: a client that moves its own breakpoint (one on its newest message, say)
    still continues the same history."""
    data = orjson.dumps(without_markers(message), option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(data, digest_size=12).hexdigest()


def conversation_id(namespace: str, messages: Sequence[Message], session: str = "") -> str:
    """A stable identity for a conversation the client did not name: the namespace, the
    client's own session id if it sends one (``session``), the system prompt and the first
    user message, hashed. The session tells apart users of one app who open alike; the
    opening tells apart the conversations of one session (an agent's subagents)."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(namespace.encode())
    if session:
        digest.update(b"\0session\0" + session.encode())
    first_user = False
    for message in messages:
        role = message.get("role")
        if role in ("system", "developer") or (role == "user" and not first_user):
            digest.update(b"\0" + orjson.dumps(message, option=orjson.OPT_SORT_KEYS))
            first_user = first_user or role == "user"
        if first_user:
            break
    return "conv_" + digest.hexdigest()
