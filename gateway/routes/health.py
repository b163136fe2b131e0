"""Liveness and readiness."""

from __future__ import annotations

from typing import Any

from litestar import Request, get
from litestar.response.base import ASGIResponse

from gateway.routes.calls import runtime_of

__all__ = ["healthz", "readyz"]

_JSON = "application/json"


@get("/healthz", opt={"public": True})
async def healthz() -> ASGIResponse:
    """The process is up and its event loop answers."""
    return ASGIResponse(body=b'{"status":"ok"}', media_type=_JSON)


@get("/readyz", opt={"public": True})
async def readyz(request: Request[Any, Any, Any]) -> ASGIResponse:
    """Ready to serve. A configured Redis that does not answer makes the gateway
    ``degraded`` (it still serves, keeping content rather than offloading it), not unready.
    ``store_failures`` counts store operations that failed since start; ``warm`` says
    whether what the first requests need has been loaded in the background since the port
    opened (``Gateway.warm``: requests are served meanwhile, each waiting for only what it
    needs). Once shutdown has begun the answer is 503 ``draining``, so that load balancers
    stop sending requests."""
    gateway = runtime_of(request)
    if gateway.draining.started:
        return ASGIResponse(body=b'{"status":"draining"}', status_code=503, media_type=_JSON)
    store = await gateway.stores.status()
    status = "degraded" if store == "redis-unreachable" else "ready"
    failures = gateway.stores.redis.failures if gateway.stores.redis is not None else 0
    warm = "true" if gateway.warmed else "false"
    body = (
        f'{{"status":"{status}","store":"{store}","store_failures":{failures},"warm":{warm}}}'
    ).encode()
    return ASGIResponse(body=body, media_type=_JSON)
