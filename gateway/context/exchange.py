"""One client request's exchange with its upstream, whatever the wire format.

The chat route and the Messages route differ in what they read and write; what happens
between is the same and lives here: the pipeline's request goes out (with the restore tool
once the conversation has refs), an upstream context overflow is compacted again and
retried, the model's restore calls are answered in place, and the conversation's record is
stored with the usage the provider reported for the request (its first answer: restore
rounds are not part of the conversation the next request continues). A ``Wire`` says how
requests and answers look on the upstream's side: OpenAI chat, or the Anthropic Messages API
(``gateway.context.wires``).

``exchange`` returns ``Buffered`` (status, headers and the whole body) or ``Streamed`` (the
first event and the rest); the route turns either into its own response.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Final, Protocol

import anyio
import httpx
from litestar import Request

from gateway.context.cache_breaks import CACHE_BREAK_HEADER, note_cache_break
from gateway.context.compaction import ChatRequest, recompact
from gateway.context.restore import Resend, ResendStream, Restorer
from gateway.errors import UpstreamStreamBroken
from gateway.http.client import while_connected
from gateway.http.headers import report_headers
from gateway.http.responses import first_event, is_event_stream
from gateway.http.sse import close
from gateway.providers.openai import ChatUpstream, is_context_overflow
from gateway.runtime import Gateway
from gateway.telemetry.upstream_span import UpstreamCall

__all__ = [
    "MAX_ATTEMPTS",
    "Buffered",
    "Streamed",
    "UpstreamAnswered",
    "UsageTracker",
    "Wire",
    "exchange",
]

log = logging.getLogger("contextgate.exchange")

MAX_ATTEMPTS: Final = 3
"""Upstream attempts per request: the first, then up to two after a context overflow."""


class UsageTracker(Protocol):
    """The usage a stream reports, read event by event, in OpenAI form, and its id."""

    @property
    def usage(self) -> dict[str, Any] | None: ...

    @property
    def answer_id(self) -> str | None: ...

    def add(self, event: bytes) -> None: ...


class Wire(Protocol):
    """How one request and its answers look on the upstream's side."""

    @property
    def upstream(self) -> ChatUpstream: ...

    def encode(self, outgoing: dict[str, Any], encoded: bytes | None = None) -> bytes:
        """The body sent upstream for the pipeline's request ``outgoing`` (OpenAI chat);
        ``encoded`` is that request as OpenAI chat JSON when it is at hand."""
        ...

    def continued(self, outgoing: dict[str, Any], extra: list[dict[str, Any]]) -> bytes:
        """The body for ``outgoing`` followed by a restore round's turns ``extra`` (in the
        wire's own message format)."""
        ...

    async def send(self, content: bytes, headers: Mapping[str, str]) -> httpx.Response: ...

    async def complete(self, body: bytes, restorer: Restorer, resend: Resend) -> bytes:
        """A whole answer with its restore calls answered (``restore.complete``)."""
        ...

    def stream(
        self, first: bytes, events: AsyncIterator[bytes], restorer: Restorer, resend: ResendStream
    ) -> AsyncIterator[bytes]:
        """A stream with its restore calls answered in place (``restore.stream``)."""
        ...

    def usage(self, body: bytes) -> dict[str, Any] | None:
        """The OpenAI-form usage of a whole answer, if it says."""
        ...

    def answer_id(self, body: bytes) -> str | None:
        """The id the upstream gave a whole answer, if any."""
        ...

    def usage_tracker(self) -> UsageTracker: ...

    def stream_error(self, event: bytes) -> tuple[int, bytes] | None:
        """When a stream's first event is an error, the status it stands for and the
        error body to answer with instead of a stream."""
        ...


@dataclass(slots=True)
class Buffered:
    response: httpx.Response
    body: bytes
    headers: dict[str, str]
    """The gateway's own headers (``x-contextgate-*``)."""
    status: int | None = None
    """Set when the status sent differs from the upstream's (an error event that came
    before any content)."""


@dataclass(slots=True)
class Streamed:
    response: httpx.Response
    first: bytes
    events: AsyncIterator[bytes]
    headers: dict[str, str]


