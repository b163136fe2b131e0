"""``POST /v1/messages`` (and ``/v1/messages/count_tokens``): the Anthropic Messages API,
inbound, so the anthropic SDK and Claude-Code-style agents work with ``base_url`` alone.

The request is read as a Messages request, turned into the chat request the pipeline works
on (``gateway.codecs.messages``), compacted like any other, then sent on:

- to the built-in Anthropic provider (``claude-*`` models), natively: the pipeline's
  request goes back to Messages form with the client's own Anthropic-only fields (its
  ``context_management`` as sent, with the provider's compaction added under
  ``native=prefer``), and the answer is Anthropic's own bytes, streamed or not
  (``MessagesWire``);
- to an OpenAI-compatible upstream (any other model), as chat completions, and the answer
  comes back translated: a completion into a Messages answer, chunks into Messages events
  as they arrive, an error into Anthropic's error envelope; with the native edits the
  gateway applied for it (``applied_edits``) and, once the client's compaction was due,
  the gateway's ``compaction`` block first. A compaction paused after it, or asked on
  demand, is answered without asking the model.

``count_tokens`` counts the request as it would go (no new compaction made), with
``context_management.original_input_tokens`` when the gateway applied edits to it.

Errors, the gateway's own and relayed ones, use Anthropic's envelope
``{"type": "error", "error": {"type", "message"}}``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson
from litestar import Request, post
from litestar.response.base import ASGIResponse

from gateway.codecs.chat_anthropic import (
    THINKING_BINDING_BETA,
    sends_thinking,
    unbinding,
    with_beta,
)
from gateway.codecs.messages import parse_request, to_request
from gateway.codecs.messages.sdk_tables import COUNTED
from gateway.codecs.messages_openai import (
    EventTranslator,
    error_from_openai,
    message_of,
    openai_request,
)
from gateway.context.answer import answer
from gateway.context.compaction import ChatRequest, compact, refuse_upstream_choice
from gateway.context.compaction_answers import block_events, paused, paused_events, with_block
from gateway.context.native import COMPACT_BETA, FIELD, preferred_field
from gateway.context.restore import chain
from gateway.context.wires import ChatWire, MessagesWire
from gateway.http.headers import report_headers
from gateway.http.responses import anthropic_error_event, buffered_response
from gateway.http.sse import event_data
from gateway.providers.anthropic import AnthropicUpstream
from gateway.providers.openai import json_answer
from gateway.routes.answers import Translation, reporting_edits, respond
from gateway.routes.calls import received

__all__ = ["count_tokens", "messages"]


@post("/v1/messages", status_code=200)
async def messages(request: Request[Any, Any, Any]) -> ASGIResponse:
    """Anthropic Messages, streamed or not, through the context pipeline."""
    gateway, call, raw = await received(request)
    inbound = parse_request(raw)
    refuse_upstream_choice(inbound.native)
    chat = await compact(gateway, call, inbound.chat, native_api="messages")
    target = chat.target
    assert target is not None  # not a dry run
    keepalive = gateway.settings.stream_keepalive
    anthropic = target.provider
    if not isinstance(anthropic, AnthropicUpstream):
        compaction = chat.compaction
        edit = chat.native.edits.compact if chat.native is not None else None
        if compaction is not None and edit is not None and edit.pause_after_compaction:
            gateway.remember(
                chat.namespace,
                chat.conversation,
                chat.result.state.answered(
                    at=time.time(), edits=len(chat.result.report.applied_edits) + 1
                ),
            )
            return _paused(chat, compaction, call.request_id)
        wire = ChatWire(anthropic, openai_request)
        got = await answer(gateway, call, chat, wire, target.headers)
        sent = got.chat or chat  # after an overflow retry, what went up then
        base = _from_openai(_answer_ids(chat))
        translation = reporting_edits(base, sent.result.report.applied_edits, client="messages")
        translation = translation or base
        if sent.compaction is not None:
            translation = _with_compaction(translation, sent.compaction)
        return respond(
            got,
            call.request_id,
            keepalive=keepalive,
            error=anthropic_error_event,
            translation=translation,
        )
    info = gateway.pipeline.catalog.lookup(target.model)
    native, headers = inbound.native, target.headers
    if info.thinking_bound and chat.rewritten:
        native, headers = _unbound(native, headers, chat)
    if chat.native is not None and chat.native.mode == "prefer":
        native = {**native, FIELD: preferred_field(chat.native, native.get(FIELD))}
        headers = with_beta(headers, COMPACT_BETA)

    def request_for(outgoing: Mapping[str, Any]) -> dict[str, Any]:
        return to_request(outgoing, native, default_max_tokens=info.output_reserve)

    got = await answer(gateway, call, chat, MessagesWire(anthropic, request_for), headers)
    return respond(got, call.request_id, keepalive=keepalive, error=anthropic_error_event)


@post("/v1/messages/count_tokens", status_code=200)
async def count_tokens(request: Request[Any, Any, Any]) -> ASGIResponse:
    """The input tokens of a Messages request as the gateway would send it (compacted, no
    summary model asked, with the restore tool when it would carry it): Anthropic's own
    count for ``claude-*`` models, the gateway's for the others."""
    gateway, call, raw = await received(request)
    inbound = parse_request(raw, counting=True)
    chat = await compact(gateway, call, inbound.chat, dry_run=True, native_api="messages")
    report = chat.result.report
    model = str(inbound.chat.get("model", ""))
    ours = report_headers(call.request_id, report, report.ms)
    if not isinstance(gateway.upstream_for(model), AnthropicUpstream):
        counted: dict[str, Any] = {"input_tokens": report.tokens_after}
        if chat.native is not None and chat.native.polyfilled:
            original = report.received_tokens
            counted["context_management"] = {"original_input_tokens": original}
        body = orjson.dumps(counted)
        return ASGIResponse(body=body, media_type="application/json", headers=ours)
    target = gateway.target(call.caller, model, call.headers)
    anthropic = target.provider
    assert isinstance(anthropic, AnthropicUpstream)
    native, headers = inbound.native, target.headers
    if gateway.pipeline.catalog.lookup(model).thinking_bound and chat.rewritten:
        native, headers = _unbound(native, headers, chat)
    messages = to_request(chat.result.request, native, default_max_tokens=1)
    counted = {k: v for k, v in messages.items() if k in COUNTED}
    response = await anthropic.count_tokens(orjson.dumps(counted), headers)
    return buffered_response(response, await anthropic.read_body(response), ours)


