"""Tracing, end to end: ``contextgate serve`` with ``OTEL_EXPORTER_OTLP_ENDPOINT`` set
exports its spans over OTLP/HTTP to a receiver in the test, and those spans describe each
request (server, pipeline, stages, upstream, HTTP and Redis calls) in the caller's trace,
without its key or its prompt; without ``OTEL_*`` variables nothing is installed."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from opentelemetry import trace

from pipelines.stages import DEFAULT_STAGES
from tests.harness import GatewayServer, ServeProcess
from tests.mock_upstream import (
    JSONReply,
    MockUpstream,
    SSEReply,
    chat_completion,
    events_of,
    responses_stream,
)
from tests.otlp_receiver import OTLPReceiver, ReceivedSpan

KEY = "sk-canary-7f3b9d2e41c8a6"
"""The caller's API key: unique, so that finding it anywhere in a span is a leak."""
SECRET_TEXT = "PASSPORT-NUMBER-Z93K11"
"""Text of a prompt's tool output, offloaded to Redis: never in a span either."""
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN}-01"
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def receiver() -> Iterator[OTLPReceiver]:
    with OTLPReceiver() as server:
        yield server


@pytest.fixture(scope="module")
def served(
    mock_upstream: MockUpstream, redis_url: str, receiver: OTLPReceiver, tmp_path_factory: Any
) -> Iterator[ServeProcess]:
    """One traced gateway process for the module, in front of the mock (OpenAI and
    Anthropic alike), with Redis."""
    config = (
        f"upstream:\n  base_url: {mock_upstream.base_url}\n"
        f"anthropic:\n  base_url: {mock_upstream.base_url.removesuffix('/v1')}\n"
        f"redis_url: {redis_url}\nsummaries: false\n"
    )
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "20"}
    with ServeProcess(config, str(tmp_path_factory.mktemp("tracing")), env=env) as process:
        yield process


@pytest.fixture
def client(served: ServeProcess, upstream: MockUpstream) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=served.base_url, api_key=KEY, max_retries=0) as sdk:
        yield sdk


def request_spans(receiver: OTLPReceiver, request_id: str) -> list[ReceivedSpan]:
    """Every span of the request ``request_id`` names, once its server span (the last to
    end) has arrived."""

    def server(spans: list[ReceivedSpan]) -> ReceivedSpan | None:
        return next(
            (s for s in spans if s.attributes.get("contextgate.request_id") == request_id), None
        )

    spans = receiver.wait_for(lambda spans: server(spans) is not None)
    root = server(spans)
    assert root is not None, f"no server span for {request_id}"
    mine = {root.span_id}
    changed = True
    while changed:
        found = {s.span_id for s in spans if s.parent_id in mine} - mine
        changed = bool(found)
        mine |= found
    return [s for s in spans if s.span_id in mine]


def one(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def test_a_request_continues_the_callers_trace(
    client: openai.OpenAI, upstream: MockUpstream, receiver: OTLPReceiver
) -> None:
    """The server span is the caller's span's child, in the caller's trace, and the
    upstream gets one traceparent of that trace, whose parent is the gateway's HTTP call."""
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "Hello"}],
        extra_headers={"traceparent": TRACEPARENT},
    )
    spans = request_spans(receiver, raw.headers["x-contextgate-request-id"])
    server = one(spans, "POST /v1/chat/completions")
    assert (server.kind, server.trace_id, server.parent_id) == ("SERVER", TRACE_ID, CALLER_SPAN)
    assert server.attributes["http.request.method"] == "POST"
    assert server.attributes["http.route"] == "/v1/chat/completions"
    assert server.attributes["http.response.status_code"] == 200
    assert server.service == "contextgate"
    assert {s.trace_id for s in spans} == {TRACE_ID}
    sent = [value for name, value in upstream.received[-1].header_lines if name == "traceparent"]
    assert len(sent) == 1
    _, trace_id, parent, _ = sent[0].split("-")
    http_call = one(spans, "POST")
    assert (trace_id, parent) == (TRACE_ID, http_call.span_id)
    assert http_call.kind == "CLIENT"
    assert http_call.parent_id == one(spans, "chat gpt-4o").span_id


