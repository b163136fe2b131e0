"""What the restore loops of every API share: the rounds.

A restore round is one more upstream call, with the restore calls of the answer before and
their answers appended (``Resend``, ``ResendStream``: the exchange sends it); at most
``MAX_ROUNDS`` of them for one client request. The client sees one answer: the usage of
every round added up (``add_usage``), each round's stream read on from its first event
(``chain``), and ``EXHAUSTED`` said when the model still asks to restore after the last
round.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, Final

from gateway.http.sse import close

__all__ = ["EXHAUSTED", "MAX_ROUNDS", "Resend", "ResendStream", "add_usage", "chain"]

Resend = Callable[[list[dict[str, Any]]], Awaitable[bytes]]
"""Sends the next restore round (the turns to add) and returns its whole answer."""
ResendStream = Callable[[list[dict[str, Any]]], Awaitable[tuple[bytes, AsyncIterator[bytes]]]]
"""Sends the next restore round and returns its stream: the first event and the rest."""

MAX_ROUNDS: Final = 3
"""Rounds of restore calls the gateway answers for one client request."""

EXHAUSTED: Final = (
    "(The model asked to restore removed context more times than allowed for one request.)"
)
"""The answer's text when the model still asks to restore after ``MAX_ROUNDS`` rounds
and said nothing else."""


def add_usage(total: dict[str, Any] | None, usage: Any) -> dict[str, Any] | None:
    """Usage objects added field by field (nested detail objects too)."""
    if not isinstance(usage, dict):
        return total
    if total is None:
        return copy.deepcopy(usage)
    for key, value in usage.items():
        mine = total.get(key)
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float) and isinstance(mine, int | float):
            total[key] = mine + value
        elif isinstance(value, dict):
            total[key] = add_usage(mine if isinstance(mine, dict) else None, value)
        elif key not in total:
            total[key] = value
    return total


async def chain(first: bytes, events: AsyncIterator[bytes]) -> AsyncGenerator[bytes, None]:
    """``first``, then ``events``; ``events`` closed when the iteration ends."""
    try:
        yield first
        async for event in events:
            yield event
    finally:
        await close(events)