def _from_openai(seen: tuple[str, ...]) -> Translation:
    """An OpenAI-compatible model's answers as a Messages client takes them: a completion
    as a message (its id its own when ``seen`` had the upstream's), chunks as events, an
    error in Anthropic's envelope."""

    def body(status: int, data: bytes) -> bytes:
        if not 200 <= status < 300:
            return error_from_openai(status, data)
        completion = json_answer(data, "a chat completion")
        return orjson.dumps(message_of(completion, seen))

    def events(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        return _translated(first, rest, seen)

    return Translation(body, events)


def _with_compaction(translation: Translation, compaction: dict[str, Any]) -> Translation:
    """``translation`` with the gateway's ``compaction`` block first in the answer."""

    def body(status: int, data: bytes) -> bytes:
        data = translation.body(status, data)
        return with_block(data, compaction) if 200 <= status < 300 else data

    def events(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        return block_events(translation.events(first, rest), compaction)

    return Translation(body, events, translation.headers)


def _paused(chat: ChatRequest, compaction: dict[str, Any], request_id: str) -> ASGIResponse:
    """The answer to a request paused after the gateway's compaction: the block alone,
    streamed or not as asked; nothing was sent upstream."""
    report = chat.result.report
    model = str(chat.body.get("model", ""))
    message = paused(model, compaction, report.tokens_after, report.applied_edits)
    headers = report_headers(request_id, report, report.ms)
    if chat.body.get("stream"):
        stream = b"".join(paused_events(message))
        return ASGIResponse(body=stream, media_type="text/event-stream", headers=headers)
    return ASGIResponse(body=orjson.dumps(message), media_type="application/json", headers=headers)


def _unbound(
    native: dict[str, Any], headers: dict[str, str], chat: ChatRequest
) -> tuple[dict[str, Any], dict[str, str]]:
    """``native`` and ``headers`` asking the API to drop, not refuse, the thinking blocks
    sent back whose prefix the gateway rewrote (a model that binds thinking to its prefix);
    as they are when no thinking block goes back."""
    binding = unbinding(native.get("thinking")) if sends_thinking(chat.result.request) else None
    if binding is None:
        return native, headers
    return {**native, "thinking": binding}, with_beta(headers, THINKING_BINDING_BETA)


def _answer_ids(chat: ChatRequest) -> tuple[str, ...]:
    """The upstream's ids of the conversation's earlier answers: a translated answer that
    repeats one gets an id of its own."""
    return chat.state.answer_ids if chat.state is not None else ()


async def _translated(
    first: bytes, events: AsyncIterator[bytes], seen: tuple[str, ...]
) -> AsyncIterator[bytes]:
    """An OpenAI chunk stream as Messages events, each made when its chunk arrives."""
    translator = EventTranslator(seen)
    chunks = chain(first, events)
    try:
        async for event in chunks:
            data = event_data(event).strip()
            if data == b"[DONE]":
                break
            try:
                chunk = orjson.loads(data)
            except orjson.JSONDecodeError:
                continue  # empty, a comment, or not JSON: nothing a Messages client could use
            if isinstance(chunk, dict):
                for out in translator.add(chunk):
                    yield out
        for out in translator.close():
            yield out
    finally:
        await chunks.aclose()
