"""Stage 5: deterministic compaction, stable from turn to turn.

Clients resend the whole raw history on every request, so compaction must give the same
compacted prefix each time the same history comes back with more appended; otherwise every
turn would break the provider's prompt cache. The stage therefore works in three steps,
each a function of the messages before a point, never of the ones after it:

1. **Dedup** (from 50% utilisation): a tool output of 200+ characters identical to an
   earlier one is replaced by a note naming the earlier call and a ref to the content.
2. **Cut** (from ``trigger``): the compactable span starts after the anchor and ends at a
   *cut*. Cuts sit on a fixed grid: the first group boundary after each multiple of
   ``(trigger - target) x budget`` tokens of the raw span, or, when no grid cut is enough,
   the last group before the protected tail. The stage takes the first grid cut that
   brings the request under ``trigger``. As the history grows the cut stays put: the
   previous request's cut (the conversation's record) is applied again, on the grid or
   not, while the request fits under ``trigger`` with it, and the next one is only taken
   after that much growth, which leaves the request near ``target`` again. So compaction
   events are rare and between them the outgoing prefix does not change. A cut that would
   save less than the room left under the budget (clamped to 500-3,000 tokens), compared
   with the previous cut (or with no cut), is not taken while the request fits.
3. **Span**: inside the span, user messages are kept whole, final answers are kept (long
   ones shortened) while they fit the span's share of the budget, oldest dropped first, and
   tool-call groups and interim assistant text are removed; each removed run becomes one
   short user-role note listing the ref of what it held. Nothing here depends on messages
   after the cut (priorities are taken without the latest user message's goal terms).

Everything removed or shortened is written to the store first; without a store (or if a
write fails) nothing is compacted.

When even the first cut cannot bring the request under the budget (the tail itself is too
big: the emergency case), the largest tool outputs and assistant texts outside the system
prompt and the latest user message are shortened, originals stored first, until it fits.
The report records the level reached (``level``: light, full) and the cut (``cut``), so a
compaction event is visible as a change of either, or as ``emergency_shortened``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate, pairwise
from typing import Any, Final

import orjson

from pipelines.conversation import Conversation
from pipelines.errors import StoreError
from pipelines.groups import ANSWER, Group, protect, split_groups
from pipelines.messages import Message, original_bytes
from pipelines.notes import removal_note
from pipelines.preview import preview, trim_json
from pipelines.stage import REF_PATTERN, Compacted, StageContext

__all__ = ["Compress", "compactable"]

_DEDUP_MIN_CHARS: Final = 200
_NOT_KEPT: Final = "no copy is kept (the offload store could not take it)"
_PENDING_REF: Final = "@@contextgate-pending-ref@@"
"""Stands for the ref in shortened arguments until the original is stored."""
MAX_MIN_SAVING: Final = 3_000
MIN_SAVING_FLOOR: Final = 500
"""A cut must save at least the room left under the budget, clamped to these tokens (so
less is asked as room shrinks), unless the request is over the budget."""


THIN_EVENTS: Final = 2
THIN_SAVING: Final = 0.10
"""Anti-thrashing: after this many compaction events in a row each saving under this
share of the request (compared with keeping the previous cut), the previous cut is kept
until ``emergency``."""

_MEMOS_KEPT: Final = 1_024
MEMO_CHARS: Final = 32_000_000
"""Characters the remembered cuts of all conversations may hold together: each keeps the
tool outputs before its cut, a whole history's worth on a long conversation."""


@dataclass(frozen=True, slots=True)
class _Memo:
    """A conversation's last cut, to apply again to its next request."""

    signature: tuple[Any, ...]
    keys: list[Any]
    """Token-cache keys of the messages before the cut and the one after it, as received."""
    out: tuple[Message, ...]
    """What stands for those messages once compacted."""
    out_tokens: int
    deduped_tokens: int
    """Tokens of those messages after deduplication, before compaction."""
    cut: int
    span_start: int
    refs: tuple[str, ...]
    """Objects ``out`` names: confirmed in the store before ``out`` is sent again."""
    seen: dict[str, Message]
    """Tool outputs before the cut, for deduplicating the messages after it."""
    chars: int
    """What the memo holds, in characters: ``seen``'s texts, ``out`` as JSON, the keys."""