def test_the_stages_have_spans_under_the_pipelines(
    client: openai.OpenAI, receiver: OTLPReceiver
) -> None:
    """One span per stage, in order, under one pipeline span under the server span, with
    the tokens the response's header reports."""
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": "Hello"}]
    )
    spans = request_spans(receiver, raw.headers["x-contextgate-request-id"])
    server = one(spans, "POST /v1/chat/completions")
    pipeline = one(spans, "contextgate.pipeline")
    assert pipeline.parent_id == server.span_id
    stages = sorted((s for s in spans if s.parent_id == pipeline.span_id), key=lambda s: s.start)
    assert [s.name for s in stages] == [f"contextgate.stage.{s.name}" for s in DEFAULT_STAGES]
    before = raw.headers["x-contextgate-tokens"].split(",")[0].removeprefix("before=")
    assert pipeline.attributes["contextgate.tokens.before"] == int(before)
    assert stages[0].attributes["contextgate.tokens.before"] == int(before)
    assert pipeline.attributes["contextgate.model"] == "gpt-4o"
    assert all(s.attributes["contextgate.stage.changed"] is False for s in stages)


def test_an_offloaded_tool_output_is_counted_on_its_stage(
    client: openai.OpenAI, receiver: OTLPReceiver
) -> None:
    """The filter stage's span says it changed the request and offloaded one ref, and the
    Redis write it made has a span of its own, which names the command, not the data. This
    first offload brings the restore tool in, so the pipeline ran again with it, under a
    span saying so, and named the same ref (already stored)."""
    messages: list[Any] = [
        {"role": "user", "content": "Look the passenger up."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": f"{SECRET_TEXT} row " * 300},
    ]
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o",
        messages=messages,
        extra_headers={"x-contextgate-policy": "filter-tokens=100"},
    )
    assert "filter" in raw.headers["x-contextgate-actions"]
    spans = request_spans(receiver, raw.headers["x-contextgate-request-id"])
    first, again = (s for s in spans if s.name == "contextgate.stage.filter")
    rerun = one(spans, "contextgate.restore_tool")
    assert [s.parent_id for s in spans if s.name == "contextgate.pipeline"][1] == rerun.span_id
    writes = [s for s in spans if s.attributes.get("db.system") == "redis"]
    for stage in (first, again):
        assert stage.attributes["contextgate.stage.changed"] is True
        assert stage.attributes["contextgate.stage.refs"] == 1
    assert any(s.parent_id == first.span_id for s in writes)
    for write in writes:
        for command in str(write.attributes["db.statement"]).splitlines():
            assert set(command.split()[1:]) <= {"?"}, command


def test_the_upstream_span_has_the_usage_the_provider_reported(
    client: openai.OpenAI, upstream: MockUpstream, receiver: OTLPReceiver
) -> None:
    """``chat gpt-4o`` carries the GenAI attributes of the answer: the model that
    answered, its input, output and cached tokens, and why it stopped."""
    answer = chat_completion("Done.", model="gpt-4o-2024-08-06")
    answer["usage"] = {
        "prompt_tokens": 1_234,
        "completion_tokens": 56,
        "total_tokens": 1_290,
        "prompt_tokens_details": {"cached_tokens": 1_024},
    }
    upstream.push(JSONReply(answer))
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": "Hello"}]
    )
    spans = request_spans(receiver, raw.headers["x-contextgate-request-id"])
    call = one(spans, "chat gpt-4o")
    assert call.kind == "CLIENT"
    assert call.parent_id == one(spans, "POST /v1/chat/completions").span_id
    assert call.attributes == call.attributes | {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.system": "openai",
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.response.model": "gpt-4o-2024-08-06",
        "gen_ai.response.finish_reasons": ["stop"],
        "gen_ai.usage.input_tokens": 1_234,
        "gen_ai.usage.output_tokens": 56,
        "gen_ai.usage.cache_read.input_tokens": 1_024,
        "http.response.status_code": 200,
    }
    assert not call.error


