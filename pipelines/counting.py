"""Counting one request's tokens: exact where a decision depends on it, cheap where not.

A request's messages are looked up in the counter's shared cache first. What is not there
(a history the process has not seen) is handled one of two ways:

- if even a generous estimate (``ESTIMATE_MARGIN`` times the size-based estimate) leaves
  the request below every utilisation threshold, nothing the pipeline decides can depend
  on the exact figure: the estimate is used now, the report says so, and the exact counts
  are measured on a worker thread in the background, so the conversation's next request
  is counted exactly from the cache;
- otherwise the missing messages are measured exactly before the stages run, on a worker
  thread when there is much to measure, so other requests are not stalled.

Exact tokenization of a 120K-token history takes tens of milliseconds here; the
estimate takes well under one. Decisions about one item (a tool output over the filter's
size, say) do not depend on the request's total and count that item themselves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Final

from pipelines.conversation import Conversation
from pipelines.messages import Message, iter_parts
from pipelines.tokens import REPLY_PRIMING, CacheKey, TokenCounter

__all__ = ["ESTIMATE_MARGIN", "THREADED_MEASURE_CHARS", "ConversationTokens", "Deferred"]

THREADED_MEASURE_CHARS: Final = 64_000
"""Uncached text (in characters) above which exact measuring runs on a worker thread and
a far-from-threshold request may be estimated."""
ESTIMATE_MARGIN: Final = 2.0
"""How far an estimate is trusted: it must stay under the threshold even when doubled."""

Deferred = Callable[[Callable[[], object]], None]
"""Runs a job on a worker thread in the background (the pipeline owns the task)."""

_Miss = tuple[Message, CacheKey]
_Counted = tuple[tuple[Message, ...], list[Any] | None]
"""What a total is of: a conversation's messages and tools (held, so their ids stay theirs)."""


class ConversationTokens:
    """The token counts of one request's conversations, reusing the count of every message
    object already seen in it (stages keep unchanged messages as the same objects)."""

    __slots__ = ("_counter", "_held", "_seen", "_totals", "exact", "keys")

    def __init__(self, counter: TokenCounter) -> None:
        self._counter = counter
        # id -> count; holding the messages (in _held) keeps their ids from being reused.
        self._seen: dict[int, int] = {}
        self._held: list[Message] = []
        # (id of the messages, id of the tools) -> (both, total): stages ask again about the
        # conversation they got, and one that set another field has the same total.
        self._totals: dict[tuple[int, int], tuple[_Counted, int]] = {}
        self.exact = True
        """False when some counts of this request are estimates."""
        self.keys: list[CacheKey] | None = None
        """The token-cache keys of the request's messages as received, in order (a
        digest of each message's content, for this process)."""

    async def first(
        self, conversation: Conversation, *, threshold: int, defer: Deferred | None = None
    ) -> int:
        """Count the request as received. ``threshold`` is the lowest token count at which
        any stage would act differently; ``defer`` allows background measuring."""
        counter, seen = self._counter, self._seen
        messages = conversation.messages
        keys = self.keys = [counter.key(message) for message in messages]
        found = counter.lookup_many(keys)
        misses: list[_Miss] = []
        for message, key, tokens in zip(messages, keys, found, strict=True):
            if tokens is None:
                misses.append((message, key))
            else:
                seen[id(message)] = tokens
        self._held.extend(messages)
        if not misses:
            return self(conversation)
        missing_chars = 0
        for message, _ in misses:
            missing_chars += _text_size(message)
        if defer is not None and missing_chars > THREADED_MEASURE_CHARS:
            estimates = [counter.estimate(message) for message, _ in misses]
            known = self(conversation, only_seen=True)
            if known + ESTIMATE_MARGIN * sum(estimates) < threshold:
                for (message, _), estimate in zip(misses, estimates, strict=True):
                    seen[id(message)] = estimate
                self.exact = False
                defer(lambda: _remember_all(counter, misses))
                return self(conversation)
        if missing_chars > THREADED_MEASURE_CHARS:
            counts = await asyncio.to_thread(_remember_all, counter, misses)
        else:
            counts = _remember_all(counter, misses)
        for (message, _), tokens in zip(misses, counts, strict=True):
            seen[id(message)] = tokens
        return self(conversation)

    def __call__(self, conversation: Conversation, *, only_seen: bool = False) -> int:
        """Tokens of ``conversation``; messages not seen before in this request are counted
        (exactly) now, unless ``only_seen``."""
        messages, tools = conversation.messages, conversation.tools
        if not only_seen:
            memo = self._totals.get((id(messages), id(tools)))
            if memo is not None:
                return memo[1]
        found = list(map(self._seen.get, map(id, messages)))
        if None in found:
            for index, tokens in enumerate(found):
                if tokens is None:
                    found[index] = 0 if only_seen else self.message(messages[index])
        total = REPLY_PRIMING + self._counter.count_tools(tools) + sum(found)  # type: ignore[arg-type]
        if not only_seen:
            self._totals[id(messages), id(tools)] = ((messages, tools), total)
        return total

    def remember(self, conversation: Conversation, total: int) -> None:
        """Record the total of a conversation the caller derived from one already counted
        (by the messages it replaced and the ones it added)."""
        messages, tools = conversation.messages, conversation.tools
        self._totals[id(messages), id(tools)] = ((messages, tools), total)

    def message(self, message: Message) -> int:
        """Tokens of one message of this request."""
        tokens = self._seen.get(id(message))
        if tokens is None:
            tokens = self._seen[id(message)] = self._counter.count_message(message)
            self._held.append(message)
        return tokens


def _remember_all(counter: TokenCounter, misses: list[_Miss]) -> list[int]:
    counts = [counter.measure(message) for message, _ in misses]
    for (_, key), tokens in zip(misses, counts, strict=True):
        counter.remember(key, tokens)
    return counts


def _text_size(message: Message) -> int:
    """Characters of a message's text, roughly: enough to tell a long history."""
    content = message.get("content")
    if type(content) is str:
        return len(content)
    if type(content) is list:
        return sum(len(text) for _, text in iter_parts(content)) + 256
    return 256
