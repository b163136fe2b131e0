"""The gateway's OpenAPI document, served at ``/schema/openapi.json``.

Litestar lists the routes, but the handlers read their bodies themselves
(``gateway.routes.calls.body_of``), so it knows neither what they accept nor what they
answer. ``complete`` adds that to the generated document, in one place: request bodies
(``gateway.routes.openapi_bodies``), the headers the gateway reads, the security schemes, and
each route's answers with the error envelope it uses (OpenAI's, or Anthropic's on
``/v1/messages*``). ``DocumentJson`` serves the completed document.
"""

from __future__ import annotations

import copy
from typing import Any, Final

from litestar import Request
from litestar.openapi.plugins import JsonRenderPlugin

from gateway.context.compaction import CONVERSATION_HEADER
from gateway.http.headers import POLICY_HEADER
from gateway.routes.openapi_bodies import SCHEMAS

__all__ = ["DocumentJson", "complete"]

_JSON: Final = "application/json"
_STRING: Final = {"type": "string"}


def _ref(kind: str, name: str) -> dict[str, str]:
    return {"$ref": f"#/components/{kind}/{name}"}


_PAGED: Final = {
    "total": {"type": "integer", "minimum": 0},
    "offset": {"type": "integer", "minimum": 0},
    "limit": {"type": "integer", "minimum": 1, "maximum": 100},
    "has_more": {"type": "boolean"},
}


_ERROR_SCHEMAS: Final[dict[str, Any]] = {
    "OpenAIError": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type"],
                "properties": {
                    "message": _STRING,
                    "type": _STRING,
                    "param": {"type": ["string", "null"]},
                    "code": {"type": ["string", "null"]},
                },
            }
        },
        "description": "The OpenAI error envelope: the gateway's own errors, and upstream"
        " errors as the upstream wrote them.",
    },
    "AnthropicError": {
        "type": "object",
        "required": ["type", "error"],
        "properties": {
            "type": {"const": "error"},
            "error": {
                "type": "object",
                "required": ["type", "message"],
                "properties": {"type": _STRING, "message": _STRING},
            },
        },
        "description": "Anthropic's error envelope, used on `/v1/messages*`.",
    },
}

_ANSWER_SCHEMAS: Final[dict[str, Any]] = {
    "ChatCompletion": {
        "type": "object",
        "required": ["id", "object", "choices"],
        "properties": {"id": _STRING, "object": _STRING, "choices": {"type": "array"}},
    },
    "Response": {
        "type": "object",
        "required": ["id", "object", "output"],
        "properties": {"object": {"const": "response"}, "output": {"type": "array"}},
    },
    "Message": {
        "type": "object",
        "required": ["id", "type", "role", "content"],
        "properties": {
            "type": {"const": "message"},
            "role": {"const": "assistant"},
            "content": {"type": "array"},
        },
    },
    "TokenCount": {
        "type": "object",
        "required": ["input_tokens"],
        "properties": {"input_tokens": {"type": "integer", "minimum": 0}},
    },
    "DryRun": {
        "type": "object",
        "required": ["request", "report", "policy"],
        "properties": {"request": {"type": "object"}, "report": {"type": "object"}},
    },
    "ModelList": {
        "type": "object",
        "required": ["data"],
        "properties": {"data": {"type": "array", "items": {"type": "object"}}},
    },
    "ConversationList": {
        "type": "object",
        "required": ["object", "data", "total", "offset", "limit", "has_more"],
        "properties": {
            "object": {"const": "list"},
            "data": {"type": "array", "items": _ref("schemas", "ConversationRow")},
            **_PAGED,
        },
    },
    "ConversationRow": {
        "type": "object",
        "required": ["id", "requests"],
        "description": "A conversation's totals over the requests its ledger has seen"
        " (docs/API.md lists every field).",
        "properties": {
            "id": _STRING,
            "title": _STRING,
            "model": _STRING,
            "requests": {"type": "integer", "minimum": 1},
            "client_tokens": {"type": "integer"},
            "upstream_tokens": {"type": "integer"},
            "cost_with": {"type": "number"},
            "cost_without": {"type": "number"},
            "last_at": {"type": "number"},
        },
    },
    "Conversation": {
        "type": "object",
        "required": ["object", "id", "requests", "entries"],
        "properties": {
            "object": {"const": "conversation"},
            "id": _STRING,
            "requests": {"type": "integer", "minimum": 1},
            "entries": {
                "type": "object",
                "required": ["data", "total", "offset", "limit", "has_more"],
                "properties": {
                    "data": {"type": "array", "items": _ref("schemas", "LedgerEntry")},
                    **_PAGED,
                },
            },
        },
    },
    "LedgerEntry": {
        "type": "object",
        "required": ["id", "at", "api", "model", "tokens", "stages", "cache", "cost"],
        "description": "What the gateway did to one request (docs/API.md lists every field).",
        "properties": {
            "id": _STRING,
            "at": {"type": "number"},
            "api": {"enum": ["chat", "messages", "responses", "responses-ws"]},
            "model": _STRING,
            "tokens": {"type": "object"},
            "stages": {"type": "array", "items": {"type": "object"}},
            "refs": {"type": "array", "items": {"type": "object"}},
            "cache": {"type": "object"},
            "cost": {"type": "object"},
        },
    },
    "ConversationRequest": {
        "allOf": [
            _ref("schemas", "LedgerEntry"),
            {
                "type": "object",
                "required": ["object", "detail"],
                "properties": {
                    "object": {"const": "conversation.request"},
                    "detail": {
                        "type": ["object", "null"],
                        "description": "The messages the client sent beside those that"
                        " went up; null once no longer kept.",
                    },
                },
            },
        ]
    },
}