def test_a_streamed_answer_is_traced_to_its_end(
    client: openai.OpenAI, upstream: MockUpstream, receiver: OTLPReceiver
) -> None:
    """A stream's upstream span ends with the stream and has its usage; the server span
    lasts until the last event was sent."""
    chunk = {
        "id": "chatcmpl-s",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-4o-2024-08-06",
        "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}],
    }
    last = {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    usage = {
        **chunk,
        "choices": [],
        "usage": {"prompt_tokens": 40, "completion_tokens": 6, "total_tokens": 46},
    }
    upstream.push(SSEReply(events_of([chunk, chunk, chunk, last, usage]), interval=0.1))
    with client.chat.completions.with_streaming_response.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "Hello"}],
        stream=True,
        stream_options={"include_usage": True},
    ) as raw:
        request_id = raw.headers["x-contextgate-request-id"]
        assert "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices) == (
            "HiHiHi"
        )
    spans = request_spans(receiver, request_id)
    server, call = one(spans, "POST /v1/chat/completions"), one(spans, "chat gpt-4o")
    assert call.attributes["gen_ai.usage.input_tokens"] == 40
    assert call.attributes["gen_ai.usage.output_tokens"] == 6
    assert call.attributes["gen_ai.response.finish_reasons"] == ["stop"]
    assert call.end - call.start >= 400_000_000
    assert server.start <= call.start
    assert call.end <= server.end


def test_a_responses_stream_is_traced_to_its_end_with_its_usage(
    client: openai.OpenAI, upstream: MockUpstream, receiver: OTLPReceiver
) -> None:
    """A Responses request has a server span and an upstream span (GenAI ``chat``) over the
    HTTP call, ending with the stream, with the usage of its ``response.completed``."""
    upstream.push(SSEReply(responses_stream("gpt-4o"), interval=0.05))
    with client.responses.with_streaming_response.create(
        model="gpt-4o", input="Hello", stream=True
    ) as raw:
        request_id = raw.headers["x-contextgate-request-id"]
        assert [e.type for e in raw.parse()][-1] == "response.completed"
    spans = request_spans(receiver, request_id)
    server, call = one(spans, "POST /v1/responses"), one(spans, "chat gpt-4o")
    assert server.attributes["http.route"] == "/v1/responses"
    assert call.kind == "CLIENT"
    assert call.parent_id == server.span_id
    assert call.attributes["gen_ai.operation.name"] == "chat"
    assert call.attributes["gen_ai.request.model"] == "gpt-4o"
    assert call.attributes["http.response.status_code"] == 200
    assert one(spans, "POST").parent_id == call.span_id
    assert call.end - call.start >= 500_000_000
    assert call.end <= server.end
    assert call.attributes["gen_ai.response.id"] == "resp_mock"
    assert call.attributes["gen_ai.usage.input_tokens"] == 12
    assert call.attributes["gen_ai.usage.output_tokens"] == 3
    assert call.attributes["gen_ai.usage.cache_read.input_tokens"] == 0