class UpstreamAnswered(Exception):
    """A restore round's request got an answer that is not a success: relayed as it is."""

    def __init__(self, response: httpx.Response, body: bytes) -> None:
        self.response, self.body = response, body


async def exchange(
    request: Request[Any, Any, Any],
    chat: ChatRequest,
    wire: Wire,
    headers: dict[str, str],
    *,
    request_id: str,
    started: float,
) -> Buffered | Streamed:
    """Send ``chat``'s compacted request over ``wire`` and bring back the answer."""
    gateway: Gateway = request.app.state.gateway
    upstream = wire.upstream
    notes = request.scope["state"]  # what the access log and metrics read (gateway.access)
    own_ms = (perf_counter() - started) * 1000
    for attempt in range(1, MAX_ATTEMPTS + 1):
        result = chat.result
        notes["report"], notes["attempts"] = result.report, attempt
        outgoing, tooled = result.request, chat.restore_tool
        content = wire.encode(outgoing, chat.content)
        restorer = None
        if tooled:
            counter = gateway.pipeline.counter(
                gateway.pipeline.catalog.lookup(str(outgoing.get("model", ""))).encoding
            )
            restorer = Restorer(
                gateway.stores.objects,
                chat.namespace,
                counter,
                room=result.report.budget - result.report.tokens_after,
            )
        sent_at, sending = time.time(), perf_counter()
        call = UpstreamCall.start(upstream, outgoing)
        with call.current():
            response = await while_connected(request.receive, wire.send(content, headers))
        ours = report_headers(request_id, result.report, own_ms)
        ours["x-contextgate-attempts"] = str(attempt)
        predicted = result.report.cache_break
        if predicted is not None:
            ours[CACHE_BREAK_HEADER] = predicted
        if is_event_stream(response):
            events = call.streamed(response.status_code, upstream.events(response))
            first = await while_connected(request.receive, first_event(events))
            failed = wire.stream_error(first)
            gateway.metrics.upstream_answered(
                upstream.provider, perf_counter() - sending, failed is None
            )
            if failed is not None:
                await close(events)
                status, body = failed
                return Buffered(response, body, ours, status=status)
            tracker = wire.usage_tracker()
            tracker.add(first)
            metered = _Metered(events, tracker)
            relayed: AsyncIterator[bytes] = metered
            if restorer is not None:
                resend = _resend_stream(wire, outgoing, headers)
                relayed = wire.stream(first, metered, restorer, resend)
                first = b""
            events = _Remembering(
                gateway, chat, sent_at, relayed, metered, restorer is not None, tracker, notes
            )
            return Streamed(response, first, events, ours)
        limit = None if response.is_success else upstream.settings.max_error_body_bytes
        with call.current():
            body = await while_connected(request.receive, upstream.read_body(response, limit))
        call.answered(response.status_code, body)
        gateway.metrics.upstream_answered(
            upstream.provider, perf_counter() - sending, response.is_success
        )
        if attempt < MAX_ATTEMPTS and is_context_overflow(response.status_code, body):
            retry_started = perf_counter()
            smaller = await recompact(gateway, chat)
            own_ms += (perf_counter() - retry_started) * 1000
            if smaller is not None:
                log.info(
                    "upstream context overflow; retrying compacted to %d tokens",
                    smaller.result.report.budget,
                    extra={"request_id": request_id},
                )
                chat = smaller
                continue
        break
    # The first answer's usage is the conversation's: its next request has none of the
    # restore rounds' turns (the client's body still adds every round up).
    usage = wire.usage(body) if response.is_success else None
    answer_id = wire.answer_id(body) if response.is_success else None
    if response.is_success and restorer is not None:
        try:
            body = await while_connected(
                request.receive,
                wire.complete(body, restorer, _resend(wire, outgoing, headers)),
            )
        except UpstreamAnswered as answered:
            response, body = answered.response, answered.body
        ours["x-contextgate-restore"] = restorer.stats.header()
    if response.is_success:
        cause = note_cache_break(gateway.metrics, chat, usage)
        ours.pop(CACHE_BREAK_HEADER, None)
        if cause is not None:
            ours[CACHE_BREAK_HEADER] = cause
        notes["usage"], notes["cache_break"] = usage, cause
        _remember(gateway, chat, sent_at, usage, answer_id, restorer is not None)
    return Buffered(response, body, ours)


