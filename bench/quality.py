"""What a compacted request still carries: fact retention and reversibility.

Fact retention. A trajectory's task lists the correct final actions (``info.task.actions``:
a tool name and its arguments). Their argument values that identify something (see
``tracked_values``) are the facts the agent must still be able to read when it makes that
call. A fact is *needed* at the message where the trajectory's agent makes that action's
call with the value in its arguments (the end of the trajectory if it never does), and is
*tracked* when it occurs in the history before that message. It is *retained* when it
occurs in the outgoing request that the client sent just before that message, or in the
content restored through a ref that request contains (following refs found in restored
content too).

Reversibility. The history's text units are each message's text and each tool call's
arguments. A unit is *kept* when its text occurs verbatim in the outgoing request (JSON
compared without its whitespace, see ``normal``), else
*removed* (all of its bytes, even if a preview of it survives); a removed unit is
*restorable* when its whole text occurs in content restored through the request's refs.
Reversibility is restorable bytes over removed bytes, summed over requests.

An occurrence is a whole-token match: not preceded or followed by a letter, digit or ``_``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

Messages = list[dict[str, Any]]
Fetch = Callable[[str], Awaitable[bytes | str | None]]

_AIRPORT = re.compile(r"[A-Z]{3}")
_RESTORE_DEPTH = 3


def tracked_values(actions: Iterable[dict[str, Any]]) -> list[str]:
    """The identifying leaf values of the actions' arguments, as text, in order, once each:
    strings of 4+ characters with a digit (user, reservation and payment ids, flight
    numbers, dates), 3-letter upper-case codes (airports), and numbers of 10 or more
    (amounts). Booleans, names, enum words ("economy", "no") and small counts are skipped:
    they occur everywhere and identify nothing."""
    values: list[str] = []
    for action in actions:
        for leaf in _leaves(action.get("kwargs") or {}):
            value = _as_fact(leaf)
            if value is not None and value not in values:
                values.append(value)
    return values


def _leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, list):
        for item in value:
            yield from _leaves(item)
    else:
        yield value


def _as_fact(leaf: Any) -> str | None:
    if isinstance(leaf, bool):
        return None
    if isinstance(leaf, int | float):
        if abs(leaf) < 10:
            return None
        return str(int(leaf)) if float(leaf).is_integer() else str(leaf)
    if isinstance(leaf, str):
        if len(leaf) >= 4 and any(c.isdigit() for c in leaf):
            return leaf
        if _AIRPORT.fullmatch(leaf):
            return leaf
    return None


def occurs(value: str, text: str) -> bool:
    """Whether ``value`` occurs in ``text`` as a whole token."""
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(value)}(?![A-Za-z0-9_])", text) is not None


def request_text(messages: Sequence[dict[str, Any]]) -> str:
    """Every text a model reads in ``messages``: contents and tool-call arguments."""
    return "\n".join(unit for message in messages for unit in units_of(message))


def units_of(message: dict[str, Any]) -> Iterator[str]:
    """A message's text units: its content's text, then each tool call's arguments."""
    content = message.get("content")
    if isinstance(content, str):
        if content:
            yield content
    elif isinstance(content, list):
        text = "\n".join(
            str(part.get("text", "")) for part in content if isinstance(part, dict)
        ).strip()
        if text:
            yield text
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and function.get("arguments"):
            yield str(function["arguments"])


@dataclass(frozen=True, slots=True)
class Fact:
    """A value a trajectory's final action needs, and the message that needs it."""

    value: str
    needed_at: int


def facts_of(messages: Messages, actions: Iterable[dict[str, Any]]) -> list[Fact]:
    """The tracked facts of one trajectory (see the module's docstring)."""
    facts: list[Fact] = []
    for action in actions:
        for value in tracked_values([action]):
            needed_at = _call_index(messages, str(action.get("name")), value)
            history = request_text(messages[:needed_at])
            fact = Fact(value, needed_at)
            if occurs(value, history) and fact not in facts:
                facts.append(fact)
    return facts


def _call_index(messages: Messages, name: str, value: str) -> int:
    """The index of the first assistant message calling ``name`` with ``value`` in its
    arguments, or ``len(messages)``."""
    for index, message in enumerate(messages):
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            if function.get("name") == name and occurs(value, str(function.get("arguments"))):
                return index
    return len(messages)


