"""The last cut of recent conversations, applied again without recomputing it.

On a long conversation nearly every request brings the same history as the one before it,
with a few messages appended, and most of them keep the previous cut. ``Memos`` keeps each
conversation's last clean cut (what stands for the messages before it, the refs that names,
the tool outputs deduplicated against) and ``reuse`` applies it to the next request when
the full computation is certain to choose the same cut and give the same output. The memos
are bounded in number and in characters, the least recently used dropped first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from pipelines.conversation import Conversation
from pipelines.messages import Message
from pipelines.stage import REF_PATTERN, StageContext
from pipelines.stages.compress.dedup import DEDUP_MIN_CHARS, deduplicated

__all__ = ["MEMO_CHARS", "Memos"]

_MEMOS_KEPT: Final = 1_024
MEMO_CHARS: Final = 2_000_000
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


class Memos:
    """The last cut of recent conversations: at most ``_MEMOS_KEPT`` of them and ``chars``
    characters together, the least recently used dropped first. ``settings`` are the
    stage's own parameters a cut depends on (its span share and longest kept text)."""

    __slots__ = ("_chars", "_memos", "chars", "settings")

    def __init__(self, chars: int, settings: tuple[Any, ...]) -> None:
        self.chars, self.settings = chars, settings
        self._memos: OrderedDict[tuple[Any, ...], _Memo] = OrderedDict()
        self._chars = 0

    def __len__(self) -> int:
        return len(self._memos)

    @property
    def held(self) -> int:
        """Characters the memos hold now."""
        return self._chars

    async def reuse(self, conversation: Conversation, ctx: StageContext) -> Conversation | None:
        """The previous request's cut applied again, when this request continues it and
        the full computation would choose the same cut (checked: no other cut went out
        since, the same messages before it, the same signature, the latest user message
        after it, the result under ``trigger``; earlier cuts only grow with the history, so
        they still fail). The output is then what the full computation gives, without
        recomputing it."""
        key = _memo_key(ctx)
        memo = self._memos.get(key) if key is not None else None
        if key is None or memo is None or not self._continued(memo, conversation, ctx):
            return None
        messages = conversation.messages
        cut = memo.cut
        size = ctx.tokens.message
        tail = list(messages[cut:])
        duplicates = await deduplicated(tail, dict(memo.seen), ctx)
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
        self._memos.move_to_end(key)
        result = conversation.with_messages([*memo.out, *tail])
        ctx.tokens.remember(result, tokens)
        ctx.record(level="full", cut=cut, span_start=memo.span_start, reused=True)
        if duplicates:
            ctx.record(duplicates=duplicates)
        return result

    def _continued(self, memo: _Memo, conversation: Conversation, ctx: StageContext) -> bool:
        """Whether ``conversation`` continues the request ``memo`` was made for, with
        nothing since that would move its cut."""
        keys = ctx.tokens.keys
        if keys is None:
            return False
        messages = conversation.messages
        cut = memo.cut
        if ctx.cut("compacted_cut") not in (0, cut):
            # Another cut went out since: the full computation keeps that one while it fits.
            return False
        # The message right after the cut too: whether the last assistant text before it
        # counts as a final answer depends on what follows it.
        if len(keys) != len(messages) or len(messages) <= cut or keys[: cut + 1] != memo.keys:
            return False
        signature = _signature(conversation, ctx)
        if signature[-1] < cut:
            return False
        return (*signature[:-1], *self.settings) == memo.signature

    def remember(
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
        key = _memo_key(ctx)
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
        signature = _signature(conversation, ctx)
        if signature[-1] < cut:
            return
        messages = conversation.messages
        size = ctx.tokens.message
        out = tuple(result.messages[: len(result.messages) - (len(messages) - cut)])
        seen = _tool_outputs(messages[:cut])
        out_json = orjson.dumps(out).decode()
        self._put(
            key,
            _Memo(
                signature=(*signature[:-1], *self.settings),
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

    def _put(self, key: tuple[Any, ...], memo: _Memo) -> None:
        previous = self._memos.pop(key, None)
        if previous is not None:
            self._chars -= previous.chars
        self._memos[key] = memo
        self._chars += memo.chars
        while len(self._memos) > _MEMOS_KEPT or self._chars > self.chars:
            self._chars -= self._memos.popitem(last=False)[1].chars


def _tool_outputs(messages: Sequence[Message]) -> dict[str, Message]:
    """The first message of each tool output long enough to be deduplicated against."""
    seen: dict[str, Message] = {}
    for message in messages:
        content = message.get("content")
        if (
            message.get("role") == "tool"
            and isinstance(content, str)
            and len(content) >= DEDUP_MIN_CHARS
        ):
            seen.setdefault(content, message)
    return seen


def _memo_key(ctx: StageContext) -> tuple[Any, ...] | None:
    keys = ctx.tokens.keys
    if not keys or len(keys) < 3:
        return None
    return (ctx.namespace, keys[0], keys[1], keys[2])


def _signature(conversation: Conversation, ctx: StageContext) -> tuple[Any, ...]:
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
