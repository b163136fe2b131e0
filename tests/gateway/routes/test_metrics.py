"""``GET /metrics``: the Prometheus text format, for the scraper, without credentials."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import Settings, TenantSettings, UpstreamSettings
from gateway.tenancy.tenants import hash_key
from tests.harness import GatewayServer
from tests.mock_upstream import MockUpstream

DOC = Path(__file__).resolve().parents[3] / "docs" / "OBSERVABILITY.md"


def test_metrics_are_served_to_a_scraper_without_a_key(upstream: MockUpstream) -> None:
    """Even with tenants (where every API route wants a gateway key), ``/metrics`` answers
    a scraper that sends none, in the text format it parses."""
    settings = Settings(
        upstream=UpstreamSettings(base_url=upstream.base_url, api_key="sk-upstream"),
        tenants=(TenantSettings("alpha", (hash_key("cg-alpha-key-0123456789abcdef"),)),),
        summaries=False,
    )
    with GatewayServer(settings) as server:
        refused = httpx.get(f"{server.base_url}/models")
        response = httpx.get(f"{server.url}/metrics")
    assert refused.status_code == 401
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    names = {family.name for family in text_string_to_metric_families(response.text)}
    assert {"contextgate_requests", "contextgate_store_circuit_open"} <= names


def test_every_family_is_documented(gateway: GatewayServer) -> None:
    """Each family the gateway exports has its row in docs/OBSERVABILITY.md."""
    text = httpx.get(f"{gateway.url}/metrics").text
    documented = set(re.findall(r"`(contextgate_[a-z_]+)", DOC.read_text()))
    for family in text_string_to_metric_families(text):
        if family.name.endswith("_created"):
            continue  # prometheus-client's creation time of a counter
        exported = family.name + ("_total" if family.type == "counter" else "")
        assert exported in documented, exported
