"""``POST /v1/chat/completions``: parse, compact, exchange with the upstream, respond.

To an OpenAI-compatible upstream the pipeline's request goes as it is and the answer comes
back as it came, except for the client's Anthropic-style ``context_management``, which the
gateway applies itself (``gateway.context.native``): the field does not go up, and the
answer reports the edits applied (``routes.answers.reporting_edits``).

To Claude (``claude-*`` models) the request goes as its Messages translation over the
Anthropic wire (``gateway.codecs.chat_anthropic``: the restore loop and the conversation's
record work on Anthropic's own answer) and the answer is translated back: a
message into a chat completion, the Messages events into chunks as they arrive (with a
usage chunk when the client asked for one), an error into OpenAI's envelope.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from functools import partial
from typing import Any, Final

import orjson
from litestar import Request, post
from litestar.response.base import ASGIResponse

from gateway.codecs.chat_anthropic import (
    THINKING_BINDING_BETA,
    ChunkTranslator,
    from_message,
    openai_error,
    sends_thinking,
    to_messages,
    unbinding,
    with_beta,
)
from gateway.codecs.openai import parse_chat_request
from gateway.context.answer import answer
from gateway.context.call import Target
from gateway.context.compaction import ChatRequest, compact
from gateway.context.exchange import Buffered, Streamed
from gateway.context.native import without_field
from gateway.context.restore import chain
from gateway.context.wires import ChatWire, MessagesWire
from gateway.http.sse import close, event_data
from gateway.providers.anthropic import AnthropicUpstream
from gateway.providers.openai import json_answer
from gateway.routes.answers import Translation, reporting_edits, respond
from gateway.routes.calls import received

__all__ = ["chat_completions"]

_RELAYED_ON_ERROR: Final = frozenset({"retry-after", "retry-after-ms", "request-id"})
"""Headers of Claude's error answer a chat client still gets (its SDK's backoff), with
``anthropic-ratelimit-*``; a translated success keeps none of Anthropic's."""


@post("/v1/chat/completions", status_code=200)
async def chat_completions(request: Request[Any, Any, Any]) -> ASGIResponse:
    """OpenAI Chat Completions, streamed or not, through the context pipeline."""
    gateway, call, raw = await received(request)
    chat = await compact(gateway, call, parse_chat_request(raw), raw=raw, native_api="chat")
    target = chat.target
    assert target is not None  # not a dry run
    keepalive = gateway.settings.stream_keepalive
    anthropic = target.provider
    if not isinstance(anthropic, AnthropicUpstream):
        prepare = without_field if chat.native is not None else None
        got = await answer(gateway, call, chat, ChatWire(anthropic, prepare), target.headers)
        translation = reporting_edits(None, _applied(got, chat), client="chat")
        return respond(got, call.request_id, keepalive=keepalive, translation=translation)
    info = gateway.pipeline.catalog.lookup(target.model)
    headers, binding = _bound(chat, target) if info.thinking_bound else (target.headers, None)
    request_for = partial(to_messages, default_max_tokens=info.output_reserve, thinking=binding)
    got = await answer(
        gateway, call, chat, MessagesWire(anthropic, request_for, for_chat=True), headers
    )
    options = chat.body.get("stream_options")
    usage = isinstance(options, Mapping) and bool(options.get("include_usage"))
    translation = reporting_edits(_from_claude(usage), _applied(got, chat), client="chat")
    return respond(got, call.request_id, keepalive=keepalive, translation=translation)


def _applied(got: Buffered | Streamed, chat: ChatRequest) -> list[dict[str, Any]]:
    """The native edits the gateway applied to what went up (after an overflow retry,
    to the request compacted again)."""
    return (got.chat or chat).result.report.applied_edits


def _bound(chat: ChatRequest, target: Target) -> tuple[dict[str, str], dict[str, Any] | None]:
    """To a model that binds thinking to its prefix, when the gateway rewrote what precedes
    the thinking blocks the client sends back: the API drops those that no longer match
    instead of refusing (``gateway.codecs.chat_anthropic.unbinding``). Thinking the client set
    with ``reasoning_effort`` is the codec's to make: left alone."""
    effort_only = chat.body.get("thinking") is None and chat.body.get("reasoning_effort")
    if not chat.rewritten or effort_only or not sends_thinking(chat.result.request):
        return target.headers, None
    binding = unbinding(chat.body.get("thinking"))
    if binding is None:
        return target.headers, None
    return with_beta(target.headers, THINKING_BINDING_BETA), binding


def _from_claude(include_usage: bool) -> Translation:
    """Claude's answers as a chat client takes them."""

    def body(status: int, data: bytes) -> bytes:
        if not 200 <= status < 300:
            return openai_error(status, data)
        message = json_answer(data, "a message", listing="content")
        return orjson.dumps(from_message(message, created=int(time.time())))

    def events(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        translator = ChunkTranslator(created=int(time.time()), include_usage=include_usage)
        return _chunks(first, rest, translator)

    return Translation(body, events, _headers_from_claude)


def _headers_from_claude(status: int, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    if 200 <= status < 300:
        return []
    return [
        (name, value)
        for name, value in headers
        if name.lower() in _RELAYED_ON_ERROR or name.lower().startswith("anthropic-ratelimit-")
    ]


async def _chunks(
    first: bytes, events: AsyncIterator[bytes], translator: ChunkTranslator
) -> AsyncIterator[bytes]:
    """Messages events as OpenAI chunks, each made when its event arrives, then
    ``[DONE]``; an error event ends the stream with its ``{"error": ...}`` chunk."""
    chained = chain(first, events)
    try:
        async for event in chained:
            try:
                found = orjson.loads(event_data(event))
            except orjson.JSONDecodeError:
                continue  # not an event a client could use
            if not isinstance(found, dict):
                continue
            for chunk in translator.add(found):
                yield b"data: " + orjson.dumps(chunk) + b"\n\n"
            if found.get("type") == "error":
                return
        yield b"data: [DONE]\n\n"
    finally:
        await close(chained)
