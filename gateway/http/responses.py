"""Relaying an upstream response to the client: buffered, or streamed event by event.

A stream is relayed only once the upstream has answered 2xx with ``text/event-stream``
*and* sent its first whole event; any other answer is read whole and relayed with its own
status, headers and body, and a stream that fails before its first event is answered with
the gateway's 502/504. So an upstream failure before the first byte never reaches the
client as a 200. Once streaming, a failure ends the stream with one terminal error event
(and no ``[DONE]``). When the client goes away, the upstream response is closed at once.

While a stream is relayed, a comment line (``: keep-alive``) goes to the client whenever
nothing else has for ``stream_keepalive`` seconds, so that a proxy or load balancer with an
idle timeout does not cut a stream whose upstream is thinking. SSE decoders ignore comments.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Callable
from time import monotonic
from typing import Any, Final

import anyio
import httpx
import orjson
from litestar import Response
from litestar.datastructures.headers import MutableScopeHeaders
from litestar.response.base import ASGIResponse
from litestar.response.streaming import ASGIStreamingResponse
from litestar.types import Message, Receive, Scope, Send

from gateway.codecs.anthropic_envelopes import error_body
from gateway.errors import GatewayError, UpstreamStreamBroken, envelope_of
from gateway.http.forwarding import relayable_response_headers
from gateway.http.sse import KEEPALIVE, close, error_event

__all__ = [
    "EVENT_STREAM",
    "ErrorEvent",
    "Pick",
    "RelayStream",
    "anthropic_error_event",
    "buffered_response",
    "error_response",
    "first_event",
    "is_event_stream",
    "last_sequence_number",
    "openai_error_event",
    "responses_error_event",
    "send_error",
    "streamed_response",
]

log = logging.getLogger("contextgate.relay")

_NO_BODY: Final = frozenset({204, 304})
"""Statuses whose response has no body (and so no default content type)."""


class RelayStream(ASGIStreamingResponse):
    """A streaming response that always closes its iterator and the upstream events
    under it, even when the client left before the first byte or while the iterator was
    suspended between events (a generator that never started runs no ``finally``); and
    that keeps an idle stream alive with comments every ``keepalive`` seconds (0: never)."""

    __slots__ = ("keepalive", "upstream")

    def __init__(
        self,
        *,
        iterator: AsyncIterator[bytes],
        upstream: AsyncIterator[bytes],
        keepalive: float,
        status_code: int,
        headers: list[tuple[str, str]],
    ) -> None:
        # What ``ASGIStreamingResponse(iterator=..., status_code=..., headers=...)`` makes,
        # set straight: its generic ``__init__`` (an ABC check of the iterator, the headers
        # added one by one through a mapping, a default content type looked up by a scan
        # that decodes every name) costs a stream thousands of instructions more.
        encoded = [
            (name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers
        ]
        if status_code not in _NO_BODY and status_code >= 200:
            for name, _ in encoded:
                if name == b"content-type":
                    break
            else:
                encoded.append((b"content-type", b"application/json"))
        self.headers = MutableScopeHeaders()
        self.headers.headers = encoded
        self.background = None
        self.body = b""
        self.content_length = 0
        self._encoded_cookies = ()
        self.encoding = "utf-8"
        self.is_head_response = False
        self.status_code = status_code
        self.iterator = iterator
        self.upstream = upstream
        self.keepalive = keepalive

    async def send_body(self, send: Send, receive: Receive) -> None:
        try:
            if self.keepalive > 0:
                # The body only: the 200 and its headers went out after the first event
                # came. (Here, not in a coroutine of its own: one less per stream.)
                kept = _KeptAlive(send, self.keepalive)
                try:
                    await super().send_body(kept.send, receive)
                finally:
                    await kept.stop()
            else:
                await super().send_body(send, receive)
        finally:
            with anyio.CancelScope(shield=True):
                for iterator in (self.iterator, self.upstream):
                    await close(iterator)


class _KeptAlive:
    """A stream's ``send`` with a timer of the event loop's beside it, which starts a
    task sending ``KEEPALIVE`` when nothing has gone out for ``every`` seconds. Both hold
    one lock while they send, so a comment only ever goes between whole events, and never
    after the body's end. An event costs an uncontended lock and a clock read; a stream,
    one timer (no task, and no task group before its first byte); the timer fires once
    per ``every``. A comment that fails to go out ends the stream with its error, at its
    next event or at its end."""

    __slots__ = (
        "_commenting",
        "_ended",
        "_every",
        "_failure",
        "_last",
        "_lock",
        "_loop",
        "_send",
        "_timer",
    )

    def __init__(self, send: Send, every: float) -> None:
        self._send = send
        self._every = every
        self._lock = asyncio.Lock()
        self._last = monotonic()
        self._ended = False
        self._failure: Exception | None = None
        self._loop = asyncio.get_running_loop()
        self._commenting: asyncio.Task[None] | None = None
        self._timer = self._loop.call_later(every, self._due)

    async def send(self, message: Message) -> None:
        if self._failure is not None:
            raise self._failure
        # What ``async with self._lock`` does, without its two coroutines an event.
        lock = self._lock
        await lock.acquire()
        try:
            await self._send(message)
            self._last = monotonic()
            if not message.get("more_body", False):
                self._ended = True
        finally:
            lock.release()

    def _due(self) -> None:
        if self._ended:
            return
        # Never negative: the clock moves on between the check and the timer.
        wait = self._last + self._every - monotonic()
        if wait > 0:
            self._timer = self._loop.call_later(wait, self._due)
        else:
            self._commenting = self._loop.create_task(self._comment())

    async def _comment(self) -> None:
        try:
            async with self._lock:
                if self._ended:
                    return
                if monotonic() - self._last >= self._every:
                    await self._send(
                        {"type": "http.response.body", "body": KEEPALIVE, "more_body": True}
                    )
                    self._last = monotonic()
        except Exception as exc:
            self._failure = exc
            return
        self._timer = self._loop.call_later(
            max(0.0, self._last + self._every - monotonic()), self._due
        )

    async def stop(self) -> None:
        """Stop the timer and a comment on its way; raise what a comment failed with."""
        self._ended = True
        self._timer.cancel()
        commenting = self._commenting
        if commenting is not None and not commenting.done():
            commenting.cancel()
            with anyio.CancelScope(shield=True), contextlib.suppress(asyncio.CancelledError):
                await commenting
        if self._failure is not None:
            raise self._failure


def is_event_stream(response: httpx.Response) -> bool:
    content_type = response.headers.get("content-type", "")
    return response.is_success and content_type.startswith("text/event-stream")


async def first_event(events: AsyncIterator[bytes]) -> bytes:
    """The stream's first event; a stream that ends before sending one is a 502."""
    async for event in events:
        return event
    raise UpstreamStreamBroken(
        "The upstream ended the stream without sending anything.", code="upstream_empty_stream"
    )


