"""schemathesis over the gateway's own OpenAPI document (``/schema/openapi.json``), against
a running gateway: operations get bodies and headers generated from the document's
schemas; no answer is a server error, every answer's status, content type, headers and
body are ones the document declares, and on the POST routes a body the document calls
valid is accepted. ``CONTEXTGATE_FUZZ=deep`` runs many more examples."""

from __future__ import annotations

import os

import httpx
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    positive_data_acceptance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gateway.app import create_app
from gateway.config import Settings
from gateway.routes.openapi import complete
from tests.harness import GatewayServer

DEEP = os.environ.get("CONTEXTGATE_FUZZ") == "deep"


DOCUMENT = complete(create_app(Settings(summaries=False)).openapi_schema.to_schema())
"""The gateway's document as it serves it (checked below to be it); loaded at import, as
schemathesis's lazy fixture loader does not work with pytest 9."""
schema = schemathesis.openapi.from_dict(DOCUMENT)

CONFORMANCE = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


def test_document_is_served(fuzz_client: httpx.Client) -> None:
    """``/schema/openapi.json`` serves the document the operations below come from."""
    response = fuzz_client.get("/schema/openapi.json")
    assert response.status_code == 200
    assert response.json() == DOCUMENT


@schema.parametrize()
@settings(
    max_examples=500 if DEEP else 8,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_openapi_operations(case: schemathesis.Case, fuzz_gateway: GatewayServer) -> None:
    """Every documented operation, with generated parameters and bodies: no 5xx, answers
    as documented, and on the POST routes valid bodies accepted. (A valid ``start_line``
    after ``end_line`` is a 400 the document cannot rule out.)"""
    checks = CONFORMANCE
    # Only generated cases: schemathesis's coverage phase fills an optional header with
    # values its pattern does not admit ("0" for the policy) and still calls them valid.
    if case.method == "POST" and case.meta is not None and case.meta.phase.name == "FUZZING":
        checks = [*CONFORMANCE, positive_data_acceptance]
    case.call_and_validate(base_url=fuzz_gateway.url, checks=checks)
