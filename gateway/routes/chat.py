"""``POST /v1/chat/completions``: run the pipeline, forward upstream, relay the answer."""

from __future__ import annotations

from time import perf_counter
from typing import Any

import orjson
from litestar import Request, post
from litestar.response.base import ASGIResponse

from gateway.client import while_connected
from gateway.compaction import compact_request
from gateway.headers import report_headers
from gateway.relay import buffered_response, first_event, is_event_stream, streamed_response
from gateway.state import Gateway, new_request_id
from gateway.upstream import upstream_request_headers

__all__ = ["chat_completions"]


@post("/v1/chat/completions", status_code=200)
async def chat_completions(request: Request[Any, Any, Any]) -> ASGIResponse:
    """OpenAI Chat Completions, streamed or not, through the context pipeline."""
    started = perf_counter()
    gateway: Gateway = request.app.state.gateway
    request_id = request.state.request_id = new_request_id()
    raw, result = await compact_request(request)
    content = orjson.dumps(result.request) if result.changed else raw
    headers = upstream_request_headers(request.headers.items(), gateway.settings.upstream.api_key)
    headers["content-type"] = "application/json"
    before_upstream = perf_counter()
    upstream = gateway.upstream
    response = await while_connected(
        request.receive, upstream.send("POST", "chat/completions", headers=headers, content=content)
    )
    own_ms = (before_upstream - started) * 1000
    if is_event_stream(response):
        events = upstream.events(response)
        first = await while_connected(request.receive, first_event(events))
        ours = report_headers(request_id, result.report, own_ms)
        return streamed_response(response, first, events, ours, request_id)
    limit = None if response.is_success else upstream.settings.max_error_body_bytes
    body = await while_connected(request.receive, upstream.read_body(response, limit))
    return buffered_response(response, body, report_headers(request_id, result.report, own_ms))