class _Memos:
    """The last cut of recent conversations: at most ``_MEMOS_KEPT`` of them and ``chars``
    characters together, the least recently used dropped first."""

    __slots__ = ("_chars", "_memos", "chars")

    def __init__(self, chars: int) -> None:
        self.chars = chars
        self._memos: OrderedDict[tuple[Any, ...], _Memo] = OrderedDict()
        self._chars = 0

    def __len__(self) -> int:
        return len(self._memos)

    @property
    def held(self) -> int:
        """Characters the memos hold now."""
        return self._chars

    def get(self, key: tuple[Any, ...]) -> _Memo | None:
        return self._memos.get(key)

    def used(self, key: tuple[Any, ...]) -> None:
        self._memos.move_to_end(key)

    def put(self, key: tuple[Any, ...], memo: _Memo) -> None:
        previous = self._memos.pop(key, None)
        if previous is not None:
            self._chars -= previous.chars
        self._memos[key] = memo
        self._chars += memo.chars
        while len(self._memos) > _MEMOS_KEPT or self._chars > self.chars:
            self._chars -= self._memos.popitem(last=False)[1].chars


class _NoStore(Exception):
    """The store could not take an object: compaction is abandoned, nothing is lost."""


@dataclass(frozen=True, slots=True)
class Compress:
    name: str = "compress"
    span_share: float = 0.10
    """Share of the budget the compacted span may take."""
    keep_chars: int = 1_200
    """Longest text kept as it is in the span, or in the tail in an emergency."""
    memo_chars: int = MEMO_CHARS
    """Characters the last cuts of recent conversations, kept to be re-applied without
    recomputing them, may hold together."""
    _memos: _Memos = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_memos", _Memos(self.memo_chars))

    async def __call__(self, conversation: Conversation, ctx: StageContext) -> Conversation:
        policy, budget = ctx.policy, ctx.budget.input_tokens
        if (
            policy.mode == "off"
            or ctx.tokens(conversation) < min(policy.light, policy.trigger) * budget
        ):
            return conversation
        if ctx.store is None:
            ctx.record(skipped="no store")
            return await self._lossy(conversation, ctx)
        try:
            reused = await self._reuse(conversation, ctx)
            if reused is not None:
                result = reused
            else:
                ctx.record(level="light")
                deduped = await self._dedup(conversation, ctx)
                result = deduped
                if ctx.tokens(result) > policy.trigger * budget:
                    ctx.record(level="full")
                    result = await self._cut(result, ctx)
                    self._remember(conversation, deduped, result, ctx)
            cut = ctx.details.get("cut")
            if isinstance(cut, int):
                messages = conversation.messages
                after = result.messages[len(result.messages) - (len(messages) - cut) :]
                basis = conversation.with_messages([*messages[:cut], *after])
                ctx.compacted = Compacted(conversation, int(ctx.details["span_start"]), cut, basis)
            ctx.carry["compacted_cut"] = cut if isinstance(cut, int) else 0
            if ctx.tokens(result) > budget:
                result = await self._emergency(result, ctx)
            if isinstance(cut, int):
                # The compaction boundary: the last message of the compacted span.
                kept = len(conversation.messages) - cut
                ctx.boundary = result.messages[len(result.messages) - kept - 1]
        except _NoStore:
            ctx.compacted = None
            ctx.boundary = None
            ctx.carry["compacted_cut"] = 0
            ctx.record(skipped="store unavailable", store_failures=1)
            return await self._lossy(conversation, ctx)
        return result

    def _signature(self, conversation: Conversation, ctx: StageContext) -> tuple[Any, ...]:
        """What a cut depends on besides the messages before it: the budget, the policy,
        the cuts earlier stages applied, the anchor's protection, and (last) the index of
        the latest user message, which must come after the cut."""
        messages = conversation.messages
        users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        size = ctx.tokens.message
        anchored = bool(users) and (
            users[0] != users[-1]
            and size(messages[users[0]]) + size(messages[users[-1]]) <= ctx.budget.input_tokens // 2
        )
        policy = ctx.policy
        return (
            ctx.namespace,
            ctx.budget.input_tokens,
            policy.trigger,
            policy.target,
            policy.tail_ratio,
            policy.offload_ttl,
            policy.filter_tokens,
            policy.compact_json,
            ctx.cut("media_cut"),
            ctx.cut("soft_cut"),
            ctx.cut("archive_cut"),
            anchored,
            users[-1] if users else -1,
        )

    def _memo_key(self, ctx: StageContext) -> tuple[Any, ...] | None:
        keys = ctx.tokens.keys
        if not keys or len(keys) < 3:
            return None
        return (ctx.namespace, keys[0], keys[1], keys[2])

    def _remember(
        self,
        conversation: Conversation,
        deduped: Conversation,
        result: Conversation,
        ctx: StageContext,
    ) -> None:
        """Keep this request's cut for the next request of the conversation, when it was
        a clean one: a grid cut that brought the request under ``trigger``, with the
        latest user message after it, on a store that can confirm objects cheaply."""
        details = ctx.details
        cut = details.get("cut")
        key = self._memo_key(ctx)
        keys = ctx.tokens.keys
        if (
            not isinstance(cut, int)
            or not details.get("grid")
            or key is None
            or keys is None
            or len(keys) != len(conversation.messages)
            or getattr(ctx.store, "touch", None) is None
            or ctx.tokens(result) > ctx.policy.trigger * ctx.budget.input_tokens
        ):
            return
        signature = self._signature(conversation, ctx)
        if signature[-1] < cut:
            return
        messages = conversation.messages
        size = ctx.tokens.message
        out = tuple(result.messages[: len(result.messages) - (len(messages) - cut)])
        seen: dict[str, Message] = {}
        for message in messages[:cut]:
            content = message.get("content")
            if (
                message.get("role") == "tool"
                and isinstance(content, str)
                and len(content) >= _DEDUP_MIN_CHARS
            ):
                seen.setdefault(content, message)
        out_json = orjson.dumps(out).decode()
        self._memos.put(
            key,
            _Memo(
                signature=(*signature[:-1], self.span_share, self.keep_chars),
                keys=keys[: cut + 1],
                out=out,
                out_tokens=sum(size(m) for m in out),
                deduped_tokens=sum(size(m) for m in deduped.messages[:cut]),
                cut=cut,
                span_start=int(details.get("span_start", 0)),
                refs=tuple(sorted(set(REF_PATTERN.findall(out_json)))),
                seen=seen,
                chars=sum(map(len, seen)) + len(out_json) + 8 * (cut + 1),
            ),
        )

    async def _reuse(self, conversation: Conversation, ctx: StageContext) -> Conversation | None:
        """The previous request's cut applied again, when this request continues it and
        the full computation would choose the same cut (checked: no other cut went out
        since, the same messages before it, the same signature, the latest user message
        after it, the result under ``trigger``; earlier cuts only grow with the history, so
        they still fail). The output is then what the full computation gives, without
        recomputing it."""
        key = self._memo_key(ctx)
        memo = self._memos.get(key) if key is not None else None
        keys = ctx.tokens.keys
        if memo is None or keys is None:
            return None
        messages = conversation.messages
        cut = memo.cut
        if ctx.cut("compacted_cut") not in (0, cut):
            # Another cut went out since: the full computation keeps that one while it fits.
            return None
        # The message right after the cut too: whether the last assistant text before it
        # counts as a final answer depends on what follows it.
        if len(keys) != len(messages) or len(messages) <= cut or keys[: cut + 1] != memo.keys:
            return None
        signature = self._signature(conversation, ctx)
        if signature[-1] < cut:
            return None
        if (*signature[:-1], self.span_share, self.keep_chars) != memo.signature:
            return None
        size = ctx.tokens.message
        tail = list(messages[cut:])
        duplicates = await self._deduplicated(tail, dict(memo.seen), ctx)
        total = ctx.tokens(conversation)
        prefix = sum(size(m) for m in messages[:cut])
        tail_change = sum(
            size(new) - size(old) for new, old in zip(tail, messages[cut:], strict=True)
        )
        deduped_total = total - prefix + memo.deduped_tokens + tail_change
        tokens = total - prefix + memo.out_tokens + tail_change
        limit = ctx.policy.trigger * ctx.budget.input_tokens
        if deduped_total <= limit or tokens > limit:
            return None
        for ref in memo.refs:
            if not await ctx.confirmed(ref):
                return None
        self._memos.used(key)  # type: ignore[arg-type]
        result = conversation.with_messages([*memo.out, *tail])
        ctx.tokens.remember(result, tokens)
        ctx.record(level="full", cut=cut, span_start=memo.span_start, reused=True)
        if duplicates:
            ctx.record(duplicates=duplicates)
        return result

    async def _lossy(self, conversation: Conversation, ctx: StageContext) -> Conversation:
        """Without a store nothing is removed, unless the request cannot be sent at all
        otherwise: then the emergency shortening runs with no copy kept, and each
        shortened text says so."""
        if ctx.tokens(conversation) <= ctx.budget.input_tokens:
            return conversation
        return await self._emergency(conversation, ctx, lossy=True)

    async def _store(self, ctx: StageContext, content: bytes) -> str:
        assert ctx.store is not None
        try:
            return await ctx.store.put(ctx.namespace, content, ttl=ctx.policy.offload_ttl)
        except StoreError as exc:
            raise _NoStore from exc

    async def _dedup(self, conversation: Conversation, ctx: StageContext) -> Conversation:
        out = list(conversation.messages)
        replaced = await self._deduplicated(out, {}, ctx)
        if not replaced:
            return conversation
        ctx.record(duplicates=replaced)
        return conversation.with_messages(out)

    async def _deduplicated(
        self, messages: list[Message], seen: dict[str, Message], ctx: StageContext
    ) -> int:
        """Replace, in place, each tool output of 200+ characters identical to one in
        ``seen`` or earlier in ``messages`` by a back-reference; how many were replaced."""
        replaced = 0
        for index, message in enumerate(messages):
            content = message.get("content")
            if message.get("role") != "tool" or not isinstance(content, str):
                continue
            if len(content) < _DEDUP_MIN_CHARS:
                continue
            earlier = seen.get(content)
            if earlier is None:
                seen[content] = message
                continue
            messages[index] = await self._duplicate(message, earlier, ctx)
            replaced += 1
        return replaced

    async def _duplicate(self, message: Message, earlier: Message, ctx: StageContext) -> Message:
        ref = await self._store(ctx, original_bytes(ctx.as_received(message)))
        return {
            **message,
            "content": f"[Identical to the output of the earlier call"
            f" {earlier.get('tool_call_id')}; stored as {ref}.]",
        }

    async def _cut(self, conversation: Conversation, ctx: StageContext) -> Conversation:
        messages = conversation.messages
        budget = ctx.budget.input_tokens
        size = ctx.tokens.message
        # No goal terms here: they come from the latest user message, and anything that
        # changes with later messages would make the compacted span change from turn to turn.
        groups = split_groups(messages)
        protection = protect(
            messages, groups, budget=budget, tail_ratio=ctx.policy.tail_ratio, tokens_of=size
        )
        span_groups = _span(groups, protection.indices, protection.tail_start)
        if not span_groups:
            return conversation
        step = max(1, int((ctx.policy.trigger - ctx.policy.target) * budget))
        limit = ctx.policy.trigger * budget
        start_tokens = ctx.tokens(conversation)
        # Candidates share most of their notes and shortened answers: made once each.
        made: dict[tuple[int, int], Message] = {}
        span_start = span_groups[0].start
        ends = [g.end for g in span_groups]
        raw = list(accumulate(sum(size(m) for m in messages[g.start : g.end]) for g in span_groups))
        grid = [now // step > before // step for before, now in pairwise([0, *raw])]
        # The previous request's cut is rendered as it was then: the messages protected
        # then (a latest user message since followed by another) stay protected at it.
        previous = ctx.cut("compacted_cut")
        state_pins = ctx.state.compacted_pins if ctx.state is not None else ()
        held = protection.indices | frozenset(i for i in state_pins if i < previous)

        def counted(candidate: Conversation, position: int) -> int:
            """Tokens of ``candidate``, the span cut after group ``position``: only the
            span changed, its old messages out, its new ones in."""
            end = span_groups[position].end
            new_span = candidate.messages[
                span_start : len(candidate.messages) - (len(messages) - end)
            ]
            tokens = start_tokens - raw[position] + sum(size(m) for m in new_span)
            ctx.tokens.remember(candidate, tokens)
            return tokens

        kept, kept_tokens = conversation, start_tokens
        if previous in ends:
            at = ends.index(previous)
            kept = await self._compact_span(conversation, span_groups[: at + 1], held, ctx, made)
            kept_tokens = counted(kept, at)

        def stay() -> Conversation:
            """The previous request's cut applied again; with none, nothing cut."""
            if kept is conversation:
                return conversation
            return self._recorded(kept, previous, span_start, held, grid[at], ctx)

        if kept_tokens <= limit:
            # The cut stays put while the request fits under ``trigger`` with it, wherever
            # it sits: moving it is a compaction event, which breaks the cached prefix.
            return stay()

        def protected_at(cut: int) -> frozenset[int]:
            return held if cut == previous else protection.indices

        best, best_tokens, best_cut, best_grid = conversation, start_tokens, 0, False
        for position, group in enumerate(span_groups):
            on_grid = grid[position]
            if not on_grid and position < len(span_groups) - 1:
                continue
            candidate = await self._compact_span(
                conversation, span_groups[: position + 1], protected_at(group.end), ctx, made
            )
            tokens = counted(candidate, position)
            if tokens < best_tokens:
                best, best_tokens, best_cut, best_grid = candidate, tokens, group.end, on_grid
            if tokens <= limit:
                break
        if best_cut == previous or best_tokens >= kept_tokens:
            return stay()
        # A move is weighed against what goes out without it: the previous cut, if any.
        saving = kept_tokens - best_tokens
        minimum = min(MAX_MIN_SAVING, max(MIN_SAVING_FLOOR, budget - kept_tokens))
        if saving < minimum and kept_tokens <= budget:
            # Not worth breaking the cached prefix for; the next turns will save more.
            ctx.record(skipped_saving=saving, minimum_saving=minimum)
            return stay()
        if kept is not conversation:
            # A compaction event: moving the cut from where the previous request had it.
            # When such moves keep saving little, the previous cut is kept instead
            # (anti-thrashing), while the request stays under ``emergency``.
            thin = kept_tokens - best_tokens < THIN_SAVING * start_tokens
            thin_before = ctx.cut("thin_compactions")
            if thin and thin_before >= THIN_EVENTS and kept_tokens <= ctx.policy.emergency * budget:
                ctx.record(anti_thrash=True)
                return stay()
            ctx.carry["thin_compactions"] = thin_before + 1 if thin else 0
        return self._recorded(best, best_cut, span_start, protected_at(best_cut), best_grid, ctx)

    @staticmethod
    def _recorded(
        result: Conversation,
        cut: int,
        span_start: int,
        protected: frozenset[int],
        on_grid: bool,
        ctx: StageContext,
    ) -> Conversation:
        """``result``, cut at ``cut``, recorded as this request's cut, with the messages
        before it kept whole because they were protected, for the next request."""
        ctx.record(cut=cut, span_start=span_start, grid=on_grid)
        ctx.carry["compacted_pins"] = sorted(i for i in protected if span_start <= i < cut)
        return result

    async def _compact_span(
        self,
        conversation: Conversation,
        span: list[Group],
        protected: frozenset[int],
        ctx: StageContext,
        made: dict[tuple[int, int], Message],
    ) -> Conversation:
        """The conversation with the groups of ``span`` compacted. ``made`` keeps notes
        and shortened answers by their message range, for the next candidate."""
        messages = conversation.messages
        size = ctx.tokens.message
        # User messages are kept whole and final answers (long ones shortened) while they
        # fit the span's share of the budget: answers go first, then user messages, the
        # oldest first in each; all else is removed. Protected messages always stay.
        pinned = {g.start for g in span if g.start in protected}
        users = [
            g.start
            for g in span
            if g.start not in pinned and messages[g.start].get("role") == "user"
        ]
        kept: dict[int, Message] = {}
        for group in span:
            message = messages[group.start]
            if (
                group.start not in pinned
                and group.end - group.start == 1
                and group.priority == ANSWER
                and message.get("role") == "assistant"
            ):
                short = made.get((group.start, -1))
                if short is None:
                    short = made[group.start, -1] = await self._shortened(message, ctx)
                kept[group.start] = short
        allowance = self.span_share * ctx.budget.input_tokens
        used = sum(size(messages[i]) for i in (*pinned, *users))
        used += sum(size(m) for m in kept.values())
        order = sorted(kept)
        while order and used > allowance:
            used -= size(kept.pop(order.pop(0)))
        users.reverse()
        while users and used > allowance:
            used -= size(messages[users.pop()])
        pinned.update(users)
        out: list[Message] = list(messages[: span[0].start])
        run = -1  # start of the run of removed groups, if any
        for group in span:
            if group.start in kept or group.start in pinned:
                if run >= 0:
                    out.append(await self._note(messages, run, group.start, ctx, made))
                    run = -1
                if group.start in pinned:
                    out.extend(messages[group.start : group.end])
                else:
                    out.append(kept[group.start])
            elif run < 0:
                run = group.start
        if run >= 0:
            out.append(await self._note(messages, run, span[-1].end, ctx, made))
        out.extend(messages[span[-1].end :])
        return conversation.with_messages(out)

    async def _shortened(
        self,
        message: Message,
        ctx: StageContext,
        keep_chars: int | None = None,
        *,
        lossy: bool = False,
    ) -> Message:
        keep = self.keep_chars if keep_chars is None else keep_chars
        content = message.get("content")
        if not isinstance(content, str) or len(content) <= max(keep, 120):
            return message
        if lossy:
            note = f"[Shortened to fit the context window; {_NOT_KEPT}]"
        else:
            ref = await self._store(ctx, original_bytes(ctx.as_received(message)))
            note = f"[Shortened; the full text is stored as {ref}.]"
        short = preview(content, keep) if keep else ""
        return {**message, "content": f"{note}\n{short}" if short else note}

    async def _note(
        self,
        messages: Sequence[Message],
        start: int,
        end: int,
        ctx: StageContext,
        made: dict[tuple[int, int], Message],
    ) -> Message:
        """The note standing for ``messages[start:end]``, removed."""
        note = made.get((start, end))
        if note is None:
            note = made[start, end] = await self._make_note(list(messages[start:end]), ctx)
        return note

    async def _make_note(self, removed: list[Message], ctx: StageContext) -> Message:
        try:
            return await removal_note(removed, ctx)
        except StoreError as exc:
            raise _NoStore from exc

    async def _emergency(
        self, conversation: Conversation, ctx: StageContext, *, lossy: bool = False
    ) -> Conversation:
        messages = list(conversation.messages)
        budget = ctx.budget.input_tokens
        size = ctx.tokens.message
        latest_user = max(
            (i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1
        )
        candidates = sorted(
            (
                i
                for i, m in enumerate(messages)
                if m.get("role") in ("tool", "assistant", "user")
                and i != latest_user
                and (isinstance(m.get("content"), str) or m.get("tool_calls"))
            ),
            key=lambda i: (-size(messages[i]), i),
        )
        shortened: set[int] = set()
        # Ever shorter: a long preview, a short one, then the ref alone; tool-call
        # arguments have their long strings cut first and stay valid JSON.
        total = ctx.tokens(conversation)
        for keep in (self.keep_chars, self.keep_chars // 3, 0):
            for index in candidates:
                if total <= budget:
                    break
                shorter = await self._shortened(messages[index], ctx, keep, lossy=lossy)
                if shorter.get("tool_calls"):
                    shorter = await self._shrunk_arguments(shorter, ctx, lossy=lossy)
                if shorter is not messages[index]:
                    total += size(shorter) - size(messages[index])
                    messages[index] = shorter
                    shortened.add(index)
        if not shortened:
            return conversation
        ctx.record(**{"lossy_shortened" if lossy else "emergency_shortened": len(shortened)})
        result = conversation.with_messages(messages)
        ctx.tokens.remember(result, total)
        return result

    async def _shrunk_arguments(
        self, message: Message, ctx: StageContext, *, lossy: bool = False
    ) -> Message:
        """``message`` with its tool calls' arguments made smaller and still valid JSON:
        every string over ``ARGUMENT_CHARS`` cut to its head and tail, and arguments still
        long after that (big arrays or objects of short values) cut by structure. The
        original calls are stored first; each cut string names their ref, and so does a
        note in the message's text when structure was cut."""
        calls = message["tool_calls"]
        if not isinstance(calls, list):
            return message
        shrunk: list[Any] = []
        structural = False
        for call in calls:
            arguments = _arguments(call)
            try:
                value = orjson.loads(arguments) if len(arguments) > ARGUMENT_CHARS else None
            except orjson.JSONDecodeError:
                value = None
            short = None
            if value is not None:
                cut = _cut_strings(value, _PENDING_REF)
                if len(orjson.dumps(cut)) > 4 * ARGUMENT_CHARS:
                    cut, structural = trim_json(cut, chars=4 * ARGUMENT_CHARS), True
                text = orjson.dumps(cut).decode()
                if len(text) < len(arguments):
                    short = text
            shrunk.append((call, short))
        if all(short is None for _, short in shrunk):
            return message
        ref = _NOT_KEPT if lossy else await self._store(ctx, orjson.dumps(calls))
        named = ref if lossy else f"the original call is stored as {ref}"
        out = [
            call
            if short is None
            else {
                **call,
                "function": {
                    **call["function"],
                    "arguments": short.replace(_PENDING_REF, named.replace('"', "'")),
                },
            }
            for call, short in shrunk
        ]
        shorter = {**message, "tool_calls": out}
        if structural and not message.get("content"):
            shorter["content"] = f"[Tool call arguments shortened to fit; {named}.]"
        return shorter


ARGUMENT_CHARS: Final = 500
"""Strings in tool-call arguments longer than this are cut in an emergency."""
_ARGUMENT_HEAD, _ARGUMENT_TAIL = 200, 50


def _arguments(call: object) -> str:
    function = call.get("function") if isinstance(call, dict) else None
    arguments = function.get("arguments") if isinstance(function, dict) else None
    return arguments if isinstance(arguments, str) else ""


def _cut_strings(value: object, ref: str) -> object:
    if isinstance(value, str) and len(value) > ARGUMENT_CHARS:
        cut = len(value) - _ARGUMENT_HEAD - _ARGUMENT_TAIL
        head, tail = value[:_ARGUMENT_HEAD], value[-_ARGUMENT_TAIL:]
        return f"{head}...[{cut:,} characters cut; {ref}]...{tail}"
    if isinstance(value, dict):
        return {key: _cut_strings(item, ref) for key, item in value.items()}
    if isinstance(value, list):
        return [_cut_strings(item, ref) for item in value]
    return value


def compactable(
    conversation: Conversation, ctx: StageContext
) -> tuple[int, int, tuple[int, ...]] | None:
    """Where compaction may act in ``conversation``: from the first group after the
    system prompt and anchor to the protected tail (``None`` when that is empty), and the
    protected messages inside that range."""
    messages = conversation.messages
    groups = split_groups(messages)
    protection = protect(
        messages,
        groups,
        budget=ctx.budget.input_tokens,
        tail_ratio=ctx.policy.tail_ratio,
        tokens_of=ctx.tokens.message,
    )
    span = _span(groups, protection.indices, protection.tail_start)
    if not span:
        return None
    start, end = span[0].start, span[-1].end
    return start, end, tuple(sorted(i for i in protection.indices if start <= i < end))


def _span(groups: list[Group], protected: frozenset[int], tail_start: int) -> list[Group]:
    """The groups between the leading protected ones (system prompt, anchor) and the tail.
    A protected group inside it (the latest user message, before an agent loop) stays in
    place, whole."""
    start = 0
    while start < len(groups) and groups[start].start in protected:
        start += 1
    return [group for group in groups[start:] if group.end <= tail_start]
