"""``POST /v1/context/compact``: the pipeline as a dry run; nothing is sent upstream."""

from __future__ import annotations

from typing import Any

import orjson
from litestar import Request, post
from litestar.response.base import ASGIResponse

from gateway.codecs.openai import parse_chat_request
from gateway.context.compaction import compact
from gateway.http.headers import report_headers
from gateway.routes.calls import received

__all__ = ["compact_dry_run"]


@post("/v1/context/compact", status_code=200)
async def compact_dry_run(request: Request[Any, Any, Any]) -> ASGIResponse:
    """Returns ``{"request": <what would be sent>, "report": <what each stage did>,
    "policy": <the policy it ran under, every key resolved>}``."""
    gateway, call, raw = await received(request)
    chat = await compact(gateway, call, parse_chat_request(raw), raw=raw, dry_run=True)
    result = chat.result
    body = orjson.dumps(
        {
            "request": result.request,
            "report": result.report.as_dict(),
            "policy": chat.policy.as_wire(),
        }
    )
    headers = report_headers(call.request_id, result.report, result.report.ms)
    return ASGIResponse(body=body, media_type="application/json", headers=headers)
