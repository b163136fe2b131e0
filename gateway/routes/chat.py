"""``POST /v1/chat/completions``: run the pipeline, forward upstream, relay the answer."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from time import perf_counter
from typing import Any

import anyio
import httpx
import orjson
from litestar import Request, post
from litestar.response.base import ASGIResponse

from gateway import restore
from gateway.client import while_connected
from gateway.compaction import ChatRequest, compact_request, recompact
from gateway.errors import UpstreamStreamBroken
from gateway.headers import report_headers
from gateway.relay import buffered_response, first_event, is_event_stream, streamed_response
from gateway.restore import RESTORE_TOOL, Restorer, has_refs, with_restore_tool
from gateway.sse import event_data
from gateway.state import Gateway, new_request_id
from gateway.upstream import is_context_overflow, upstream_request_headers
from pipelines import TokenCounter

__all__ = ["MAX_ATTEMPTS", "chat_completions"]

log = logging.getLogger("contextgate.chat")

MAX_ATTEMPTS = 3
"""Upstream attempts per request: the first, then up to two after a context overflow."""


@post("/v1/chat/completions", status_code=200)
async def chat_completions(request: Request[Any, Any, Any]) -> ASGIResponse:
    """OpenAI Chat Completions, streamed or not, through the context pipeline."""
    started = perf_counter()
    gateway: Gateway = request.app.state.gateway
    request_id = request.state.request_id = new_request_id()
    chat = await compact_request(request)
    model = str(chat.body.get("model", ""))
    headers = upstream_request_headers(
        request.headers.items(), gateway.upstream_key(chat.caller, model)
    )
    headers["content-type"] = "application/json"
    upstream = gateway.upstream_for(model)
    own_ms = (perf_counter() - started) * 1000
    for attempt in range(1, MAX_ATTEMPTS + 1):
        result = chat.result
        outgoing = result.request
        content = orjson.dumps(outgoing) if result.changed else chat.raw
        restorer = None
        if (chat.state is not None and chat.state.restore_tool) or has_refs(content):
            tooled = with_restore_tool(outgoing)
            if tooled is not None:
                outgoing, content = tooled, orjson.dumps(tooled)
                counter = _counter(gateway, outgoing)
                restorer = Restorer(
                    gateway.stores.objects,
                    chat.namespace,
                    counter,
                    room=result.report.budget
                    - result.report.tokens_after
                    - counter.count_tools([RESTORE_TOOL]),
                )
        sent_at = time.time()
        response = await while_connected(
            request.receive,
            upstream.send("POST", "chat/completions", headers=headers, content=content),
        )
        if is_event_stream(response):
            events = upstream.events(response)
            first = await while_connected(request.receive, first_event(events))
            ours = report_headers(request_id, result.report, own_ms)
            ours["x-contextgate-attempts"] = str(attempt)
            if restorer is not None:
                events = restore.stream(
                    first, events, restorer, _resend_stream(gateway, outgoing, headers)
                )
                first = b""
            events = _Remembering(gateway, chat, sent_at, first, events, restorer is not None)
            return streamed_response(response, first, events, ours, request_id)
        limit = None if response.is_success else upstream.settings.max_error_body_bytes
        body = await while_connected(request.receive, upstream.read_body(response, limit))
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
    ours = report_headers(request_id, result.report, own_ms)
    ours["x-contextgate-attempts"] = str(attempt)
    if response.is_success and restorer is not None:
        try:
            body = await while_connected(
                request.receive,
                restore.complete(body, restorer, _resend(gateway, outgoing, headers, request)),
            )
        except _UpstreamAnswered as answered:
            response, body = answered.response, answered.body
        ours["x-contextgate-restore"] = restorer.stats.header()
    if response.is_success:
        state = result.state.answered(at=sent_at, usage=_usage(body))
        gateway.remember(
            chat.namespace,
            chat.conversation,
            state.with_restore_tool() if restorer is not None else state,
        )
    return buffered_response(response, body, ours)


class _UpstreamAnswered(Exception):
    """A restore round's request got an answer that is not a success: relayed as it is."""

    def __init__(self, response: httpx.Response, body: bytes) -> None:
        self.response, self.body = response, body


