"""schemathesis over the gateway's own OpenAPI document (``/schema/openapi.json``), against
a running gateway: no operation answers with a server error, and responses match what the
document says of them. ``CONTEXTGATE_FUZZ=deep`` runs many more examples."""

from __future__ import annotations

import os

import httpx
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from gateway.app import create_app
from gateway.settings import Settings
from tests.harness import GatewayServer

DEEP = os.environ.get("CONTEXTGATE_FUZZ") == "deep"


DOCUMENT = create_app(Settings(summaries=False)).openapi_schema.to_schema()
"""The gateway's document as Litestar builds it (the one served is checked to be it);
loaded at import, as schemathesis's lazy fixture loader does not work with pytest 9."""
schema = schemathesis.openapi.from_dict(DOCUMENT)


def test_document_is_served(fuzz_client: httpx.Client) -> None:
    """``/schema/openapi.json`` serves the document the operations below come from."""
    response = fuzz_client.get("/schema/openapi.json")
    assert response.status_code == 200
    assert response.json() == DOCUMENT


@schema.parametrize()
@settings(
    max_examples=1_000 if DEEP else 25,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_openapi_operations(case: schemathesis.Case, fuzz_gateway: GatewayServer) -> None:
    """Every documented operation, with generated parameters and bodies: no 5xx, and each
    response conforms to the document."""
    case.call_and_validate(
        base_url=fuzz_gateway.url, checks=[not_a_server_error, response_schema_conformance]
    )