_SECURITY_SCHEMES: Final = {
    "bearer": {
        "type": "http",
        "scheme": "bearer",
        "description": "With tenants, the tenant's gateway key; without, the caller's"
        " upstream key, forwarded.",
    },
    "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
}
_KEYED: Final[list[dict[str, list[str]]]] = [{"bearer": []}, {"apiKey": []}, {}]
"""A key is needed only when tenants are configured."""

_POLICY_SUBSET: Final = (
    r"^mode=(summarize|truncate|off)(, ?keep-images=[0-9]{1,2})?(, ?cache-markers=[?][01])?$"
)
_PARAMETERS: Final = {
    "Policy": {
        "name": POLICY_HEADER,
        "in": "header",
        "required": False,
        "description": "RFC 8941 dictionary tuning the pipeline (every key: docs/POLICY.md;"
        " the pattern admits a subset that is always within the default bounds). A bad"
        " policy is a 400 `invalid_policy`.",
        "schema": {"type": "string", "pattern": _POLICY_SUBSET},
        "example": "mode=truncate, keep-images=1",
    },
    "Conversation": {
        "name": CONVERSATION_HEADER,
        "in": "header",
        "required": False,
        "description": "Names the conversation; without it, a hash of its start does.",
        "schema": {"type": "string", "pattern": r"^[A-Za-z0-9._:@/+=-]{1,200}$"},
        "example": "ticket-4711",
    },
}

_HEADERS: Final = {
    "RequestId": {"description": "The gateway's id for the request.", "schema": _STRING},
    "RetryAfter": {
        "description": "Seconds to wait before trying again.",
        "schema": {"type": "integer", "minimum": 0},
    },
    "Tokens": {"description": "RFC 8941 `before=N, after=M`.", "schema": _STRING},
    "Actions": {"description": "RFC 8941 list of the stages that acted.", "schema": _STRING},
}

_STATUSES: Final = {
    400: "Invalid request: bad JSON, a field of the wrong type or value, a bad header.",
    401: "Tenants are configured and the key is missing or unknown.",
    403: "The tenant may not use the model.",
    404: "No such object in the caller's namespace.",
    408: "The body did not arrive in time.",
    413: "The body is over `max_body_bytes`.",
    416: "The requested lines are not in the object.",
    429: "Over the caller's rate or concurrency limit; see `Retry-After`.",
    431: "The request's headers are too large.",
    500: "A gateway bug.",
    502: "The upstream could not be reached or gave an unusable answer.",
    503: "Shutting down (`Retry-After`), or the offload store does not answer.",
    504: "The upstream did not answer in time.",
}
_RETRIED: Final = frozenset({429, 503})

_PIPELINE: Final = (400, 401, 403, 408, 413, 429, 431, 500, 503)
"""What a route that reads a body and runs the pipeline may answer with, upstream aside."""
_UPSTREAM: Final = (502, 504)


def _errors(statuses: tuple[int, ...], envelope: str) -> dict[str, Any]:
    responses: dict[str, Any] = {}
    for status in statuses:
        headers = {"x-contextgate-request-id": _ref("headers", "RequestId")}
        if status in _RETRIED:
            headers["retry-after"] = _ref("headers", "RetryAfter")
        responses[str(status)] = {
            "description": _STATUSES[status],
            "headers": headers,
            "content": {_JSON: {"schema": _ref("schemas", envelope)}},
        }
    return responses


