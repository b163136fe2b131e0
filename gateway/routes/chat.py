"""``POST /v1/chat/completions``: run the pipeline, forward upstream, relay the answer."""

from __future__ import annotations

from time import perf_counter
from typing import Any

from litestar import Request, post
from litestar.response.base import ASGIResponse

from gateway.codecs.anthropic import (
    THINKING_BINDING_BETA,
    sends_thinking,
    unbinding,
    with_beta,
)
from gateway.context.compaction import compact_request
from gateway.context.exchange import Buffered, exchange
from gateway.context.wires import ChatWire
from gateway.http.responses import buffered_response, streamed_response
from gateway.providers.openai import upstream_request_headers
from gateway.runtime import Gateway

__all__ = ["chat_completions"]


@post("/v1/chat/completions", status_code=200)
async def chat_completions(request: Request[Any, Any, Any]) -> ASGIResponse:
    """OpenAI Chat Completions, streamed or not, through the context pipeline."""
    started = perf_counter()
    gateway: Gateway = request.app.state.gateway
    request_id = request.state.request_id
    chat = await compact_request(request)
    model = str(chat.body.get("model", ""))
    headers = upstream_request_headers(
        request.headers.items(), gateway.upstream_key(chat.caller, model)
    )
    headers["content-type"] = "application/json"
    upstream = gateway.upstream_for(model)
    wire = ChatWire(upstream)
    bound = upstream is gateway.anthropic and gateway.pipeline.catalog.lookup(model).thinking_bound
    # Thinking the client set with reasoning_effort is the codec's to make: left alone.
    effort_only = chat.body.get("thinking") is None and chat.body.get("reasoning_effort")
    binding = None
    if bound and chat.rewritten and not effort_only and sends_thinking(chat.result.request):
        binding = unbinding(chat.body.get("thinking"))
    if binding is not None:
        # As on the Messages route: thinking blocks the client sends back after what the
        # gateway rewrote are dropped by the API, not refused.
        wire = ChatWire(upstream, lambda outgoing: {**outgoing, "thinking": binding})
        headers = with_beta(headers, THINKING_BINDING_BETA)
    answer = await exchange(request, chat, wire, headers, request_id=request_id, started=started)
    if isinstance(answer, Buffered):
        return buffered_response(answer.response, answer.body, answer.headers, answer.status)
    return streamed_response(
        answer.response,
        answer.first,
        answer.events,
        answer.headers,
        request_id,
        keepalive=gateway.settings.stream_keepalive,
    )
