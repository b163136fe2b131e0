"""``GET /metrics``: the gateway's Prometheus metrics, for the scraper. It asks for no key
(a scraper has none, and no label holds a secret): expose it to the scraper only. Every
family is in ``docs/OBSERVABILITY.md``."""

from __future__ import annotations

from typing import Any

from litestar import Request, get
from litestar.response.base import ASGIResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.routes.calls import runtime_of

__all__ = ["metrics"]


@get("/metrics", sync_to_thread=False, opt={"public": True})
def metrics(request: Request[Any, Any, Any]) -> ASGIResponse:
    """The metrics in Prometheus' text format."""
    gateway = runtime_of(request)
    body = generate_latest(gateway.metrics.registry)
    return ASGIResponse(body=body, headers={"content-type": CONTENT_TYPE_LATEST})
