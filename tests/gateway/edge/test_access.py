"""The access log: one JSON line per request, for the operator, with what happened to it
and never what was in it (prompts, headers, keys), unless prompts are asked for."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from litestar.types import ASGIApp, Receive, Scope, Send
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from gateway.app import create_app
from gateway.telemetry.logs import JsonFormatter
from tests.conftest import settings_for
from tests.harness import GatewayServer, ServeProcess
from tests.mock_upstream import (
    JSONReply,
    MockUpstream,
    OpenAIRoutes,
    SSEReply,
    chat_completion,
    events_of,
)

CANARY = "sk-canary-0f1e2d3c4b5a69788796a5b4"
PROMPT = "Summarise the quarterly figures for the Zanzibar office."
MESSAGES: Any = [{"role": "user", "content": PROMPT}]


class Lines(logging.Handler):
    """The formatted lines of every record that reaches it."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(JsonFormatter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))

    def access(self, count: int) -> list[dict[str, Any]]:
        """The first ``count`` access lines, parsed, once they are written (a request's
        line follows the last byte of its answer)."""
        deadline = time.monotonic() + 5
        while True:
            found = [json.loads(line) for line in self.lines if '"contextgate.access"' in line]
            if len(found) >= count or time.monotonic() > deadline:
                return found


@pytest.fixture
def logged() -> Iterator[Lines]:
    """Every line the gateway's loggers (``contextgate.*``) write at INFO and up."""
    handler = Lines()
    logger = logging.getLogger("contextgate")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


@pytest.fixture
def gateway(upstream: MockUpstream) -> Iterator[GatewayServer]:
    with GatewayServer(settings_for(upstream)) as server:
        yield server


@pytest.fixture
def client(gateway: GatewayServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.base_url, api_key=CANARY, max_retries=0) as sdk:
        yield sdk


def test_one_line_per_request_with_what_happened_to_it(
    gateway: GatewayServer, client: openai.OpenAI, upstream: MockUpstream, logged: Lines
) -> None:
    """An answer, a stream, a relayed upstream error and a malformed body give one line
    each, with the request id the client got, the route, status, time, tenant, model,
    tokens and error; probes and scrapes give none at INFO; the prompt is in none."""
    usage = {"prompt_tokens": 40, "completion_tokens": 9, "total_tokens": 49}
    chunk = {"object": "chat.completion.chunk", "id": "c", "created": 1, "model": "gpt-4o"}
    upstream.push(
        JSONReply({**chat_completion(), "usage": usage}),
        SSEReply(events_of([{**chunk, "choices": [{"index": 0, "delta": {"content": "Hi"}}]}])),
        JSONReply({"error": {"message": "No.", "type": "server_error", "code": None}}, 503),
    )
    answered = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=MESSAGES)
    with client.chat.completions.with_streaming_response.create(
        model="gpt-4o", messages=MESSAGES, stream=True
    ) as streamed:
        streamed.read()
    with pytest.raises(openai.InternalServerError) as failed:
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    malformed = httpx.post(f"{gateway.base_url}/chat/completions", content=b"{oops")
    httpx.get(f"{gateway.url}/healthz")
    httpx.get(f"{gateway.url}/metrics")

    lines = logged.access(4)
    assert len(lines) == 4
    ids = [
        response.headers["x-contextgate-request-id"]
        for response in (answered, streamed, failed.value.response, malformed)
    ]
    assert [line["request_id"] for line in lines] == ids
    ok, stream, error, bad = lines
    assert {k: ok[k] for k in ("level", "method", "path", "route", "status", "tenant")} == {
        "level": "info",
        "method": "POST",
        "path": "/v1/chat/completions",
        "route": "/v1/chat/completions",
        "status": 200,
        "tenant": "passthrough",
    }
    assert (ok["model"], ok["stream"], ok["attempts"]) == ("gpt-4o", False, 1)
    assert ok["tokens_before"] == ok["tokens_after"] > 0
    assert ok["upstream_tokens"] == {"input": 40, "output": 9, "cache_read": 0, "cache_write": 0}
    assert 0 < ok["duration_ms"] < 5_000
    assert (stream["status"], stream["stream"]) == (200, True)
    assert (error["status"], error["error_type"]) == (503, "server_error")
    assert "upstream_tokens" not in error
    assert (bad["status"], bad["error_type"], bad["error_code"]) == (
        400,
        "invalid_request_error",
        "invalid_json",
    )
    assert "model" not in bad
    assert not [line for line in logged.lines if PROMPT in line or "Zanzibar" in line]
    assert "trace_id" not in ok  # no tracing configured: no current span


def test_a_relayed_request_that_asks_for_a_stream_is_logged_as_one(
    client: openai.OpenAI, upstream: MockUpstream, logged: Lines
) -> None:
    """A streamed Responses API request, relayed untouched, has ``"stream": true`` in
    its line; a relayed request that does not ask for one has ``false``."""
    upstream.handler = OpenAIRoutes()
    events = list(client.responses.create(model="gpt-4o", input="Hi", stream=True))
    assert events[-1].type == "response.completed"
    client.embeddings.create(model="text-embedding-3-small", input="Hi")

    streamed, embedded = logged.access(2)
    assert (streamed["route"], streamed["status"], streamed["model"]) == (
        "/v1/responses",
        200,
        "gpt-4o",
    )
    assert streamed["stream"] is True
    assert (embedded["route"], embedded["stream"]) == ("/v1/embeddings", False)


