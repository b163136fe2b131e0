"""``GET /v1/models``: the upstream's model list, relayed with the caller's credentials,
and with tenants only the models the caller's tenant may use."""

from __future__ import annotations

from time import perf_counter
from typing import Any

import orjson
from litestar import Request, get
from litestar.response.base import ASGIResponse

from gateway.http.client import while_connected
from gateway.http.forwarding import upstream_request_headers
from gateway.http.headers import report_headers
from gateway.http.responses import buffered_response
from gateway.providers.openai import json_answer
from gateway.routes.calls import caller_of, record_of, runtime_of
from gateway.tenancy.tenants import Profile

__all__ = ["list_models"]


@get("/v1/models")
async def list_models(request: Request[Any, Any, Any]) -> ASGIResponse:
    """The models the caller may use (in passthrough mode: what the upstream lists)."""
    started = perf_counter()
    gateway = runtime_of(request)
    request_id = record_of(request).request_id
    caller = caller_of(request)
    headers = upstream_request_headers(request.headers.items(), caller.upstream_key)
    own_ms = (perf_counter() - started) * 1000
    upstream = gateway.upstream
    response = await while_connected(
        request.receive, upstream.send("GET", "models", headers=headers)
    )
    limit = None if response.is_success else upstream.settings.max_error_body_bytes
    body = await while_connected(request.receive, upstream.read_body(response, limit))
    if response.is_success and caller.profile.models != ("*",):
        body = _allowed(body, caller.profile)
    return buffered_response(response, body, report_headers(request_id, None, own_ms))


def _allowed(body: bytes, profile: Profile) -> bytes:
    """The list in ``body`` without the models ``profile`` may not use."""
    listing = json_answer(body, "a model list", listing="data")
    listing["data"] = [
        entry
        for entry in listing["data"]
        if isinstance(entry, dict) and profile.allows(str(entry.get("id", "")))
    ]
    return orjson.dumps(listing)