def test_claude_on_the_messages_api_reports_its_cache_tokens(
    served: ServeProcess, upstream: MockUpstream, receiver: OTLPReceiver
) -> None:
    """A Messages request for Claude has an Anthropic upstream span with the cache reads
    and writes the provider reported, counted in its input tokens."""
    upstream.push(
        JSONReply(
            {
                "id": "msg_01",
                "type": "message",
                "role": "assistant",
                "model": "claude-sonnet-4-20250514",
                "content": [{"type": "text", "text": "Sunny."}],
                "stop_reason": "end_turn",
                "usage": {
                    "input_tokens": 10,
                    "output_tokens": 7,
                    "cache_read_input_tokens": 2_000,
                    "cache_creation_input_tokens": 300,
                },
            }
        )
    )
    with anthropic.Anthropic(
        base_url=served.base_url.removesuffix("/v1"), api_key=KEY, max_retries=0
    ) as sdk:
        raw = sdk.messages.with_raw_response.create(
            model="claude-sonnet-4",
            max_tokens=100,
            messages=[{"role": "user", "content": "Weather in Paris?"}],
        )
    spans = request_spans(receiver, raw.headers["x-contextgate-request-id"])
    call = one(spans, "chat claude-sonnet-4")
    assert call.attributes == call.attributes | {
        "gen_ai.provider.name": "anthropic",
        "gen_ai.system": "anthropic",
        "gen_ai.response.model": "claude-sonnet-4-20250514",
        "gen_ai.response.finish_reasons": ["end_turn"],
        "gen_ai.usage.input_tokens": 2_310,
        "gen_ai.usage.output_tokens": 7,
        "gen_ai.usage.cache_read.input_tokens": 2_000,
        "gen_ai.usage.cache_creation.input_tokens": 300,
    }
    assert any(s.kind == "CLIENT" and s.parent_id == call.span_id for s in spans)


def test_an_upstream_error_marks_both_spans(
    client: openai.OpenAI, upstream: MockUpstream, receiver: OTLPReceiver
) -> None:
    """An upstream 500, relayed, is an error on the upstream span (with the provider's
    error code) and on the server span."""
    upstream.push(
        JSONReply({"error": {"message": "boom", "type": "server_error", "code": None}}, 500)
    )
    with pytest.raises(openai.InternalServerError) as raised:
        client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "Hello"}]
        )
    request_id = raised.value.response.headers["x-contextgate-request-id"]
    spans = request_spans(receiver, request_id)
    server, call = one(spans, "POST /v1/chat/completions"), one(spans, "chat gpt-4o")
    assert call.error
    assert call.attributes["error.type"] == "server_error"
    assert call.attributes["http.response.status_code"] == 500
    assert server.error
    assert server.attributes["http.response.status_code"] == 500


def test_a_cache_break_is_named_on_the_server_span(
    client: openai.OpenAI, receiver: OTLPReceiver
) -> None:
    """The cause in ``x-contextgate-cache-break`` is also the request's server span's
    ``contextgate.cache_break``."""
    system = "You are the airline's agent. Follow the booking policy to the letter. " * 60
    headers = {"x-contextgate-conversation": "tracing-breaks"}
    first: list[Any] = [
        {"role": "system", "content": system},
        {"role": "user", "content": "Question 0"},
    ]
    client.chat.completions.create(model="gpt-4o", messages=first, extra_headers=headers)
    second: list[Any] = [
        {"role": "system", "content": system + " Be brief."},
        {"role": "user", "content": "Question 0"},
        {"role": "assistant", "content": "Hello from the mock."},
        {"role": "user", "content": "Question 1"},
    ]
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=second, extra_headers=headers
    )
    assert raw.headers["x-contextgate-cache-break"] == "system"
    spans = request_spans(receiver, raw.headers["x-contextgate-request-id"])
    server = one(spans, "POST /v1/chat/completions")
    assert server.attributes["contextgate.cache_break"] == "system"


def test_no_span_carries_the_key_or_the_prompt(
    client: openai.OpenAI, receiver: OTLPReceiver
) -> None:
    """Every attribute of every span exported so far (this module's requests: buffered,
    streamed, Messages, offloaded to Redis) is free of the caller's key and its prompt."""
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": SECRET_TEXT}]
    )
    request_spans(receiver, raw.headers["x-contextgate-request-id"])
    spans = receiver.spans
    assert len({s.attributes.get("contextgate.request_id") for s in spans}) > 5
    for span in spans:
        for name, value in span.attributes.items():
            assert KEY not in str(value), (span.name, name)
            assert SECRET_TEXT not in str(value), (span.name, name)