def test_prompts_are_logged_only_when_asked_for(upstream: MockUpstream, logged: Lines) -> None:
    """``log_prompts: true`` puts the request's messages in its line, for debugging."""
    upstream.push(JSONReply(chat_completion()))
    with (
        GatewayServer(settings_for(upstream, log_prompts=True)) as server,
        openai.OpenAI(base_url=server.base_url, api_key=CANARY, max_retries=0) as sdk,
    ):
        sdk.chat.completions.create(model="gpt-4o", messages=MESSAGES)
        (line,) = logged.access(1)
    assert line["messages"] == MESSAGES
    assert CANARY not in json.dumps(line)


def test_a_key_never_reaches_the_log_not_even_from_errors(
    gateway: GatewayServer,
    client: openai.OpenAI,
    upstream: MockUpstream,
    logged: Lines,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The caller's key is in no line: not when the upstream's error repeats it, not
    when a stream breaks, not in the traceback of an unhandled error, which comes out
    as one JSON line with the request's id."""
    echoed = {"error": {"message": f"Incorrect API key provided: {CANARY}", "type": "auth"}}
    chunk = {"object": "chat.completion.chunk", "id": "c", "created": 1, "model": "gpt-4o"}
    first = events_of([{**chunk, "choices": [{"index": 0, "delta": {"content": "Hi"}}]}], False)
    upstream.push(JSONReply(echoed, status=401), SSEReply(first, ending="drop"))
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    with (
        pytest.raises(openai.APIError),
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES, stream=True) as stream,
    ):
        list(stream)

    async def explode(*args: object, **kwargs: object) -> None:
        raise RuntimeError(f"the store said: Authorization: Bearer {CANARY} ({CANARY})")

    monkeypatch.setattr("gateway.context.compaction._compact", explode)
    crashed = httpx.post(
        f"{gateway.base_url}/chat/completions",
        json={"model": "gpt-4o", "messages": MESSAGES},
        headers={"authorization": f"Bearer {CANARY}"},
    )
    assert crashed.status_code == 500

    assert len(logged.access(3)) == 3
    assert logged.lines
    assert not [line for line in logged.lines if CANARY in line or "0f1e2d3c4b5a6978" in line]
    (unhandled,) = [json.loads(line) for line in logged.lines if '"level":"error"' in line]
    assert unhandled["request_id"] == crashed.headers["x-contextgate-request-id"]
    assert unhandled["error_type"] == "RuntimeError"
    assert "Bearer [redacted]" in unhandled["exception"]
    assert [json.loads(line)["message"] for line in logged.lines if "stream failed" in line]


@pytest.mark.parametrize("where", ["outside", "inside"])
async def test_trace_and_span_ids_come_from_the_server_span(
    upstream: MockUpstream, logged: Lines, where: str
) -> None:
    """A server span opened by a tracing middleware gives the line its trace and span
    ids, whether that middleware runs around the access log or inside it."""
    app = create_app(settings_for(upstream))
    context = SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C,
        span_id=0xB7AD6B7169203331,
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )

    def traced(inner: ASGIApp) -> ASGIApp:
        async def run(scope: Scope, receive: Receive, send: Send) -> None:
            with trace.use_span(NonRecordingSpan(context)):
                await inner(scope, receive, send)

        return run

    outer: ASGIApp = app
    if where == "outside":
        outer = traced(app)
    else:
        app.asgi_handler.app = traced(app.asgi_handler.app)  # type: ignore[attr-defined]
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=outer), base_url="http://gateway"
        ) as client:
            response = await client.get("/v1/models")
    finally:
        await app.state.gateway.aclose()
    (line,) = logged.access(1)
    assert line["request_id"] == response.headers["x-contextgate-request-id"]
    assert (line["trace_id"], line["span_id"]) == (
        "0af7651916cd43dd8448eb211c80319c",
        "b7ad6b7169203331",
    )


@pytest.mark.parametrize("level", ["info", "warning"])
def test_serve_writes_only_json_lines_and_no_key(
    upstream: MockUpstream, tmp_path: Path, level: str
) -> None:
    """``contextgate serve`` writes every log line as JSON on stderr, its own access
    line per request at ``info`` (uvicorn's is off) and none at ``warning``; the key of
    a request whose upstream error repeats it is in no line."""
    echoed = {"error": {"message": f"Incorrect API key provided: {CANARY}", "type": "auth"}}
    upstream.push(JSONReply(chat_completion()), JSONReply(echoed, status=401))
    config = f"upstream:\n  base_url: {upstream.base_url}\nsummaries: false\n"
    with ServeProcess(config, str(tmp_path), "--log-level", level) as server:
        with openai.OpenAI(base_url=server.base_url, api_key=CANARY, max_retries=0) as sdk:
            answered = sdk.chat.completions.with_raw_response.create(
                model="gpt-4o", messages=MESSAGES
            )
            with pytest.raises(openai.AuthenticationError):
                sdk.chat.completions.create(model="gpt-4o", messages=MESSAGES)
        server.stop()
        log = server.log()
    lines = [json.loads(line) for line in log.splitlines()]
    access = [line for line in lines if line["logger"] == "contextgate.access"]
    assert CANARY not in log
    assert PROMPT not in log
    assert "HTTP/1.1" not in log  # uvicorn's own access line
    if level == "warning":
        assert access == []
        return
    assert [(line["status"], line["route"]) for line in access] == [
        (200, "/v1/chat/completions"),
        (401, "/v1/chat/completions"),
    ]
    assert access[0]["request_id"] == answered.headers["x-contextgate-request-id"]
    assert any(line["logger"] == "uvicorn.error" for line in lines)
