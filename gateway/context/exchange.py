"""One attempt at a client request's exchange with its upstream, whatever the wire format.

The chat route and the Messages route differ in what they read and write; what happens
between is the same and lives here: the pipeline's request goes out (with the restore tool
when the conversation has it), the model's restore calls are answered in place, and the
conversation's record is stored with the usage the provider reported for the request (its
first answer: restore rounds are not part of the conversation the next request continues).
A ``Wire`` says how requests and answers look on the upstream's side: OpenAI chat, or the
Anthropic Messages API (``gateway.context.wires``).

``exchange`` returns ``Buffered`` (status, headers and the whole body), ``Streamed`` (the
first event and the rest), or, when the upstream found the request too long and another
attempt may follow, ``Overflowed``: the overflow retry is ``gateway.context.answer``'s.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Protocol

import anyio
import httpx

from gateway.context.cache_breaks import CACHE_BREAK_HEADER, note_cache_break
from gateway.context.call import Call, Services
from gateway.context.compaction import ChatRequest
from gateway.context.restore import Resend, ResendStream, Restorer
from gateway.errors import UpstreamStreamBroken
from gateway.http.client import ClientWatch
from gateway.http.headers import report_headers
from gateway.http.responses import first_event, is_event_stream
from gateway.http.sse import close
from gateway.providers.openai import Provider, is_context_overflow
from gateway.telemetry.upstream_span import UpstreamCall

__all__ = [
    "Buffered",
    "Overflowed",
    "Streamed",
    "UpstreamAnswered",
    "UsageTracker",
    "Wire",
    "exchange",
]


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
    def upstream(self) -> Provider: ...

    async def send(
        self,
        outgoing: dict[str, Any],
        headers: Mapping[str, str],
        *,
        encoded: bytes | None = None,
        extra: list[dict[str, Any]] | None = None,
    ) -> httpx.Response:
        """Send the pipeline's request ``outgoing`` (OpenAI chat) in the wire's API, followed
        by a restore round's turns ``extra`` (in the wire's own message format) if any;
        ``encoded`` is ``outgoing`` as OpenAI chat JSON when it is at hand. The response's
        body is still to be read."""
        ...

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

    def check(self, body: bytes) -> None:
        """Refuse (``UpstreamInvalidAnswer``, a 502) a success whose body the client's API
        cannot be given."""
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
    chat: ChatRequest | None = None
    """The request as it went up the last time (``context.answer`` sets it: after an
    overflow retry, the one compacted again)."""


@dataclass(slots=True)
class Streamed:
    response: httpx.Response
    first: bytes
    events: AsyncIterator[bytes]
    headers: dict[str, str]
    chat: ChatRequest | None = None
    """As ``Buffered.chat``."""


class UpstreamAnswered(Exception):
    """A restore round's request got an answer that is not a success: relayed as it is."""

    def __init__(self, response: httpx.Response, body: bytes) -> None:
        self.response, self.body = response, body


@dataclass(slots=True)
class Overflowed:
    """The upstream refused the request as too long for the model's window, and another
    attempt may follow (``gateway.context.answer``): ``buffered`` is the refusal, relayed
    as it is when none does."""

    buffered: Buffered
    chat: ChatRequest


async def exchange(
    services: Services,
    call: Call,
    chat: ChatRequest,
    wire: Wire,
    headers: Mapping[str, str],
    *,
    attempt: int = 1,
    own_ms: float = 0.0,
    retry: bool = False,
) -> Buffered | Streamed | Overflowed:
    """Send ``chat``'s compacted request over ``wire`` (attempt ``attempt``, with
    ``own_ms`` of the gateway's own time so far) and bring back the answer; with
    ``retry``, a context overflow comes back as ``Overflowed`` for the caller to compact
    again."""
    upstream = wire.upstream
    result = chat.result
    record = call.record
    record.report, record.attempts, record.chat = result.report, attempt, chat
    outgoing = result.request
    restorer = _restorer(services, chat) if chat.restore_tool else None
    record.restores = restorer.stats if restorer is not None else None
    sent_at, sending = time.time(), perf_counter()
    span = UpstreamCall.start(upstream.provider, outgoing)
    watch = ClientWatch(call.receive)
    response: httpx.Response | None = None
    try:
        with span.current():
            sending_it = wire.send(outgoing, headers, encoded=chat.content)
            response = await watch.run(sending_it)
        ours = report_headers(call.request_id, result.report, own_ms)
        ours["x-contextgate-attempts"] = str(attempt)
        predicted = result.report.cache_break
        if predicted is not None:
            ours[CACHE_BREAK_HEADER] = predicted
        sent = _Sent(services, call, chat, wire, headers, restorer, sent_at, sending, ours)
        if is_event_stream(response):
            return await sent.streamed(response, span, watch)
        limit = None if response.is_success else upstream.settings.max_error_body_bytes
        with span.current():
            body = await watch.run(upstream.read_body(response, limit))
            if response.is_success:
                wire.check(body)
        span.answered(response.status_code, body)
        services.metrics.upstream_answered(
            upstream.provider, perf_counter() - sending, response.is_success
        )
        if retry and is_context_overflow(response.status_code, body):
            return Overflowed(Buffered(response, body, ours), chat)
        return await sent.buffered(response, body, watch)
    except BaseException:
        # A client gone before ``read_body`` or ``first_event`` started: ``ClientWatch.run``
        # closes their coroutines unstarted, so their own ``aclose`` never ran and the
        # upstream connection would stay checked out of the pool (and a stream running).
        if response is not None and not response.is_closed:
            with anyio.CancelScope(shield=True):
                await response.aclose()
        raise
    finally:
        watch.close()


