"""The served OpenAPI document: well formed, and declaring every route with its bodies,
headers and key statuses."""

from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator
from litestar.testing import TestClient

from gateway.app import create_app
from gateway.config import Settings

ROUTES = {
    ("/v1/chat/completions", "post"): {"200", "400", "401", "408", "413", "429", "431", "503"},
    ("/v1/messages", "post"): {"200", "400", "401", "413", "429", "502", "503"},
    ("/v1/messages/count_tokens", "post"): {"200", "400", "401", "429"},
    ("/v1/context/compact", "post"): {"200", "400", "401", "413", "429"},
    ("/v1/context/objects/{ref}", "get"): {"200", "400", "401", "404", "416", "503"},
    ("/v1/models", "get"): {"200", "401", "429", "502"},
    ("/healthz", "get"): {"200"},
    ("/readyz", "get"): {"200", "503"},
    ("/metrics", "get"): {"200"},
}


def _served() -> dict[str, Any]:
    with TestClient(create_app(Settings(summaries=False))) as client:
        response = client.get("/schema/openapi.json")
    assert response.status_code == 200
    document: dict[str, Any] = response.json()
    return document


def _refs(value: Any) -> list[str]:
    if isinstance(value, dict):
        own = [value["$ref"]] if isinstance(value.get("$ref"), str) else []
        return own + [ref for item in value.values() for ref in _refs(item)]
    if isinstance(value, list):
        return [ref for item in value for ref in _refs(item)]
    return []


def test_document_is_well_formed() -> None:
    """An OpenAPI 3.1 document whose schemas are valid JSON Schemas and whose references
    all resolve."""
    document = _served()
    assert document["openapi"].startswith("3.1")
    for schema in document["components"]["schemas"].values():
        Draft202012Validator.check_schema(schema)
    for ref in _refs(document):
        node: Any = document
        for part in ref.removeprefix("#/").split("/"):
            node = node[part]
    for path in document["paths"].values():
        for operation in path.values():
            assert all("description" in answer for answer in operation["responses"].values())


def test_every_route_with_its_statuses() -> None:
    """Each route is documented with its key statuses, POST routes with a JSON body."""
    document = _served()
    for (path, method), statuses in ROUTES.items():
        operation = document["paths"][path][method]
        assert statuses <= operation["responses"].keys(), (path, statuses)
        if method == "post":
            assert "$ref" in operation["requestBody"]["content"]["application/json"]["schema"]


def test_headers_and_envelopes() -> None:
    """The policy and conversation headers, both key schemes, ``Retry-After`` on 429, event
    streams, and Anthropic's envelope on ``/v1/messages`` only."""
    document = _served()
    chat = document["paths"]["/v1/chat/completions"]["post"]
    messages = document["paths"]["/v1/messages"]["post"]
    names = {
        document["components"]["parameters"][r["$ref"].rsplit("/", 1)[1]]["name"]
        for r in chat["parameters"]
    }
    assert names == {"x-contextgate-policy", "x-contextgate-conversation"}
    assert document["components"]["securitySchemes"].keys() == {"bearer", "apiKey"}
    assert "retry-after" in chat["responses"]["429"]["headers"]
    assert "text/event-stream" in chat["responses"]["200"]["content"]
    error = chat["responses"]["400"]["content"]["application/json"]["schema"]["$ref"]
    assert error.endswith("/OpenAIError")
    error = messages["responses"]["400"]["content"]["application/json"]["schema"]["$ref"]
    assert error.endswith("/AnthropicError")
    assert document["paths"]["/healthz"]["get"]["security"] == []


def test_the_relay_is_described_not_listed() -> None:
    """The document says that other `/v1/` routes are relayed, and lists none of them
    (they are the upstream's API)."""
    document = _served()
    assert "relayed to the upstream" in document["info"]["description"]
    assert not [path for path in document["paths"] if "{path" in path]