def test_probes_get_no_span(served: ServeProcess, receiver: OTLPReceiver) -> None:
    """``/healthz``, ``/readyz`` and ``/metrics`` are served without a span."""
    root = served.base_url.removesuffix("/v1")
    for path in ("/healthz", "/readyz", "/metrics"):
        assert httpx.get(root + path).status_code == 200
    marker = httpx.post(
        f"{served.base_url}/context/compact",
        json={"model": "gpt-4o", "messages": [{"role": "user", "content": "Hello"}]},
        headers={"authorization": f"Bearer {KEY}"},
    )
    spans = receiver.wait_for(
        lambda spans: any(s.name == "POST /v1/context/compact" for s in spans)
    )
    assert any(s.name == "POST /v1/context/compact" for s in spans), marker.text
    assert not [
        s for s in spans if s.attributes.get("url.path") in ("/healthz", "/readyz", "/metrics")
    ]


def test_spans_waiting_in_the_batch_are_sent_when_the_gateway_stops(
    mock_upstream: MockUpstream, upstream: MockUpstream, tmp_path: Path
) -> None:
    """A gateway stopped (SIGTERM) before its batch was due still exports it."""
    config = f"upstream:\n  base_url: {mock_upstream.base_url}\nsummaries: false\n"
    with OTLPReceiver() as receiver:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "600000",
        }
        with ServeProcess(config, str(tmp_path), env=env) as process:
            response = httpx.post(
                f"{process.base_url}/chat/completions",
                json={"model": "gpt-4o", "messages": [{"role": "user", "content": "Hello"}]},
                headers={"authorization": f"Bearer {KEY}"},
            )
            assert response.status_code == 200
            assert receiver.spans == []
        names = {span.name for span in receiver.spans}
    assert {"POST /v1/chat/completions", "chat gpt-4o"} <= names


def test_without_otel_variables_nothing_is_installed(
    upstream: MockUpstream, mock_upstream: MockUpstream
) -> None:
    """With no ``OTEL_*`` variables (the suite runs without them), a gateway installs no
    tracer provider and starts no exporter, and the caller's traceparent reaches the
    upstream as it was sent."""
    assert not [name for name in os.environ if name.startswith("OTEL_")]
    from tests.conftest import settings_for

    with GatewayServer(settings_for(mock_upstream)) as server:
        response = httpx.post(
            f"{server.base_url}/chat/completions",
            json={"model": "gpt-4o", "messages": [{"role": "user", "content": "Hello"}]},
            headers={"authorization": f"Bearer {KEY}", "traceparent": TRACEPARENT},
        )
    assert response.status_code == 200
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    assert not [t for t in threading.enumerate() if t.name.startswith("OtelBatch")]
    assert upstream.received[-1].header_lines.count(("traceparent", TRACEPARENT)) == 1


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_SDK_DISABLED": "true"}, False),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_TRACES_EXPORTER": "none"},
            False,
        ),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
    ],
)
def test_only_the_otel_variables_turn_tracing_on(env: dict[str, str], on: bool) -> None:
    """An exporter is installed when an endpoint or an exporter is named, and not when
    none is, the SDK is disabled, or the exporter is ``none``."""
    script = (
        "from gateway.telemetry.tracing import configure_tracing, tracing_on\n"
        "configure_tracing(); configure_tracing(); print(tracing_on())\n"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**clean, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == str(on)


def test_a_grpc_protocol_is_sent_over_http_with_a_warning() -> None:
    """The gRPC exporter is not shipped: asked for, the gateway says so and exports over
    HTTP instead of failing to start."""
    script = (
        "import logging; logging.basicConfig()\n"
        "from gateway.telemetry.tracing import configure_tracing, tracing_on\n"
        "configure_tracing(); print(tracing_on())\n"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
    }
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**clean, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == "True"
    assert "'grpc' is not installed" in done.stderr
