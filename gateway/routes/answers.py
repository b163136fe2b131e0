"""An answer from the exchange as the route's response: the one place a route's answer is
dispatched, buffered or streamed, relayed as it came or translated for the client's API.

A ``Translation`` says how an answer in the upstream's API becomes one in the client's
(the Messages route answering from an OpenAI-compatible model, the chat route from
Claude; ``reporting_edits`` adds the native edits the gateway applied, the Messages route
its compaction block); without one, the upstream's answer is the client's, byte for byte.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from litestar.response.base import ASGIResponse

from gateway.context.exchange import Buffered, Streamed
from gateway.context.native import applied_chunks, applied_events, with_applied_edits
from gateway.context.restore import chain
from gateway.http.responses import (
    EVENT_STREAM,
    ErrorEvent,
    buffered_response,
    openai_error_event,
    streamed_response,
)

__all__ = ["Translation", "reporting_edits", "respond"]


@dataclass(frozen=True, slots=True)
class Translation:
    """How an upstream's answer becomes the client's."""

    body: Callable[[int, bytes], bytes]
    """A whole answer (its status and body) as the client's body."""
    events: Callable[[bytes, AsyncIterator[bytes]], AsyncIterator[bytes]]
    """A stream (its first event, then the rest) as the client's events."""
    headers: Callable[[int, list[tuple[str, str]]], list[tuple[str, str]]] | None = None
    """Which of the upstream's headers the client gets, given the status sent (all that
    make sense to relay when ``None``)."""


def respond(
    answer: Buffered | Streamed,
    request_id: str,
    *,
    keepalive: float,
    error: ErrorEvent = openai_error_event,
    translation: Translation | None = None,
) -> ASGIResponse:
    """``answer`` as the route's response: a stream ending in ``error``'s event if it
    fails, kept alive every ``keepalive`` seconds; translated by ``translation``."""
    if translation is None:
        if isinstance(answer, Buffered):
            return buffered_response(answer.response, answer.body, answer.headers, answer.status)
        return streamed_response(
            answer.response,
            answer.first,
            answer.events,
            answer.headers,
            request_id,
            error,
            keepalive=keepalive,
        )
    # Translated, the body is the gateway's: JSON, or a stream of the client's events,
    # whatever type the upstream's own body was.
    pick = translation.headers
    if isinstance(answer, Buffered):
        status = answer.status or answer.response.status_code
        body = translation.body(status, answer.body)
        return buffered_response(answer.response, body, answer.headers, status, pick=pick)
    return streamed_response(
        answer.response,
        b"",
        translation.events(answer.first, answer.events),
        answer.headers,
        request_id,
        error,
        keepalive=keepalive,
        pick=pick,
        content_type=EVENT_STREAM,
    )


def reporting_edits(
    translation: Translation | None,
    edits: Sequence[Mapping[str, Any]],
    *,
    client: str,
) -> Translation | None:
    """``translation`` (the upstream's answer as it came when ``None``) with the native
    edits the gateway applied itself in the answer, where the client's API
    (``client``: ``messages`` or ``chat``) carries them (``gateway.context.native``)."""
    if not edits:
        return translation
    inner = translation

    def body(status: int, data: bytes) -> bytes:
        data = inner.body(status, data) if inner is not None else data
        return with_applied_edits(data, edits) if 200 <= status < 300 else data

    def events(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        stream = inner.events(first, rest) if inner is not None else chain(first, rest)
        if client == "messages":
            return applied_events(stream, edits)
        return applied_chunks(stream, edits)

    return Translation(body, events, inner.headers if inner is not None else None)