def _success(
    description: str, content: dict[str, Any], *, reported: bool = False
) -> dict[str, Any]:
    headers = {"x-contextgate-request-id": _ref("headers", "RequestId")}
    if reported:
        headers |= {
            "x-contextgate-tokens": _ref("headers", "Tokens"),
            "x-contextgate-actions": _ref("headers", "Actions"),
        }
    return {"description": description, "headers": headers, "content": content}


def _json(name: str) -> dict[str, Any]:
    return {_JSON: {"schema": _ref("schemas", name)}}


_STREAM: Final = {
    "text/event-stream": {
        "schema": {
            "type": "object",
            "required": ["data"],
            "properties": {"event": _STRING, "data": _STRING},
            "description": "One event: a chunk (or Messages event) as JSON, or `[DONE]`.",
        }
    }
}
_RELAYED: Final = {
    "default": {
        "description": "An upstream error, relayed with the upstream's status and body.",
        "content": {_JSON: {"schema": {"type": "object"}}},
    }
}


def _body(name: str) -> dict[str, Any]:
    return {"required": True, "content": _json(name)}


_PIPELINE_HEADERS: Final = [_ref("parameters", "Policy"), _ref("parameters", "Conversation")]

_PAGING: Final = [
    {
        "name": "limit",
        "in": "query",
        "required": False,
        "description": "How many to return (default 20).",
        "schema": {"type": "integer", "minimum": 1, "maximum": 100},
    },
    {
        "name": "offset",
        "in": "query",
        "required": False,
        "description": "How many to skip, newest first.",
        "schema": {"type": "integer", "minimum": 0, "maximum": 1_000_000},
    },
]
_OPERATIONS: Final[dict[tuple[str, str], dict[str, Any]]] = {
    ("/v1/chat/completions", "post"): {
        "requestBody": _body("ChatRequest"),
        "parameters": _PIPELINE_HEADERS,
        "responses": {
            "200": _success(
                "The completion, or its chunks when `stream` is true.",
                _json("ChatCompletion") | _STREAM,
                reported=True,
            ),
            **_errors(_PIPELINE + _UPSTREAM, "OpenAIError"),
            **_RELAYED,
        },
    },
    ("/v1/responses", "post"): {
        "requestBody": _body("ResponsesRequest"),
        "parameters": _PIPELINE_HEADERS,
        "responses": {
            "200": _success(
                "The response, or its events when `stream` is true.",
                _json("Response") | _STREAM,
                reported=True,
            ),
            **_errors(_PIPELINE + _UPSTREAM, "OpenAIError"),
            **_RELAYED,
        },
    },
    ("/v1/messages", "post"): {
        "requestBody": _body("MessagesRequest"),
        "parameters": _PIPELINE_HEADERS,
        "responses": {
            "200": _success(
                "The message, or its events when `stream` is true.",
                _json("Message") | _STREAM,
                reported=True,
            ),
            **_errors(_PIPELINE + _UPSTREAM, "AnthropicError"),
            **_RELAYED,
        },
    },
    ("/v1/messages/count_tokens", "post"): {
        "requestBody": _body("CountTokensRequest"),
        "parameters": _PIPELINE_HEADERS,
        "responses": {
            "200": _success(
                "The input tokens of the request as it would be sent.",
                _json("TokenCount"),
                reported=True,
            ),
            **_errors(_PIPELINE + _UPSTREAM, "AnthropicError"),
            **_RELAYED,
        },
    },
    ("/v1/context/compact", "post"): {
        "requestBody": _body("ChatRequest"),
        "parameters": _PIPELINE_HEADERS,
        "responses": {
            "200": _success(
                "What would be sent, what each stage did, and the policy.",
                _json("DryRun"),
                reported=True,
            ),
            **_errors(_PIPELINE, "OpenAIError"),
        },
    },
    ("/v1/context/objects/{ref}", "get"): {
        "parameters": [
            {
                "name": name,
                "in": "query",
                "required": False,
                "description": f"{which} line to return (1-based, inclusive).",
                "schema": {"type": "integer", "minimum": 1, "maximum": 999_999_999},
            }
            for name, which in (("start_line", "The first"), ("end_line", "The last"))
        ],
        "responses": {
            "200": {
                "description": "The object's bytes, or the lines asked for.",
                "headers": {
                    name: {"schema": {"type": "integer", "minimum": 0}}
                    for name in ("x-contextgate-object-bytes", "x-contextgate-object-lines")
                },
                "content": {
                    "text/plain": {"schema": _STRING},
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                },
            },
            **_errors((400, 401, 404, 416, 429, 431, 500, 503), "OpenAIError"),
        },
    },
    ("/v1/context/conversations", "get"): {
        "parameters": _PAGING,
        "responses": {
            "200": _success(
                "The caller's conversations, the most recently active first.",
                _json("ConversationList"),
            ),
            **_errors((400, 401, 404, 429, 431, 500, 503), "OpenAIError"),
        },
    },
    ("/v1/context/conversations/{conversation_id}", "get"): {
        "parameters": _PAGING,
        "responses": {
            "200": _success(
                "The conversation's totals and its requests, newest first.",
                _json("Conversation"),
            ),
            **_errors((400, 401, 404, 429, 431, 500, 503), "OpenAIError"),
        },
    },
    ("/v1/context/conversations/{conversation_id}/requests/{request_id}", "get"): {
        "responses": {
            "200": _success(
                "One request's entry, with its detail while it is kept.",
                _json("ConversationRequest"),
            ),
            **_errors((401, 404, 429, 431, 500, 503), "OpenAIError"),
        },
    },
    ("/v1/models", "get"): {
        "responses": {
            "200": _success("The models the caller may use.", _json("ModelList")),
            **_errors((401, 429, 431, 500, 502, 503, 504), "OpenAIError"),
            **_RELAYED,
        },
    },
    ("/healthz", "get"): {
        "security": [],
        "responses": {
            "200": {
                "description": "The process is up.",
                "content": {_JSON: {"schema": {"const": {"status": "ok"}}}},
            }
        },
    },
    ("/readyz", "get"): {
        "security": [],
        "responses": {
            "200": {
                "description": "Serving (`degraded`: Redis does not answer).",
                "content": {
                    _JSON: {
                        "schema": {
                            "type": "object",
                            "required": ["status", "store", "store_failures", "warm"],
                            "properties": {
                                "status": {"enum": ["ready", "degraded"]},
                                "store": {"enum": ["memory", "redis", "redis-unreachable"]},
                                "store_failures": {"type": "integer", "minimum": 0},
                                "warm": {"type": "boolean"},
                            },
                        }
                    }
                },
            },
            "503": {
                "description": "Shutting down: send requests elsewhere.",
                "content": {_JSON: {"schema": {"const": {"status": "draining"}}}},
            },
        },
    },
    ("/metrics", "get"): {
        "security": [],
        "responses": {
            "200": {
                "description": "Prometheus metrics, text format.",
                "content": {"text/plain": {"schema": _STRING}},
            }
        },
    },
}
"""What each operation gets on top of what Litestar generates (its responses replaced)."""