EVENT_STREAM: Final = "text/event-stream; charset=utf-8"
"""The type of a stream the gateway makes (or translates) itself."""

ErrorEvent = Callable[[GatewayError], bytes]


def openai_error_event(error: GatewayError) -> bytes:
    """The terminal event of an OpenAI stream that failed (the SDK raises on it)."""
    return error_event(error.message, type=error.type, code=error.code)


_SEQUENCE: Final = re.compile(rb'"sequence_number":\s*(\d+)')


def last_sequence_number(data: bytes) -> int | None:
    """The last ``sequence_number`` a chunk of a Responses stream carries, if any."""
    found = _SEQUENCE.findall(data)
    return int(found[-1]) if found else None


def responses_error_event(error: GatewayError, sequence_number: int = 0) -> bytes:
    """The terminal event of a Responses stream that failed: an ``error`` event, numbered
    after the last event relayed when the route tracks them."""
    event = {
        "type": "error",
        "code": error.code,
        "message": error.message,
        "param": None,
        "sequence_number": sequence_number,
    }
    return b"event: error\ndata: " + orjson.dumps(event) + b"\n\n"


def anthropic_error_event(error: GatewayError) -> bytes:
    """The terminal event of a Messages stream that failed (the SDK raises on it)."""
    return b"event: error\ndata: " + error_body(error.status, error.message) + b"\n\n"


