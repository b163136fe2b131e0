"""Stage 5: old tool results trimmed while the provider's prompt cache is cold.

A long agent session carries tool results that stopped mattering many turns ago. Rewriting
them breaks the provider's cached prefix, so the time to do it is when that cache is cold
anyway: the conversation is new, was idle past the model's cache TTL, or the provider
reports it is not caching. Then every tool result before the last three assistant turns,
outside the anchor, is

- soft-trimmed from ``soft-ratio`` (default 0.30): text keeps its first and last 1,500
  characters, JSON is cut by structure and stays valid JSON;
- archived from ``hard-ratio`` (default 0.50): replaced by a one-line stub.

The original is written to the store first and its ref goes into the rewritten message;
when the store does not acknowledge, the result stays as it is. New work per pass is
bounded (8 archives, 2 MB, 200 ms); what is left waits for the next pass.

How far it went is kept in the conversation's record as two cuts (``soft_cut``,
``archive_cut``: tool results before that index). On the next request, warm cache or not,
the same rewrites are applied again up to those cuts (same bytes, as refs are
content-addressed), so the outgoing prefix does not move; the cuts themselves only advance
on a cold cache.

With a warm cache the stage does nothing new even under pressure: compress (stage 6) deals
with pressure, with cuts that stay put from turn to turn. Letting this stage move its cuts
under pressure too was measured on the tau-bench replays at max-input 4,000: the two
mechanisms moved each other's cuts, and the cost under cache pricing rose from 1.19x to
1.24-1.30x of the raw history (docs/DECISIONS.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, Final

import orjson

from pipelines.conversation import Conversation
from pipelines.lru import Lru, text_bytes
from pipelines.messages import Message, original_bytes
from pipelines.preview import text_digest, trim_json
from pipelines.stage import REF_PATTERN, StageContext

__all__ = ["TtlPrune"]

_JSON_START: Final = ("[", "{")
_SHORTENED_KEPT: Final = 2_048
_SHORTENED_BYTES: Final = 512 * 1024
_REWRITES_KEPT: Final = 8_192
_REWRITES_BYTES: Final = 512 * 1024
_REWRITE_BYTES: Final = 640
"""What a kept rewrite costs besides its content: the message's dict, its key tuple and
the ref."""


@dataclass(frozen=True, slots=True)
class TtlPrune:
    name: str = "ttl_prune"
    protected_turns: int = 3
    """Assistant turns, newest first, whose tool results are never touched."""
    head_chars: int = 1_500
    tail_chars: int = 1_500
    archive_min_chars: int = 400
    """Tool results shorter than this are not worth a stub."""
    max_archives: int = 8
    max_bytes: int = 2 * 1024 * 1024
    max_ms: float = 200.0
    _shortened: Lru[bytes, str] = field(
        default_factory=lambda: Lru(entries=_SHORTENED_KEPT, max_bytes=_SHORTENED_BYTES),
        repr=False,
        compare=False,
    )
    """Trimmed texts already made: the same results are trimmed again on every request."""
    _rewrites: Lru[tuple[Any, ...], tuple[Message, str]] = field(
        default_factory=lambda: Lru(entries=_REWRITES_KEPT, max_bytes=_REWRITES_BYTES),
        init=False,
        repr=False,
        compare=False,
    )
    """Rewrites made on earlier requests, with the ref each names."""

    async def __call__(self, conversation: Conversation, ctx: StageContext) -> Conversation:
        if ctx.policy.mode == "off":
            return conversation
        messages = conversation.messages
        limit = _protected_from(messages, self.protected_turns)
        cuts = _Cuts(min(ctx.cut("soft_cut"), limit), min(ctx.cut("archive_cut"), limit))
        if not ctx.cold:
            # Warm cache: the earlier rewrites again, nothing new. Pressure is compress's
            # job, whose cuts are stable from turn to turn (see the module docstring).
            if max(cuts.soft, cuts.archive) == 0:
                return conversation
            return await self._pass(conversation, ctx, cuts, cuts, limit)
        utilisation = ctx.tokens(conversation) / ctx.budget.input_tokens
        soft = ctx.policy.soft_ratio or ctx.model.soft_ratio
        hard = ctx.policy.hard_ratio or ctx.model.hard_ratio
        goals = _Cuts(
            limit if utilisation >= soft else cuts.soft,
            limit if utilisation >= hard else cuts.archive,
        )
        if max(goals.soft, goals.archive) == 0:
            return conversation
        return await self._pass(conversation, ctx, cuts, goals, limit)

    async def _pass(
        self, conversation: Conversation, ctx: StageContext, cuts: _Cuts, goals: _Cuts, limit: int
    ) -> Conversation:
        """Rewrite the tool results before ``goals`` (those before ``cuts`` again, the rest
        as new work within the per-pass bound) and record the cuts reached."""
        if ctx.store is None:
            ctx.record(skipped="no store")
            return conversation
        messages = conversation.messages
        soft_goal, archive_goal = goals.soft, goals.archive
        work = _Work(self, perf_counter())
        anchor = _anchor(messages)
        rewritten = list(messages)
        archived = trimmed = 0
        for index in range(max(soft_goal, archive_goal)):
            message = messages[index]
            text = _text(message)
            if text is None or index in anchor:
                continue
            new = None
            if index < archive_goal and len(text) >= self.archive_min_chars:
                fresh, dearer = index >= cuts.archive, False
                if not fresh or work.allows(text, archive=True):
                    name = _call_name(messages, index)
                    new = await self._again(ctx, index, messages, ("archive", name))
                    if new is None:
                        whole = _received_text(ctx, message, text)
                        dearer = not _saves(ctx, message, _stub(name, whole, _SAMPLE_REF))
                        if not dearer:
                            new = await self._archive(message, whole, name, ctx)
                    self._keep(ctx, index, messages, ("archive", name), new)
                    if new is not None:
                        archived += 1
                        work.done(text, archive=fresh)
                if new is None and fresh and not dearer:
                    archive_goal = index  # out of budget or store: stop advancing here
            if new is None and index < soft_goal and len(text) > self._trim_floor:
                fresh = index >= cuts.soft
                if not fresh or work.allows(text, archive=False):
                    new = await self._again(ctx, index, messages, ("trim",))
                    if new is None:
                        short = self._shorter(text)
                        full = len(_received_text(ctx, message, text))
                        if not _saves(ctx, message, _trim_note(full, _SAMPLE_REF), short):
                            continue  # the part cut is cheaper than the note: leave it
                        new = await self._trimmed(message, full, short, ctx)
                    self._keep(ctx, index, messages, ("trim",), new)
                    if new is not None:
                        trimmed += 1
                        work.done(text, archive=False)
                if new is None and fresh:
                    soft_goal = index
            if new is not None:
                rewritten[index] = new
        reached = _Cuts(max(soft_goal, cuts.soft), max(archive_goal, cuts.archive))
        ctx.carry.update(soft_cut=reached.soft, archive_cut=reached.archive)
        ctx.record(soft_trimmed=trimmed, archived=archived, moved=reached != cuts)
        if not (trimmed or archived):
            return conversation
        return conversation.with_messages(rewritten)

    @property
    def _trim_floor(self) -> int:
        return self.head_chars + self.tail_chars + 500

    def _rewrite_key(
        self, ctx: StageContext, index: int, messages: Sequence[Message], kind: tuple[str, ...]
    ) -> tuple[Any, ...] | None:
        """The rewrite's identity: the message as received (its token-cache key; earlier
        stages rewrite it deterministically under the same policy), what is done to it, and
        the namespace."""
        keys = ctx.tokens.keys
        if keys is None or len(keys) != len(messages):
            return None
        policy = ctx.policy
        return (
            ctx.namespace,
            keys[index],
            kind,
            policy.filter_tokens,
            policy.compact_json,
            policy.offload_ttl,
        )

    async def _again(
        self, ctx: StageContext, index: int, messages: Sequence[Message], kind: tuple[str, ...]
    ) -> Message | None:
        """A rewrite made on an earlier request, when the object it names is still
        stored (a cheap check, where storing again would hash the whole output)."""
        key = self._rewrite_key(ctx, index, messages, kind)
        made = self._rewrites.get(key) if key is not None else None
        if made is None or not await ctx.confirmed(made[1]):
            return None
        return made[0]

    def _keep(
        self,
        ctx: StageContext,
        index: int,
        messages: Sequence[Message],
        kind: tuple[str, ...],
        new: Message | None,
    ) -> None:
        key = self._rewrite_key(ctx, index, messages, kind)
        if new is None or key is None:
            return
        content = str(new.get("content", ""))
        found = REF_PATTERN.search(content)
        if found is None:
            return
        self._rewrites.put(key, (new, found.group()), text_bytes(content) + _REWRITE_BYTES)

    async def _archive(
        self, message: Message, whole: str, name: str, ctx: StageContext
    ) -> Message | None:
        """``message`` as a stub naming the ref of ``whole``, its output as received."""
        ref = await ctx.offload(original_bytes(ctx.as_received(message)))
        if ref is None:
            return None
        return {**message, "content": _stub(name, whole, ref)}

    async def _trimmed(
        self, message: Message, full: int, short: str, ctx: StageContext
    ) -> Message | None:
        """``message`` as ``short`` under a note naming the ref of its output as received
        (``full`` characters)."""
        ref = await ctx.offload(original_bytes(ctx.as_received(message)))
        if ref is None:
            return None
        return {**message, "content": f"{_trim_note(full, ref)}\n{short}"}

    def _shorter(self, text: str) -> str:
        key = text_digest(text)
        short = self._shortened.get(key)
        if short is None:
            short = self._shorten(text)
            self._shortened.put(key, short, text_bytes(short) + len(key))
        return short

    def _shorten(self, text: str) -> str:
        if text.lstrip()[:1] in _JSON_START:
            try:
                value = orjson.loads(text)
            except orjson.JSONDecodeError:
                value = None
            if isinstance(value, list | dict):
                short = orjson.dumps(trim_json(value)).decode()
                if len(short) < len(text) // 2:
                    return short
        cut = len(text) - self.head_chars - self.tail_chars
        return (
            f"{text[: self.head_chars]}\n... [{cut:,} characters cut] ...\n"
            f"{text[-self.tail_chars :]}"
        )


@dataclass(slots=True)  # not frozen, for its cost: never changed once made
class _Cuts:
    soft: int
    archive: int


class _Work:
    """The bound on new work in one pass."""

    __slots__ = ("archives", "bytes", "stage", "started")

    def __init__(self, stage: TtlPrune, started: float) -> None:
        self.stage, self.started = stage, started
        self.archives = self.bytes = 0

    def allows(self, text: str, *, archive: bool) -> bool:
        stage = self.stage
        return (
            (not archive or self.archives < stage.max_archives)
            and self.bytes + len(text) <= stage.max_bytes
            and (perf_counter() - self.started) * 1000 < stage.max_ms
        )

    def done(self, text: str, *, archive: bool) -> None:
        self.bytes += len(text)
        self.archives += archive


def _stub(name: str, text: str, ref: str) -> str:
    """What an archived output becomes, giving the sizes of what the ref restores (the
    output as the client sent it)."""
    lines = text.count("\n") + 1
    return (
        f"[Archived output of {name}: {len(text):,} characters, {lines:,} lines, stored as"
        f" {ref}. Restore it if it is needed again; do not guess its content.]"
    )


_SAMPLE_REF: Final = "ctx_FNHy43GQUKimepCWtDjuhAj3"
"""A ref as long and as random as real ones: what a stub will cost can be counted before
the output is stored."""


def _trim_note(full: int, ref: str) -> str:
    """The line a trimmed output opens with; ``full`` is the length of what ``ref``
    restores."""
    return f"[Trimmed to save space: {full:,} characters in full, stored as {ref}.]"


def _received_text(ctx: StageContext, message: Message, text: str) -> str:
    """The output as the client sent it (what a ref restores), of which ``text`` is what
    the earlier stages made."""
    return _text(ctx.as_received(message)) or text


def _saves(ctx: StageContext, message: Message, *lines: str) -> bool:
    """Whether ``message`` with ``lines`` as its content costs fewer tokens. An output of a
    few hundred characters that tokenizes densely (blank lines, a repeated character) can
    cost less than a stub, about 60 tokens; a trim whose cut part is blank can cost more
    than the whole. Counted exactly (the counter's cache, never this request's estimates),
    so that the same output gets the same answer on every request and every replica."""
    counter = ctx.counter
    cost = counter.count_message({**message, "content": "\n".join(lines)})
    if len(message.get("content") or "") > cost * _TOKEN_CHARS_MAX:
        return True  # it cannot cost that little: the whole need not be tokenized
    return cost < counter.count_message(message)


_TOKEN_CHARS_MAX: Final = 128
"""No token of o200k or cl100k spans more than 128 bytes, so a text costs at least a token
per 128 characters."""


def _protected_from(messages: Sequence[Message], turns: int) -> int:
    """Index of the first message of the last ``turns`` assistant turns."""
    seen = 0
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "assistant":
            seen += 1
            if seen == turns:
                return index
    return 0


def _anchor(messages: Sequence[Message]) -> frozenset[int]:
    """The first user message and the assistant message answering it, with its tool
    results (the anchor: docs/ARCHITECTURE.md, "The pipeline")."""
    first = next((i for i, m in enumerate(messages) if m.get("role") == "user"), None)
    if first is None:
        return frozenset()
    end = first + 1
    if end < len(messages) and messages[end].get("role") == "assistant":
        end += 1
        while end < len(messages) and messages[end].get("role") == "tool":
            end += 1
    return frozenset(range(first, end))


def _call_name(messages: Sequence[Message], index: int) -> str:
    """The tool name behind the tool message at ``index``: its own ``name``, or that of the
    call it answers in the assistant message before it (call ids may repeat)."""
    message = messages[index]
    name = message.get("name")
    if isinstance(name, str) and name:
        return name
    call_id = message.get("tool_call_id")
    for before in range(index - 1, -1, -1):
        if messages[before].get("role") == "assistant":
            for call in messages[before].get("tool_calls") or ():
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict) and call.get("id") == call_id:
                    return str(function.get("name") or "a tool")
            break
    return "a tool"


def _text(message: Message) -> str | None:
    if message.get("role") != "tool":
        return None
    content: Any = message.get("content")
    return content if isinstance(content, str) else None
