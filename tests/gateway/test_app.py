"""The application as a whole: its OpenAPI document, and what building it loads."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx

from tests.harness import GatewayServer

LOADED_BY_WHAT_NEEDS_THEM = (
    "anthropic",  # the first Claude request (or the warm-up, with an Anthropic key)
    "httpx2",  # the anthropic SDK's HTTP library, with it
    "pydantic",  # the anthropic SDK's, with it
    "redis",  # a Redis store
    "jinja2",  # the inspector's first page
    "websockets",  # the Responses WebSocket's first connection
    "jiter",  # a Messages answer whose tool call's arguments were cut short
    "uvicorn",  # the server, for ``contextgate serve``
    "opentelemetry.sdk",  # tracing on
    "opentelemetry.instrumentation",  # tracing on
)


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


def test_the_application_is_built_without_what_only_some_requests_need() -> None:
    """Building the application with the defaults loads none of the parts some requests or
    settings need (a provider's SDK, Redis, the inspector's templates, the WebSocket
    library, tracing's SDK), nor the server: each is loaded by what needs it."""
    code = (
        "import sys\n"
        "from gateway.app import create_app\n"
        "from gateway.config import load_settings\n"
        "create_app(load_settings(None))\n"
        f"names = {LOADED_BY_WHAT_NEEDS_THEM!r}\n"
        "print([n for n in names if any(m == n or m.startswith(n + '.') for m in sys.modules)])"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONTEXTGATE_", "OTEL_"))}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert done.stdout.strip() == "[]"
