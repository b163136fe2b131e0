"""What every answer of the gateway to a fuzzed request must look like."""

from __future__ import annotations

from typing import Any

import httpx
import orjson

POST_ROUTES = (
    "/v1/chat/completions",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/context/compact",
)
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
}
CLIENT_ERRORS = frozenset({400, 404, 405, 413, 415, 431})
"""The statuses a malformed request may get in front of a healthy upstream (API.md)."""


def check_answer(route: str, response: httpx.Response) -> None:
    """No server error (the upstream is up, so no 502/504 either); a success is JSON or
    an event stream; an error is a documented client error in the route's envelope."""
    status = response.status_code
    assert status < 500, (status, response.content[:500])
    if status < 300:
        kind = response.headers.get("content-type", "")
        if kind.startswith("text/event-stream"):
            assert b"error" not in response.content.split(b"\n", 1)[0], response.content[:500]
        else:
            assert isinstance(orjson.loads(response.content), dict)
        return
    assert status in CLIENT_ERRORS, (status, response.content[:500])
    body: Any = orjson.loads(response.content)
    assert response.headers["x-contextgate-request-id"]
    if route.startswith("/v1/messages"):
        assert body.keys() == {"type", "error"}, body
        assert body["type"] == "error"
        error = body["error"]
        assert error["type"] == ANTHROPIC_TYPES.get(status, "invalid_request_error"), body
    else:
        assert body.keys() == {"error"}, body
        error = body["error"]
        assert {"message", "type", "param", "code"} <= error.keys(), body
        assert error["type"] == "invalid_request_error", body
        assert isinstance(error["code"], str), body
        assert error["code"], body
        assert error["param"] is None or isinstance(error["param"], str), body
    assert isinstance(error["message"], str), body
    assert error["message"], body


VALID = {
    "/v1/chat/completions": {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
    "/v1/messages": {
        "model": "claude-sonnet-4-5",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "hi"}],
    },
    "/v1/messages/count_tokens": {
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": "hi"}],
    },
    "/v1/context/compact": {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
}


def assert_alive(client: httpx.Client) -> None:
    """``/healthz`` answers 200 and a valid request on every POST route succeeds."""
    assert client.get("/healthz").status_code == 200
    for route, body in VALID.items():
        response = client.post(route, json=body)
        assert response.status_code == 200, (route, response.status_code, response.text[:300])