async def _relay(
    first: bytes, events: AsyncIterator[bytes], request_id: str, error: ErrorEvent
) -> AsyncIterator[bytes]:
    try:
        if first:
            yield first
        async for event in events:
            yield event
    except GatewayError as exc:
        log.warning("upstream stream failed: %s", exc.code, extra={"request_id": request_id})
        yield error(exc)
    finally:
        with anyio.CancelScope(shield=True):
            await close(events)


Pick = Callable[[int, list[tuple[str, str]]], list[tuple[str, str]]]
"""Which of an upstream answer's relayable headers the client gets, given the status sent
(an answer translated for another API keeps only some)."""


def buffered_response(
    response: httpx.Response,
    body: bytes,
    headers: dict[str, str],
    status: int | None = None,
    *,
    pick: Pick | None = None,
) -> ASGIResponse:
    """An upstream response, already read, relayed with its status (or ``status``) and
    headers (``pick``'s choice of them); a body that replaces a stream is JSON."""
    upstream = relayable_response_headers(response.headers)
    if pick is not None:
        upstream = pick(status or response.status_code, upstream)
    relayed: list[tuple[str, str]] = [
        (name, value)
        for name, value in upstream
        if status is None or name.lower() != "content-type"
    ]
    if status is not None:
        relayed.append(("content-type", "application/json"))
    relayed.extend(headers.items())
    return ASGIResponse(body=body, status_code=status or response.status_code, headers=relayed)


def streamed_response(
    response: httpx.Response,
    first: bytes,
    events: AsyncIterator[bytes],
    headers: dict[str, str],
    request_id: str,
    error: ErrorEvent = openai_error_event,
    *,
    keepalive: float,
    pick: Pick | None = None,
    content_type: str | None = None,
) -> ASGIResponse:
    """The upstream's stream relayed: ``first``, then the rest of ``events``; a failure on
    the way ends it with ``error``'s terminal event; a comment every ``keepalive`` seconds
    of silence (0: none); the upstream's headers, or ``pick``'s choice of them, with
    ``content_type`` for the upstream's when given (a stream translated for another
    API)."""
    relayed = relayable_response_headers(response.headers)
    if pick is not None:
        relayed = pick(response.status_code, relayed)
    if content_type is not None:
        relayed = [(k, v) for k, v in relayed if k.lower() != "content-type"]
        relayed.append(("content-type", content_type))
    relayed.extend(headers.items())
    relayed.append(("x-accel-buffering", "no"))
    return RelayStream(
        iterator=_relay(first, events, request_id, error),
        upstream=events,
        keepalive=keepalive,
        status_code=response.status_code,
        headers=relayed,
    )


def error_response(error: GatewayError, headers: dict[str, Any] | None = None) -> Response[bytes]:
    """A gateway error in the OpenAI envelope."""
    return Response(
        content=envelope_of(error),
        status_code=error.status,
        media_type="application/json",
        headers=headers,
    )


ANTHROPIC_ROUTES = "/v1/messages"
"""Routes of the Anthropic API: their errors use Anthropic's envelope."""


async def send_error(scope: Scope, send: Send, error: GatewayError, request_id: str | None) -> None:
    """Answer ``error`` straight on the ASGI ``send``, in the envelope of the request's
    route, for the middlewares that answer before (or after) Litestar's handlers."""
    anthropic = scope["path"].startswith(ANTHROPIC_ROUTES)
    body = error_body(error.status, error.message) if anthropic else envelope_of(error)
    headers = [(b"content-type", b"application/json")]
    headers += [(name.encode(), value.encode()) for name, value in (error.headers or {}).items()]
    if request_id:
        headers.append((b"x-contextgate-request-id", request_id.encode()))
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