def _counter(gateway: Gateway, request: dict[str, Any]) -> TokenCounter:
    info = gateway.pipeline.catalog.lookup(str(request.get("model", "")))
    return gateway.pipeline.counter(info.encoding)


def _continued(outgoing: dict[str, Any], extra: list[dict[str, Any]]) -> bytes:
    return orjson.dumps({**outgoing, "messages": [*outgoing["messages"], *extra]})


def _resend(
    gateway: Gateway,
    outgoing: dict[str, Any],
    headers: dict[str, str],
    request: Request[Any, Any, Any],
) -> Callable[[list[dict[str, Any]]], Awaitable[bytes]]:
    upstream = gateway.upstream_for(str(outgoing.get("model", "")))

    async def resend(extra: list[dict[str, Any]]) -> bytes:
        response = await upstream.send(
            "POST", "chat/completions", headers=headers, content=_continued(outgoing, extra)
        )
        limit = None if response.is_success else upstream.settings.max_error_body_bytes
        body = await upstream.read_body(response, limit)
        if not response.is_success or is_event_stream(response):
            raise _UpstreamAnswered(response, body)
        return body

    return resend


def _resend_stream(
    gateway: Gateway, outgoing: dict[str, Any], headers: dict[str, str]
) -> Callable[[list[dict[str, Any]]], Awaitable[tuple[bytes, AsyncIterator[bytes]]]]:
    upstream = gateway.upstream_for(str(outgoing.get("model", "")))

    async def resend(extra: list[dict[str, Any]]) -> tuple[bytes, AsyncIterator[bytes]]:
        response = await upstream.send(
            "POST", "chat/completions", headers=headers, content=_continued(outgoing, extra)
        )
        if not is_event_stream(response):
            body = await upstream.read_body(response, upstream.settings.max_error_body_bytes)
            raise UpstreamStreamBroken(
                f"The upstream answered a restore round with {response.status_code}:"
                f" {body[:300].decode('utf-8', 'replace')}",
                code="upstream_error",
            )
        events = upstream.events(response)
        return await first_event(events), events

    return resend


class _Remembering:
    """``events`` relayed as they are; when the stream ends, however it ends (also when it
    is closed before it started), the conversation's record is stored once, with the usage
    of the stream's usage chunk if there was one, and the events are closed."""

    __slots__ = ("_chat", "_done", "_events", "_gateway", "_restore_tool", "_sent_at", "_usage")

    def __init__(
        self,
        gateway: Gateway,
        chat: ChatRequest,
        sent_at: float,
        first: bytes,
        events: AsyncIterator[bytes],
        restore_tool: bool,
    ) -> None:
        self._gateway, self._chat, self._sent_at = gateway, chat, sent_at
        self._events, self._restore_tool = events, restore_tool
        self._usage = _usage_event(first) if first else None
        self._done = False

    def __aiter__(self) -> _Remembering:
        return self

    async def __anext__(self) -> bytes:
        try:
            event = await self._events.__anext__()
        except BaseException:
            await self.aclose()
            raise
        if b'"usage"' in event:
            self._usage = _usage_event(event) or self._usage
        return event

    async def aclose(self) -> None:
        if self._done:
            return
        self._done = True
        chat = self._chat
        state = chat.result.state.answered(at=self._sent_at, usage=self._usage)
        self._gateway.remember(
            chat.namespace,
            chat.conversation,
            state.with_restore_tool() if self._restore_tool else state,
        )
        aclose = getattr(self._events, "aclose", None)
        if aclose is not None:
            with anyio.CancelScope(shield=True):
                await aclose()


def _usage(body: bytes) -> dict[str, Any] | None:
    """The ``usage`` of a JSON chat completion, if it has one."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    usage = data.get("usage") if isinstance(data, dict) else None
    return usage if isinstance(usage, dict) else None


def _usage_event(event: bytes) -> dict[str, Any] | None:
    data = event_data(event)
    if not data.startswith(b"{"):
        return None
    return _usage(data)