def due_at(facts: Iterable[Fact], request_ends: Sequence[int]) -> dict[int, list[Fact]]:
    """Facts by the index of the request that is checked for them: the last request whose
    history ends at or before the message that needs them."""
    due: dict[int, list[Fact]] = {}
    for fact in facts:
        chosen = max((i for i, end in enumerate(request_ends) if end <= fact.needed_at), default=-1)
        if chosen >= 0:
            due.setdefault(chosen, []).append(fact)
    return due


async def restored(text: str, fetch: Fetch, refs: re.Pattern[str]) -> list[str]:
    """The texts restorable through the refs in ``text`` (matches of ``refs``' first group,
    or whole match), following refs inside restored content; a JSON object's string leaves
    are listed on their own too, so that a stored list of messages yields their texts."""
    seen: set[str] = set()
    out: list[str] = []
    frontier = [text]
    for _ in range(_RESTORE_DEPTH):
        found: list[str] = []
        for source in frontier:
            for match in refs.finditer(source):
                ref = match.group(match.lastindex or 0)
                if ref in seen:
                    continue
                seen.add(ref)
                content = await fetch(ref)
                if content is None:
                    continue
                decoded = content.decode() if isinstance(content, bytes) else content
                out.extend(_texts_in(decoded))
                found.append(decoded)
        frontier = found
    return out


def _texts_in(content: str) -> list[str]:
    try:
        parsed = orjson.loads(content)
    except orjson.JSONDecodeError:
        return [content]
    leaves = [leaf for leaf in _leaves(parsed) if isinstance(leaf, str)]
    return [content, *leaves]


class Quality:
    """Fact retention and reversibility of one method over a replay."""

    def __init__(self) -> None:
        self.tracked = self.retained = 0
        self.sessions = self.whole_sessions = 0
        self.removed_bytes = self.restorable_bytes = 0
        self._session_tracked = self._session_retained = 0

    def start_session(self) -> None:
        """Close the current session's retention count and start another."""
        self._close()
        self._session_tracked = self._session_retained = 0

    def finish(self) -> None:
        """Close the last session."""
        self._close()
        self._session_tracked = self._session_retained = 0

    def _close(self) -> None:
        if self._session_tracked:
            self.sessions += 1
            self.whole_sessions += self._session_retained == self._session_tracked

    def add(
        self, history: Messages, sent: Messages, due: Iterable[Fact], restorable: list[str]
    ) -> None:
        """Count one request: ``history`` as the client sent it, ``sent`` as it left,
        ``due`` the facts checked at it, ``restorable`` the texts its refs restore."""
        sent_text = request_text(sent)
        for fact in due:
            kept = occurs(fact.value, sent_text) or any(
                occurs(fact.value, text) for text in restorable
            )
            self.tracked += 1
            self.retained += kept
            self._session_tracked += 1
            self._session_retained += kept
        removed, back = removed_bytes(history, sent, restorable)
        self.removed_bytes += removed
        self.restorable_bytes += back

    @property
    def retention(self) -> float:
        return self.retained / self.tracked if self.tracked else 1.0

    @property
    def reversibility(self) -> float | None:
        """Restorable share of removed bytes; None when nothing was removed."""
        return self.restorable_bytes / self.removed_bytes if self.removed_bytes else None


def removed_bytes(history: Messages, sent: Messages, restorable: list[str]) -> tuple[int, int]:
    """UTF-8 bytes of ``history``'s text units missing from ``sent``, and how many of
    those are restorable (the unit's whole text occurs in one of ``restorable``). Texts
    are compared in ``normal`` form, so re-serialised JSON is not taken for a removal."""
    sent_text = "\n".join(normal(unit) for message in sent for unit in units_of(message))
    restorable = [normal(text) for text in restorable]
    removed = back = 0
    for message in history:
        for unit in units_of(message):
            text = normal(unit)
            if text in sent_text:
                continue
            size = len(unit.encode())
            removed += size
            if any(text in stored for stored in restorable):
                back += size
    return removed, back


@functools.lru_cache(maxsize=65_536)
def normal(text: str) -> str:
    """``text`` in a form that ignores JSON whitespace: a JSON document re-serialised
    compactly (keys in their order), any other text as it is."""
    try:
        return orjson.dumps(orjson.loads(text)).decode()
    except orjson.JSONDecodeError:
        return text
