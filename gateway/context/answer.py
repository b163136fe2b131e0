"""A client request answered: its exchange with the upstream, and the overflow retry.

When the upstream says the compacted request was still too long for its window (a context
overflow: the catalog's window was not the model's), the request is compacted again
(``recompact``: deterministically, to half of what was refused) and sent again, at most
``MAX_ATTEMPTS`` times in all; the last refusal, or one that compacting again cannot
shrink, is relayed as it came. This is the one place that calls both compaction and the
exchange.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from time import perf_counter
from typing import Final

from gateway.context.call import Call, Services
from gateway.context.compaction import ChatRequest, recompact
from gateway.context.exchange import Buffered, Overflowed, Streamed, Wire, exchange

__all__ = ["MAX_ATTEMPTS", "answer"]

log = logging.getLogger("contextgate.exchange")

MAX_ATTEMPTS: Final = 3
"""Upstream attempts per request: the first, then up to two after a context overflow."""


async def answer(
    services: Services,
    call: Call,
    chat: ChatRequest,
    wire: Wire,
    headers: Mapping[str, str],
) -> Buffered | Streamed:
    """``chat``'s answer from the upstream over ``wire``, compacted again and retried
    after a context overflow."""
    own_ms = (perf_counter() - call.started) * 1000
    attempt = 1
    while True:
        outcome = await exchange(
            services,
            call,
            chat,
            wire,
            headers,
            attempt=attempt,
            own_ms=own_ms,
            retry=attempt < MAX_ATTEMPTS,
        )
        if not isinstance(outcome, Overflowed):
            outcome.chat = chat
            return outcome
        retry_started = perf_counter()
        smaller = await recompact(services, outcome.chat)
        own_ms += (perf_counter() - retry_started) * 1000
        if smaller is None:
            return outcome.buffered
        log.info(
            "upstream context overflow; retrying compacted to %d tokens",
            smaller.result.report.budget,
            extra={"request_id": call.request_id},
        )
        chat, attempt = smaller, attempt + 1
