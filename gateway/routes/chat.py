"""``POST /v1/chat/completions``: run the pipeline, forward upstream, relay the answer."""

from __future__ import annotations

from time import perf_counter
from typing import Any

import orjson
from litestar import Request, post
from litestar.response.base import ASGIResponse

from gateway.codecs.openai import parse_chat_request
from gateway.disconnect import while_connected
from gateway.errors import RequestRejectedError
from gateway.headers import POLICY_HEADER, policy_from_header, report_headers
from gateway.relay import buffered_response, is_event_stream, streamed_response
from gateway.state import Gateway, new_request_id
from gateway.upstream import upstream_request_headers
from pipelines import CompactResult, RequestRejected

__all__ = ["chat_completions", "compact_request"]


async def compact_request(request: Request[Any, Any, Any]) -> tuple[bytes, CompactResult]:
    """Parse the chat body and run the pipeline over it under the request's policy."""
    gateway: Gateway = request.app.state.gateway
    raw = await request.body()
    body = parse_chat_request(raw)
    policy = policy_from_header(request.headers.get(POLICY_HEADER), gateway.default_policy)
    try:
        result = await gateway.pipeline.compact(body, policy=policy)
    except RequestRejected as exc:
        raise RequestRejectedError(str(exc), code=exc.code, param=exc.param) from exc
    return raw, result


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
    answered = perf_counter()
    own_ms = (before_upstream - started) * 1000
    if is_event_stream(response):
        own_ms += (perf_counter() - answered) * 1000
        return streamed_response(
            response, report_headers(request_id, result.report, own_ms), request_id
        )
    limit = None if response.is_success else upstream.settings.max_error_body_bytes
    body = await while_connected(request.receive, upstream.read_body(response, limit))
    read = perf_counter()
    ours = report_headers(request_id, result.report, own_ms + (perf_counter() - read) * 1000)
    return buffered_response(response, body, ours)
