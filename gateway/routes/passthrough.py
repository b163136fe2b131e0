"""Every other OpenAI route, relayed to the upstream as it came (``gateway.routes.relay``).

Litestar matches static path segments before parameters and does not backtrack, so the
catch-all is declared again under each of the gateway's own paths that has relayed
routes beneath it or beside it: ``GET /v1/chat/completions`` (stored completions; only
``POST`` runs the pipeline), ``/v1/chat/completions/{id}...``, ``/v1/models/{id}`` and
``/v1/responses/...`` (``compact``, retrieve, ``input_items``, ``cancel``, delete: only
``POST /v1/responses`` runs the pipeline).
``/v1/messages/*`` and ``/v1/context/*`` are the gateway's alone: an unknown path there
is a 404.
"""

from __future__ import annotations

from typing import Any, Final

from litestar import HttpMethod, Request, get, route
from litestar.response.base import ASGIResponse

from gateway.routes.relay import relay

__all__ = ["relayed", "stored_completions"]

_METHODS: Final = [
    HttpMethod.GET,
    HttpMethod.POST,
    HttpMethod.PUT,
    HttpMethod.PATCH,
    HttpMethod.DELETE,
]


@route(
    [
        "/v1/{path:path}",
        "/v1/chat/completions/{path:path}",
        "/v1/models/{path:path}",
        "/v1/responses/{path:path}",
    ],
    http_method=_METHODS,
    include_in_schema=False,
)
async def relayed(request: Request[Any, Any, Any]) -> ASGIResponse:
    """Any OpenAI route the gateway does not manage, relayed to the upstream."""
    return await relay(request)


@get("/v1/chat/completions", include_in_schema=False)
async def stored_completions(request: Request[Any, Any, Any]) -> ASGIResponse:
    """The stored chat completions' list, relayed (``POST`` is the pipeline's)."""
    return await relay(request)
