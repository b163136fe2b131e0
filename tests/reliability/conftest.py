"""A gateway for the fuzz tests: in front of a mock upstream of its own that answers every
valid request (OpenAI and Anthropic forms, streamed or not), with the in-memory store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.config import AnthropicSettings, Settings, UpstreamSettings
from tests.harness import GatewayServer
from tests.mock_upstream import (
    FIXTURES,
    JSONReply,
    MockUpstream,
    Received,
    Reply,
    SSEReply,
    chat_chunk,
    chat_completion,
    events_of,
    message_item,
    response_body,
    response_events,
    sse_of_events,
)

ANTHROPIC_MESSAGE: dict[str, Any] = {
    "id": "msg_mock",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5",
    "content": [{"type": "text", "text": "Hello from the mock."}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 12, "output_tokens": 5},
}
ANTHROPIC_EVENTS = [
    part + b"\n\n"
    for part in (FIXTURES / "anthropic-sse" / "basic_response.txt").read_bytes().split(b"\n\n")
    if part.strip()
]


def answer(received: Received) -> Reply:
    """A success in the form the path asks for, streamed when the request asks to stream."""
    try:
        streamed = orjson.loads(received.body).get("stream") is True
    except (orjson.JSONDecodeError, AttributeError):
        streamed = False
    if received.path.startswith("/v1/models"):
        return JSONReply({"object": "list", "data": [{"id": "gpt-4o", "object": "model"}]})
    if received.path.startswith("/v1/messages/count_tokens"):
        return JSONReply({"input_tokens": 42})
    if received.path.startswith("/v1/messages"):
        if streamed:
            return SSEReply(ANTHROPIC_EVENTS)
        return JSONReply(ANTHROPIC_MESSAGE)
    if received.path == "/v1/responses":
        body = response_body("gpt-4o", [message_item("Hi")])
        return SSEReply(sse_of_events(response_events(body))) if streamed else JSONReply(body)
    if streamed:
        chunks = [chat_chunk({"role": "assistant", "content": "Hi"}), chat_chunk({}, "stop")]
        return SSEReply(events_of(chunks))
    return JSONReply(chat_completion())


@pytest.fixture(scope="package")
def fuzz_upstream() -> Iterator[MockUpstream]:
    """A mock upstream that keeps no history (fuzzing sends thousands of bodies)."""
    with MockUpstream(record=False) as server:
        server.handler = answer
        yield server


@pytest.fixture(scope="package")
def fuzz_gateway(fuzz_upstream: MockUpstream) -> Iterator[GatewayServer]:
    """The gateway under fuzz: OpenAI models and ``claude-*`` alike go to the mock."""
    settings = Settings(
        upstream=UpstreamSettings(base_url=fuzz_upstream.base_url, read_timeout=10.0),
        anthropic=AnthropicSettings(base_url=fuzz_upstream.base_url.removesuffix("/v1")),
        summaries=False,
        # The gateway runs on a thread of this process, whose Hypothesis thread holds the
        # GIL for long stretches building multi-megabyte inputs: its loop's timers are
        # then late tick after tick, and the lag signal would rightly refuse. A gateway
        # process of its own has no such neighbour; shedding is tested in test_overload.
        max_queue_delay=None,
    )
    with GatewayServer(settings) as server:
        yield server


@pytest.fixture(scope="package")
def fuzz_client(fuzz_gateway: GatewayServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fuzz_gateway.url, timeout=60.0) as client:
        yield client


CORPUS = Path(__file__).parent.parent / "fixtures" / "fuzz"
