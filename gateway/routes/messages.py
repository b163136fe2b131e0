"""``POST /v1/messages`` (and ``/v1/messages/count_tokens``): the Anthropic Messages API,
inbound, so the anthropic SDK and Claude-Code-style agents work with ``base_url`` alone.

The request is read as a Messages request, turned into the chat request the pipeline works
on (``gateway.codecs.anthropic_inbound``), compacted like any other, then sent on:

- to the built-in Anthropic provider (``claude-*`` models), natively: the pipeline's
  request goes back to Messages form with the client's own Anthropic-only fields, and the
  answer is Anthropic's own bytes, streamed or not (``MessagesWire``);
- to an OpenAI-compatible upstream (any other model), as chat completions, and the answer
  comes back translated: a completion into a Messages answer, chunks into Messages events
  as they arrive, an error into Anthropic's error envelope.

Errors, the gateway's own and relayed ones, use Anthropic's envelope
``{"type": "error", "error": {"type", "message"}}``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from time import perf_counter
from typing import Any, Final

import orjson
from anthropic.types import MessageCountTokensParams as CountTokensParams
from anthropic.types.beta import MessageCountTokensParams as BetaCountTokensParams
from litestar import Request, post
from litestar.response.base import ASGIResponse

from gateway.codecs.anthropic import (
    THINKING_BINDING_BETA,
    sends_thinking,
    unbinding,
    with_beta,
)
from gateway.codecs.anthropic_inbound import (
    EventTranslator,
    error_from_openai,
    message_of,
    openai_request,
    parse_request,
    to_request,
)
from gateway.context.compaction import (
    ChatRequest,
    compact_request,
    refuse_upstream_choice,
    request_body,
)
from gateway.context.exchange import Buffered, exchange
from gateway.context.restore import chain
from gateway.context.wires import ChatWire, MessagesWire
from gateway.http.headers import report_headers
from gateway.http.responses import anthropic_error_event, buffered_response, streamed_response
from gateway.http.sse import event_data
from gateway.providers.openai import json_answer, upstream_request_headers
from gateway.runtime import Gateway

__all__ = ["count_tokens", "messages"]

_COUNTED: Final = (
    CountTokensParams.__required_keys__
    | CountTokensParams.__optional_keys__
    | BetaCountTokensParams.__required_keys__
    | BetaCountTokensParams.__optional_keys__
) - {"betas"}
"""The fields Anthropic's ``count_tokens`` takes (it refuses the rest), beta ones included,
as the installed SDK defines them: a field that changes the count (``context_management``,
a top-level ``cache_control``, ...) is not dropped. The SDK sends ``betas`` as a header."""


@post("/v1/messages", status_code=200)
async def messages(request: Request[Any, Any, Any]) -> ASGIResponse:
    """Anthropic Messages, streamed or not, through the context pipeline."""
    started = perf_counter()
    gateway: Gateway = request.app.state.gateway
    request_id = request.state.request_id
    raw = await request_body(request)
    inbound = parse_request(raw)
    refuse_upstream_choice(inbound.native)
    chat = await compact_request(request, body=inbound.chat)
    model = str(inbound.chat.get("model", ""))
    headers = upstream_request_headers(
        request.headers.items(), gateway.upstream_key(chat.caller, model)
    )
    upstream = gateway.upstream_for(model)
    if upstream is gateway.anthropic:
        info = gateway.pipeline.catalog.lookup(model)
        native = inbound.native
        if info.thinking_bound and chat.rewritten:
            native, headers = _unbound(native, headers, chat)
        answer = await exchange(
            request,
            chat,
            MessagesWire(gateway.anthropic, native, info.output_reserve),
            headers,
            request_id=request_id,
            started=started,
        )
        if isinstance(answer, Buffered):
            return buffered_response(answer.response, answer.body, answer.headers, answer.status)
        return streamed_response(
            answer.response,
            answer.first,
            answer.events,
            answer.headers,
            request_id,
            anthropic_error_event,
            keepalive=gateway.settings.stream_keepalive,
        )
    headers["content-type"] = "application/json"
    answer = await exchange(
        request,
        chat,
        ChatWire(upstream, openai_request),
        headers,
        request_id=request_id,
        started=started,
    )
    if isinstance(answer, Buffered):
        status = answer.status or answer.response.status_code
        if 200 <= status < 300:
            completion = json_answer(answer.body, "a chat completion")
            body = orjson.dumps(message_of(completion, _answer_ids(chat)))
        else:
            body = error_from_openai(status, answer.body)
        return buffered_response(answer.response, body, answer.headers, status)
    events = _translated(answer.first, answer.events, _answer_ids(chat))
    return streamed_response(
        answer.response,
        b"",
        events,
        answer.headers,
        request_id,
        anthropic_error_event,
        keepalive=gateway.settings.stream_keepalive,
    )


@post("/v1/messages/count_tokens", status_code=200)
async def count_tokens(request: Request[Any, Any, Any]) -> ASGIResponse:
    """The input tokens of a Messages request as the gateway would send it (compacted, no
    summary model asked, with the restore tool when it would carry it): Anthropic's own
    count for ``claude-*`` models, the gateway's for the others."""
    gateway: Gateway = request.app.state.gateway
    request_id = request.state.request_id
    raw = await request_body(request)
    inbound = parse_request(raw, counting=True)
    chat = await compact_request(request, dry_run=True, body=inbound.chat)
    report = chat.result.report
    model = str(inbound.chat.get("model", ""))
    ours = report_headers(request_id, report, report.ms)
    outgoing = chat.result.request
    if gateway.upstream_for(model) is gateway.anthropic:
        headers = upstream_request_headers(
            request.headers.items(), gateway.upstream_key(chat.caller, model)
        )
        native = inbound.native
        if gateway.pipeline.catalog.lookup(model).thinking_bound and chat.rewritten:
            native, headers = _unbound(native, headers, chat)
        messages = to_request(outgoing, native, default_max_tokens=1)
        counted = {k: v for k, v in messages.items() if k in _COUNTED}
        response = await gateway.anthropic.count_tokens(orjson.dumps(counted), headers)
        body = await gateway.anthropic.read_body(response)
        return buffered_response(response, body, ours)
    body = orjson.dumps({"input_tokens": report.tokens_after})
    return ASGIResponse(body=body, media_type="application/json", headers=ours)


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
