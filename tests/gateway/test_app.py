"""The application as a whole: its OpenAPI document."""

from __future__ import annotations

import httpx

from tests.harness import GatewayServer


def test_openapi_document_lists_the_routes(gateway: GatewayServer) -> None:
    """The gateway publishes an OpenAPI document naming its own routes."""
    response = httpx.get(f"{gateway.url}/schema/openapi.json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    for path in (
        "/v1/chat/completions",
        "/v1/models",
        "/v1/context/compact",
        "/healthz",
        "/readyz",
    ):
        assert path in paths
