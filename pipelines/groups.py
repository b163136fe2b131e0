"""The units compaction works on: message groups, their priority, and what is protected.

A *group* is one message, or an assistant message with ``tool_calls`` together with the
tool results that follow it: compaction moves, shortens or removes a group as one unit, so
a call is never separated from its results.

Priority, lower kept longer (docs/ARCHITECTURE.md, "The pipeline"): user messages 0; final
assistant answers (assistant text the user answered, or the last message) 1; tool-call
groups with an error result 2; other assistant text 3; tool-call groups whose results all
succeeded 4. A group that mentions one of the user's goal terms (an identifier with a digit
in it, or a path, from the first or the latest user message) is raised one level.

*Protected* messages are neither removed nor summarised: system messages (but a system turn
the model is no longer shown, ``shown_no_more``), a message holding a provider's
``compaction`` block, the anchor (the first user message and
the group that answers it, past any system turn after it), the latest user message, and the recent
tail (``tail-ratio`` of the budget, stretched up to 1.5 times rather than split a group, at
least the last two messages). If the pinned user messages alone take over half the budget,
the older pin (the anchor) is released.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

from pipelines.messages import Message, is_system_turn, message_text
from pipelines.preview import is_error

__all__ = [
    "Group",
    "Protection",
    "goal_terms",
    "holds_compaction",
    "protect",
    "shown_no_more",
    "split_groups",
]

USER, ANSWER, CALL_OR_ERROR, OTHER_ASSISTANT, TOOL_RESULT = range(5)
SYSTEM: Final = -1
_SYSTEM_ROLES: Final = frozenset({"system", "developer"})
_TERM: Final = re.compile(r"[A-Za-z0-9_./:-]*\d[A-Za-z0-9_./:-]*|[\w.-]+/[\w./-]+")


class Group(NamedTuple):
    """Messages ``start`` to ``end`` (exclusive), moved as one unit."""

    start: int
    end: int
    priority: int


@dataclass(frozen=True, slots=True)
class Protection:
    """What compaction must leave as it is."""

    indices: frozenset[int]
    """Indices of protected messages."""
    tail_start: int
    """Index of the first message of the protected tail."""


def holds_compaction(message: Message) -> bool:
    """Whether ``message`` carries a provider's ``compaction`` block (the summary of what
    precedes it, which the client sends back): pinned, never removed, edited or moved."""
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(part, dict) and part.get("type") == "compaction" for part in content
    )


def goal_terms(messages: Sequence[Message]) -> frozenset[str]:
    """Identifiers and paths from the first and the latest user message (4+ characters)."""
    users = [m for m in messages if m.get("role") == "user"]
    terms: set[str] = set()
    for message in users[:1] + users[-1:]:
        terms.update(t.strip(".:/-") for t in _TERM.findall(message_text(message)))
    return frozenset(t for t in terms if len(t) >= 4)


def split_groups(messages: Sequence[Message], terms: frozenset[str] = frozenset()) -> list[Group]:
    """The conversation cut into groups, in order, covering every message once."""
    groups: list[Group] = []
    index, count = 0, len(messages)
    stale = shown_no_more(messages)
    while index < count:
        message = messages[index]
        role = message.get("role")
        end = index + 1
        if role == "assistant" and message.get("tool_calls"):
            while end < count and messages[end].get("role") == "tool":
                end += 1
            failed = False
            for result in messages[index + 1 : end]:
                content = result.get("content")
                if is_error(content if type(content) is str else message_text(result)):
                    failed = True
                    break
            priority = CALL_OR_ERROR if failed else TOOL_RESULT
        elif index in stale:
            priority = TOOL_RESULT
        elif role in _SYSTEM_ROLES:
            priority = SYSTEM
        elif role == "user":
            priority = USER
        elif role == "assistant":
            priority = ANSWER if _answered(messages, end) else OTHER_ASSISTANT
        else:  # a tool result without its call
            priority = TOOL_RESULT
        if priority > USER and terms and _mentions(messages[index:end], terms):
            priority -= 1
        groups.append(Group(index, end, priority))
        index = end
    return groups


def protect(
    messages: Sequence[Message],
    groups: Sequence[Group],
    *,
    budget: int,
    tail_ratio: float,
    tokens_of: Callable[[Message], int],
) -> Protection:
    """The protected messages of ``messages`` under a ``budget`` of tokens."""
    stale = shown_no_more(messages)
    protected = {
        i
        for i, m in enumerate(messages)
        if (m.get("role") in _SYSTEM_ROLES and i not in stale) or holds_compaction(m)
    }
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    if users:
        first, latest = users[0], users[-1]
        protected.add(latest)
        if first != latest and tokens_of(messages[first]) + tokens_of(messages[latest]) <= (
            budget // 2
        ):
            protected.add(first)
            # The reply to the anchor, past any system turn the client put after it.
            reply = next(
                (
                    g
                    for g in groups
                    if g.start > first and messages[g.start].get("role") not in _SYSTEM_ROLES
                ),
                None,
            )
            if reply is not None and messages[reply.start].get("role") == "assistant":
                protected.update(range(reply.start, reply.end))
    tail_budget = tail_ratio * budget
    tail_tokens = 0
    tail_start = len(messages)
    for group in reversed(groups):
        size = sum(tokens_of(m) for m in messages[group.start : group.end])
        short = len(messages) - tail_start < 2
        if not short and tail_tokens + size > 1.5 * tail_budget:
            break
        tail_tokens += size
        tail_start = group.start
        if tail_tokens >= tail_budget and len(messages) - tail_start >= 2:
            break
    protected.update(range(tail_start, len(messages)))
    return Protection(frozenset(protected), tail_start)


def shown_no_more(messages: Sequence[Message]) -> frozenset[int]:
    """Indices of the system turns the model is no longer shown: those the client sent
    with ``clear_at: "next_user_message"`` that a user turn (a user message, or tool
    results, a user turn on Anthropic's wire) has followed since. The API keeps them out
    of the prompt; the pipeline may compact them as the least of the history."""
    if not any(m.get("clear_at") == "next_user_message" for m in messages):
        return frozenset()
    last_user = max(
        (i for i, m in enumerate(messages) if m.get("role") in ("user", "tool")), default=-1
    )
    return frozenset(
        i
        for i, m in enumerate(messages[:last_user])
        if is_system_turn(m) and m.get("clear_at") == "next_user_message"
    )


def _answered(messages: Sequence[Message], after: int) -> bool:
    """Whether the assistant text ending before ``after`` is a final answer: the last
    message, or followed (past any tool and system messages) by a user message."""
    for index in range(after, len(messages)):
        role = messages[index].get("role")
        if role != "tool" and role not in _SYSTEM_ROLES:
            return role == "user"
    return True


def _mentions(messages: Sequence[Message], terms: frozenset[str]) -> bool:
    text = "\n".join(message_text(m) for m in messages)
    for message in messages:
        for call in message.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                text += "\n" + str(function.get("arguments", ""))
    return any(term in text for term in terms)