_RELAY: Final = (
    "Every other route under `/v1/` (embeddings, files, audio, images, moderations,"
    " batches, uploads, vector stores, fine-tuning, stored chat completions: `GET"
    " /v1/chat/completions` and `/v1/chat/completions/{id}...`, `/v1/models/{id}`, the"
    " Responses API's `/v1/responses/...`, ...) is relayed to the upstream as it came:"
    " same method, path and query string byte for byte, body and answer streamed, the"
    " upstream's status, headers and body relayed; with the gateway's key handling"
    " (`Authorization`), limits (401, 403, 413, 429) and `x-contextgate-request-id`. Those"
    " routes are the upstream's API and are not listed here. Any other path is a 404. See"
    " docs/API.md (Relayed routes)."
)
"""The relay, described once: its routes are the upstream's, documented by it."""


def complete(document: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``document``, Litestar's, with the parts only the gateway knows."""
    document = copy.deepcopy(document)
    document.setdefault("info", {})["description"] = _RELAY
    components = document.setdefault("components", {})
    components.setdefault("schemas", {}).update(SCHEMAS | _ERROR_SCHEMAS | _ANSWER_SCHEMAS)
    components["securitySchemes"] = _SECURITY_SCHEMES
    components["parameters"] = _PARAMETERS
    components["headers"] = _HEADERS
    document["security"] = _KEYED
    for (path, method), extra in _OPERATIONS.items():
        operation = document["paths"][path][method]
        parameters = operation.get("parameters", []) + extra.get("parameters", [])
        operation.update(copy.deepcopy(extra))
        if parameters:
            operation["parameters"] = parameters
    return document


class DocumentJson(JsonRenderPlugin):
    """Serves the completed document as ``openapi.json``."""

    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        return self.render_json(request, complete(openapi_schema))
