"""``POST /v1/context/compact``: the pipeline as a dry run; nothing is sent upstream.

It takes a chat request, or a Responses request (a body with ``input`` and no
``messages``), and returns the request as it would go up in the same API."""

from __future__ import annotations

from typing import Any

import orjson
from litestar import Request, post
from litestar.response.base import ASGIResponse

from gateway.codecs.json_body import json_object
from gateway.codecs.openai import parse_chat_request
from gateway.codecs.responses.request import from_body, to_request
from gateway.context.compaction import compact
from gateway.context.native import without_field
from gateway.http.headers import report_headers
from gateway.routes.calls import received
from gateway.routes.responses import compacted, with_preferred

__all__ = ["compact_dry_run"]


@post("/v1/context/compact", status_code=200)
async def compact_dry_run(request: Request[Any, Any, Any]) -> ASGIResponse:
    """Returns ``{"request": <what would be sent>, "report": <what each stage did>,
    "policy": <the policy it ran under, every key resolved>}``."""
    gateway, call, raw = await received(request)
    body = json_object(raw)
    if "input" in body and "messages" not in body:
        inbound = from_body(body)
        chat = await compacted(gateway, call, inbound, dry_run=True)
        preferred = with_preferred(inbound, chat)
        sent = to_request(chat.result.request, preferred.native, inbound.messages)
    else:
        chat = await compact(
            gateway, call, parse_chat_request(raw), raw=raw, dry_run=True, native_api="chat"
        )
        sent = chat.result.request if chat.native is None else without_field(chat.result.request)
    result = chat.result
    answer = orjson.dumps(
        {
            "request": sent,
            "report": result.report.as_dict(),
            "policy": chat.policy.as_wire(),
        }
    )
    headers = report_headers(call.request_id, result.report, result.report.ms)
    return ASGIResponse(body=answer, media_type="application/json", headers=headers)
