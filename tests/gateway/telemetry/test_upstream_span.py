"""The upstream span reads an answer's GenAI attributes, whole or streamed, in either
provider's form, and ends exactly when the answer does (spans of a provider of the test's
own; the end-to-end view is ``test_tracing.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from gateway.telemetry.upstream_span import UpstreamCall
from tests.gateway.codecs.chat_anthropic.samples import events_of


@pytest.fixture
def exported() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def call(exported: InMemorySpanExporter) -> UpstreamCall:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    return UpstreamCall(provider.get_tracer("test").start_span("chat claude"))


async def replay(events: list[bytes]) -> AsyncIterator[bytes]:
    for event in events:
        yield event


def ended(exported: InMemorySpanExporter) -> ReadableSpan:
    (span,) = exported.get_finished_spans()
    return span


async def test_an_anthropic_stream_gives_its_model_usage_and_stop_reason(
    call: UpstreamCall, exported: InMemorySpanExporter
) -> None:
    """A recorded Messages stream, relayed event for event, leaves on the span the model,
    input and output tokens and the stop reason; the span ends with the stream."""
    recorded = events_of("basic_response.txt")
    events = call.streamed(200, replay(recorded))
    relayed = [event async for event in events]
    assert relayed == recorded
    attributes = ended(exported).attributes
    assert attributes is not None
    assert attributes["gen_ai.response.model"] == "claude-3-opus-latest"
    assert attributes["gen_ai.usage.input_tokens"] == 11
    assert attributes["gen_ai.usage.output_tokens"] == 6
    assert list(attributes["gen_ai.response.finish_reasons"]) == ["end_turn"]  # type: ignore[arg-type]


async def test_a_stream_closed_early_still_ends_its_span(
    call: UpstreamCall, exported: InMemorySpanExporter
) -> None:
    """A client that leaves after the first event ends the span with what was read, and
    no error: the upstream did not fail."""
    events = call.streamed(200, replay(events_of("basic_response.txt")))
    await events.__anext__()
    assert exported.get_finished_spans() == ()
    await events.aclose()  # type: ignore[attr-defined]
    span = ended(exported)
    assert span.attributes is not None
    assert span.attributes["gen_ai.usage.input_tokens"] == 11
    assert span.status.status_code is StatusCode.UNSET


async def test_an_error_event_makes_the_span_an_error(
    call: UpstreamCall, exported: InMemorySpanExporter
) -> None:
    """A stream that ends with the provider's error event is an error of its type."""
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    recorded = [*events_of("basic_response.txt")[:2], b"data: " + orjson.dumps(error) + b"\n\n"]
    async for _ in call.streamed(200, replay(recorded)):
        pass
    span = ended(exported)
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None
    assert span.attributes["error.type"] == "overloaded_error"


def test_an_error_answer_is_an_error_of_its_code(
    call: UpstreamCall, exported: InMemorySpanExporter
) -> None:
    """A whole error answer is an error of the provider's error code, else its type, with
    the status it came with; the call ends once."""
    body = {"error": {"message": "Too long.", "type": "invalid_request_error", "code": None}}
    call.answered(400, orjson.dumps(body))
    call.answered(200, b"{}")  # a call ends once
    span = ended(exported)
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None
    assert span.attributes["error.type"] == "invalid_request_error"
    assert span.attributes["http.response.status_code"] == 400


async def test_an_unrecorded_call_leaves_the_stream_as_it_is() -> None:
    """With tracing off (a span that does not record), the events are not wrapped, so a
    stream costs nothing per event."""
    events = replay([b"data: {}\n\n"])
    assert UpstreamCall(trace.INVALID_SPAN).streamed(200, events) is events