def _restorer(services: Services, chat: ChatRequest) -> Restorer:
    """The restore calls' answerer for a request that carries the restore tool: within
    the room its budget leaves."""
    report, pipeline = chat.result.report, services.pipeline
    counter = pipeline.counter(pipeline.catalog.lookup(report.model).encoding)
    return Restorer(
        services.stores.objects,
        chat.namespace,
        counter,
        room=report.budget - report.tokens_after,
    )


@dataclass(slots=True)
class _Sent:
    """A request sent: its answer read on (restore calls answered, usage noted, the
    conversation's record kept)."""

    services: Services
    call: Call
    chat: ChatRequest
    wire: Wire
    headers: Mapping[str, str]
    restorer: Restorer | None
    sent_at: float
    sending: float
    ours: dict[str, str]

    async def streamed(
        self, response: httpx.Response, span: UpstreamCall, watch: ClientWatch
    ) -> Buffered | Streamed:
        wire, upstream = self.wire, self.wire.upstream
        events = span.streamed(response.status_code, upstream.events(response))
        first = await watch.run(first_event(events))
        failed = wire.stream_error(first)
        self.services.metrics.upstream_answered(
            upstream.provider, perf_counter() - self.sending, failed is None
        )
        if failed is not None:
            await close(events)
            status, body = failed
            return Buffered(response, body, self.ours, status=status)
        tracker = wire.usage_tracker()
        tracker.add(first)
        metered = _Metered(events, tracker)
        relayed: AsyncIterator[bytes] = metered
        if self.restorer is not None:
            resend = _resend_stream(wire, self.chat.result.request, self.headers)
            relayed = wire.stream(first, metered, self.restorer, resend)
            first = b""
        remembering = _Remembering(self, relayed, metered, tracker)
        return Streamed(response, first, remembering, self.ours)

    async def buffered(self, response: httpx.Response, body: bytes, watch: ClientWatch) -> Buffered:
        # The first answer's usage is the conversation's: its next request has none of the
        # restore rounds' turns (the client's body still adds every round up).
        usage = self.wire.usage(body) if response.is_success else None
        answer_id = self.wire.answer_id(body) if response.is_success else None
        restorer, outgoing = self.restorer, self.chat.result.request
        if response.is_success and restorer is not None:
            try:
                body = await watch.run(
                    self.wire.complete(body, restorer, _resend(self.wire, outgoing, self.headers))
                )
            except UpstreamAnswered as answered:
                response, body = answered.response, answered.body
            self.ours["x-contextgate-restore"] = restorer.stats.header()
        if response.is_success:
            cause = self.done(usage, answer_id)
            self.ours.pop(CACHE_BREAK_HEADER, None)
            if cause is not None:
                self.ours[CACHE_BREAK_HEADER] = cause
        return Buffered(response, body, self.ours)

    def done(self, usage: dict[str, Any] | None, answer_id: str | None) -> str | None:
        """Judge and count the request's cache break with the usage it got back, note it
        in the request's record and keep the conversation's; the break's cause."""
        cause = note_cache_break(self.services.metrics, self.chat, usage)
        record = self.call.record
        record.answered, record.usage, record.cache_break = True, usage, cause
        chat = self.chat
        edits = len(chat.result.report.applied_edits) + (chat.compaction is not None)
        state = chat.result.state.answered(
            at=self.sent_at, usage=usage, answer_id=answer_id, edits=edits
        )
        if self.restorer is not None:
            state = state.with_restore_tool()
        self.services.remember(chat.namespace, chat.conversation, state)
        return cause


def _resend(wire: Wire, outgoing: dict[str, Any], headers: Mapping[str, str]) -> Resend:
    async def resend(extra: list[dict[str, Any]]) -> bytes:
        call = UpstreamCall.start(wire.upstream.provider, outgoing, restore=True)
        with call.current():
            response = await wire.send(outgoing, headers, extra=extra)
            limit = None if response.is_success else wire.upstream.settings.max_error_body_bytes
            body = await wire.upstream.read_body(response, limit)
            if response.is_success and not is_event_stream(response):
                wire.check(body)
        call.answered(response.status_code, body)
        if not response.is_success or is_event_stream(response):
            raise UpstreamAnswered(response, body)
        return body

    return resend


def _resend_stream(
    wire: Wire, outgoing: dict[str, Any], headers: Mapping[str, str]
) -> ResendStream:
    async def resend(extra: list[dict[str, Any]]) -> tuple[bytes, AsyncIterator[bytes]]:
        call = UpstreamCall.start(wire.upstream.provider, outgoing, restore=True)
        with call.current():
            response = await wire.send(outgoing, headers, extra=extra)
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
    is closed before it started), the request's record and the conversation's are kept
    once, with the usage ``tracker`` read from the upstream's first answer, and the events
    are closed, and so is ``upstream``, the first answer's own events under them
    (``events`` may be a restore loop around them that never started, and so would close
    nothing)."""

    __slots__ = ("_done", "_events", "_sent", "_tracker", "_upstream")

    def __init__(
        self,
        sent: _Sent,
        events: AsyncIterator[bytes],
        upstream: AsyncIterator[bytes],
        tracker: UsageTracker,
    ) -> None:
        self._sent = sent
        self._events, self._upstream = events, upstream
        self._tracker = tracker
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
        self._sent.done(self._tracker.usage, self._tracker.answer_id)
        with anyio.CancelScope(shield=True):
            for events in (self._events, self._upstream):
                await close(events)
