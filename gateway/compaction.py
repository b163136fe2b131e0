"""Reading a chat request off the wire and running the pipeline over it.

Shared by the chat route, which then forwards the result, and the dry-run route, which
returns it.
"""

from __future__ import annotations

from typing import Any

from litestar import Request

from gateway.client import read_body
from gateway.codecs.openai import parse_chat_request
from gateway.errors import RequestRejectedError
from gateway.headers import POLICY_HEADER, policy_from_header
from gateway.state import Gateway
from pipelines import CompactResult, RequestRejected

__all__ = ["compact_request"]


async def compact_request(request: Request[Any, Any, Any]) -> tuple[bytes, CompactResult]:
    """The raw body and the pipeline's result for it, under the request's policy."""
    gateway: Gateway = request.app.state.gateway
    raw = await read_body(
        request.receive, request.headers.get("content-length"), gateway.settings.max_body_bytes
    )
    body = parse_chat_request(raw)
    policy = policy_from_header(request.headers.get(POLICY_HEADER), gateway.default_policy)
    try:
        result = await gateway.pipeline.compact(body, policy=policy)
    except RequestRejected as exc:
        raise RequestRejectedError(str(exc), code=exc.code, param=exc.param) from exc
    return raw, result
