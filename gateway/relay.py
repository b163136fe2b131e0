"""Relaying an upstream response to the client: buffered, or streamed event by event.

A stream is relayed only once the upstream has answered 2xx with ``text/event-stream``;
any other answer is read whole and relayed with its own status, headers and body, so an
upstream error before the first byte reaches the client as that error, never as a 200.
Once streaming, a transport failure ends the stream with one terminal error event (and no
``[DONE]``). When the client goes away, the upstream response is closed at once.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
from litestar import Response
from litestar.response.base import ASGIResponse
from litestar.response.streaming import ASGIStreamingResponse
from litestar.types import Receive, Send

from gateway.errors import GatewayError, envelope_of
from gateway.sse import error_event, sse_events
from gateway.upstream import relayable_response_headers

__all__ = [
    "RelayStream",
    "buffered_response",
    "error_response",
    "is_event_stream",
    "relay_events",
    "streamed_response",
]

log = logging.getLogger("contextgate.relay")


class RelayStream(ASGIStreamingResponse):
    """A streaming response that always closes its iterator, even when the client left
    while the iterator was suspended between events."""

    __slots__ = ()

    async def send_body(self, send: Send, receive: Receive) -> None:
        try:
            await super().send_body(send, receive)
        finally:
            iterator = self.iterator
            if hasattr(iterator, "aclose"):
                with anyio.CancelScope(shield=True):
                    await iterator.aclose()


def is_event_stream(response: httpx.Response) -> bool:
    content_type = response.headers.get("content-type", "")
    return response.is_success and content_type.startswith("text/event-stream")


async def relay_events(response: httpx.Response, request_id: str) -> AsyncIterator[bytes]:
    """The upstream's events, then a terminal error event if the upstream fails mid-stream."""
    try:
        async for event in sse_events(response.aiter_bytes()):
            yield event
    except httpx.TimeoutException:
        log.warning("upstream stream stalled", extra={"request_id": request_id})
        yield error_event(
            "The upstream stopped sending in the middle of the stream.",
            type="upstream_error",
            code="upstream_timeout",
        )
    except httpx.HTTPError as exc:
        log.warning(
            "upstream stream broke: %s", type(exc).__name__, extra={"request_id": request_id}
        )
        yield error_event(
            "The upstream connection broke in the middle of the stream.",
            type="upstream_error",
            code="upstream_stream_error",
        )
    finally:
        with anyio.CancelScope(shield=True):
            await response.aclose()


def buffered_response(
    response: httpx.Response, body: bytes, headers: dict[str, str]
) -> ASGIResponse:
    """An upstream response, already read, relayed with its status and headers."""
    relayed: list[tuple[str, str]] = [*relayable_response_headers(response.headers)]
    relayed.extend(headers.items())
    return ASGIResponse(body=body, status_code=response.status_code, headers=relayed)


def streamed_response(
    response: httpx.Response, headers: dict[str, str], request_id: str
) -> ASGIResponse:
    relayed: list[tuple[str, str]] = [*relayable_response_headers(response.headers)]
    relayed.extend(headers.items())
    relayed.append(("x-accel-buffering", "no"))
    return RelayStream(
        iterator=relay_events(response, request_id),
        status_code=response.status_code,
        headers=relayed,  # type: ignore[arg-type]
    )


def error_response(error: GatewayError, headers: dict[str, Any] | None = None) -> Response[bytes]:
    """A gateway error in the OpenAI envelope."""
    return Response(
        content=envelope_of(error),
        status_code=error.status,
        media_type="application/json",
        headers=headers,
    )
