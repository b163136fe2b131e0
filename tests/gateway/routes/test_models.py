"""GET /v1/models relays the upstream's list with the caller's credentials."""

from __future__ import annotations

import openai
import pytest

from tests.harness import GatewayServer
from tests.mock_upstream import JSONReply, MockUpstream


def test_models_list_equals_direct(gateway: GatewayServer, upstream: MockUpstream) -> None:
    """The SDK lists the same models through the gateway as directly, and the caller's key
    is what the upstream sees."""
    listing = {
        "object": "list",
        "data": [
            {"id": "gpt-4o", "object": "model", "created": 1, "owned_by": "openai"},
            {"id": "gpt-4.1", "object": "model", "created": 2, "owned_by": "openai"},
        ],
    }
    upstream.push(JSONReply(listing), JSONReply(listing))
    clients = [
        openai.OpenAI(base_url=base, api_key="sk-caller", max_retries=0)
        for base in (upstream.base_url, gateway.base_url)
    ]
    direct, via = ([m.model_dump() for m in client.models.list()] for client in clients)
    for client in clients:
        client.close()
    assert via == direct
    assert [m["id"] for m in via] == ["gpt-4o", "gpt-4.1"]
    assert upstream.received[1].path == "/v1/models"
    assert upstream.received[1].headers["authorization"] == "Bearer sk-caller"


def test_models_upstream_error_relayed(gateway: GatewayServer, upstream: MockUpstream) -> None:
    """A 401 from the upstream's model list reaches the SDK as AuthenticationError."""
    body = {
        "error": {
            "message": "bad key",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
    upstream.push(JSONReply(body, status=401))
    with (
        openai.OpenAI(base_url=gateway.base_url, api_key="sk-bad", max_retries=0) as client,
        pytest.raises(openai.AuthenticationError) as caught,
    ):
        client.models.list()
    assert caught.value.code == "invalid_api_key"