def _remember(
    gateway: Gateway,
    chat: ChatRequest,
    sent_at: float,
    usage: dict[str, Any] | None,
    answer_id: str | None,
    restore_tool: bool,
) -> None:
    state = chat.result.state.answered(at=sent_at, usage=usage, answer_id=answer_id)
    gateway.remember(
        chat.namespace, chat.conversation, state.with_restore_tool() if restore_tool else state
    )


def _resend(wire: Wire, outgoing: dict[str, Any], headers: dict[str, str]) -> Resend:
    async def resend(extra: list[dict[str, Any]]) -> bytes:
        call = UpstreamCall.start(wire.upstream, outgoing, restore=True)
        with call.current():
            response = await wire.send(wire.continued(outgoing, extra), headers)
            limit = None if response.is_success else wire.upstream.settings.max_error_body_bytes
            body = await wire.upstream.read_body(response, limit)
        call.answered(response.status_code, body)
        if not response.is_success or is_event_stream(response):
            raise UpstreamAnswered(response, body)
        return body

    return resend


def _resend_stream(wire: Wire, outgoing: dict[str, Any], headers: dict[str, str]) -> ResendStream:
    async def resend(extra: list[dict[str, Any]]) -> tuple[bytes, AsyncIterator[bytes]]:
        call = UpstreamCall.start(wire.upstream, outgoing, restore=True)
        with call.current():
            response = await wire.send(wire.continued(outgoing, extra), headers)
            if not is_event_stream(response):
                body = await wire.upstream.read_body(
                    response, wire.upstream.settings.max_error_body_bytes
                )
                call.answered(response.status_code, body)
                raise UpstreamStreamBroken(
                    f"The upstream answered a restore round with {response.status_code}:"
                    f" {body[:300].decode('utf-8', 'replace')}",
                    code="upstream_error",
                )
        events = call.streamed(response.status_code, wire.upstream.events(response))
        return await first_event(events), events

    return resend


class _Metered:
    """The upstream's events relayed as they are, each also read by ``tracker``."""

    __slots__ = ("_events", "_tracker")

    def __init__(self, events: AsyncIterator[bytes], tracker: UsageTracker) -> None:
        self._events, self._tracker = events, tracker

    def __aiter__(self) -> _Metered:
        return self

    async def __anext__(self) -> bytes:
        event = await self._events.__anext__()
        self._tracker.add(event)
        return event

    async def aclose(self) -> None:
        await close(self._events)


class _Remembering:
    """``events`` relayed as they are; when the stream ends, however it ends (also when it
    is closed before it started), the conversation's record is stored once, with the usage
    ``tracker`` read from the upstream's first answer, and the events are closed, and so is
    ``upstream``, the first answer's own events under them (``events`` may be a restore
    loop around them that never started, and so would close nothing)."""

    __slots__ = (
        "_chat",
        "_done",
        "_events",
        "_gateway",
        "_notes",
        "_restore_tool",
        "_sent_at",
        "_tracker",
        "_upstream",
    )

    def __init__(
        self,
        gateway: Gateway,
        chat: ChatRequest,
        sent_at: float,
        events: AsyncIterator[bytes],
        upstream: AsyncIterator[bytes],
        restore_tool: bool,
        tracker: UsageTracker,
        notes: dict[str, Any],
    ) -> None:
        self._gateway, self._chat, self._sent_at = gateway, chat, sent_at
        self._events, self._upstream = events, upstream
        self._restore_tool = restore_tool
        self._tracker = tracker
        self._notes = notes
        self._done = False

    def __aiter__(self) -> _Remembering:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self._events.__anext__()
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        if self._done:
            return
        self._done = True
        usage = self._tracker.usage
        cause = note_cache_break(self._gateway.metrics, self._chat, usage)
        self._notes["usage"], self._notes["cache_break"] = usage, cause
        _remember(
            self._gateway,
            self._chat,
            self._sent_at,
            usage,
            self._tracker.answer_id,
            self._restore_tool,
        )
        with anyio.CancelScope(shield=True):
            for events in (self._events, self._upstream):
                await close(events)
