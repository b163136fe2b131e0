"""``x-contextgate-cache-break`` and the ``contextgate_cache_breaks_total`` metric: a
conversation whose cached prefix was lost is told why, and counted."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.harness import GatewayServer
from tests.mock_upstream import (
    JSONReply,
    MockUpstream,
    Received,
    Reply,
    SSEReply,
    chat_completion,
    events_of,
)

SYSTEM = "You are the airline's agent. Follow the booking policy to the letter. " * 60


def answer(cached: int) -> JSONReply:
    completion = chat_completion("Done.")
    completion["usage"] = {
        "prompt_tokens": 9_000,
        "completion_tokens": 2,
        "total_tokens": 9_002,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    return JSONReply(completion)


def turns(count: int, system: str = SYSTEM) -> list[dict[str, Any]]:
    """The ``count``-th request of a conversation: the history so far and a new question."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for n in range(count - 1):
        messages += [
            {"role": "user", "content": f"Question {n}"},
            {"role": "assistant", "content": f"Answer {n}"},
        ]
    return [*messages, {"role": "user", "content": f"Question {count - 1}"}]


def send(
    gateway: GatewayServer, conversation: str, messages: list[Any], **fields: Any
) -> httpx.Response:
    return httpx.post(
        f"{gateway.base_url}/chat/completions",
        json={"model": "gpt-4o", "messages": messages, **fields},
        headers={"authorization": "Bearer sk-test", "x-contextgate-conversation": conversation},
        timeout=30,
    )


def breaks(gateway: GatewayServer, cause: str) -> float:
    text = httpx.get(f"{gateway.url}/metrics").text
    line = f'contextgate_cache_breaks_total{{cause="{cause}"}} '
    found = [row for row in text.splitlines() if row.startswith(line)]
    return float(found[0].split()[-1]) if found else 0.0


@pytest.mark.parametrize(
    ("system", "cached", "expected"),
    [
        (SYSTEM + " Be brief.", 0, "system"),  # predicted and seen in the usage
        (SYSTEM, 0, "unknown"),  # only the usage shows it (the provider evicted it)
        (SYSTEM + " Be brief.", 8_000, None),  # predicted, but the provider still read it
        (SYSTEM, 8_000, None),  # nothing changed, nothing lost
    ],
)
def test_a_buffered_answer_names_the_break_it_had(
    gateway: GatewayServer,
    upstream: MockUpstream,
    system: str,
    cached: int,
    expected: str | None,
) -> None:
    conversation = f"breaks-{len(system)}-{cached}"
    upstream.push(answer(0), answer(8_000), answer(cached))
    before = breaks(gateway, expected or "unknown")
    assert "x-contextgate-cache-break" not in send(gateway, conversation, turns(1)).headers
    assert "x-contextgate-cache-break" not in send(gateway, conversation, turns(2)).headers
    response = send(gateway, conversation, turns(3, system))
    assert response.headers.get("x-contextgate-cache-break") == expected
    if expected is not None:
        assert breaks(gateway, expected) == before + 1


def test_a_stream_says_the_predicted_break_before_it_starts(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """Streamed, the headers leave before the usage: they carry the cause the pipeline
    predicted (here, a tool added), and the metric counts it once the usage confirms."""
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {}}}
    chunk = {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-4o",
        "choices": [{"index": 0, "delta": {"content": "Done."}, "finish_reason": "stop"}],
    }
    usage = {**chunk, "choices": [], "usage": answer(0).body["usage"]}
    upstream.push(answer(0), answer(8_000), SSEReply(events_of([chunk, usage])))
    before = breaks(gateway, "tools")
    send(gateway, "stream-breaks", turns(1))
    send(gateway, "stream-breaks", turns(2))
    response = send(
        gateway,
        "stream-breaks",
        turns(3),
        tools=[tool],
        stream=True,
        stream_options={"include_usage": True},
    )
    assert response.headers["x-contextgate-cache-break"] == "tools"
    assert "Done." in response.text
    assert breaks(gateway, "tools") == before + 1


@pytest.mark.parametrize(("cached", "expected"), [(30_100, None), (0, "unknown")])
@pytest.mark.parametrize("wire", ["chat", "messages", "messages-stream"])
def test_restore_rounds_do_not_count_as_the_conversations_cache(
    upstream: MockUpstream, wire: str, cached: int, expected: str | None
) -> None:
    """A request whose model restored something read the cache once per round; the next
    request is judged against the first round alone: the same reads are no break, a real
    drop still is."""
    from gateway.config import AnthropicSettings, Settings, UpstreamSettings
    from tests.gateway.context.restore import test_chat as restore
    from tests.gateway.routes import test_messages as messages

    def chat_round(received: Received) -> Reply:
        body = received.json()
        usage = {
            "prompt_tokens": 31_000,
            "completion_tokens": 8,
            "total_tokens": 31_008,
            "prompt_tokens_details": {"cached_tokens": 30_000},
        }
        if body["messages"][-1]["role"] == "tool" and body["messages"][-1]["tool_call_id"] == "r1":
            reply = restore.answer("Seat 7C is BK0007.", 0)
        else:
            found = restore.REF.search(received.body.decode())
            assert found is not None
            reply = restore.calling(restore.restore_call(found.group()))
        return JSONReply({**reply, "usage": usage})

    def messages_round(received: Received) -> Reply:
        reply = messages.restoring(received)
        assert isinstance(reply, JSONReply)
        usage = {"input_tokens": 1_000, "cache_read_input_tokens": 30_000, "output_tokens": 8}
        body = {**reply.body, "usage": usage}
        return (
            SSEReply(messages.message_events(body))
            if wire == "messages-stream"
            else JSONReply(body)
        )

    settings = Settings(
        upstream=UpstreamSettings(base_url=upstream.base_url),
        anthropic=AnthropicSettings(base_url=upstream.base_url.removesuffix("/v1")),
        summaries=False,
    )
    headers = {"x-api-key": "sk-test", "x-contextgate-conversation": "restored", **restore.POLICY}
    if wire == "chat":
        url, history = "/v1/chat/completions", restore.history("restored")
        request: dict[str, Any] = {"model": "gpt-4o"}
        upstream.handler = chat_round
        later = answer(cached).body
        later["usage"] = {**later["usage"], "prompt_tokens": 31_500}
        then = JSONReply(later)
    else:
        url, history = "/v1/messages", messages.big_tool_history()
        request = {"model": "claude-sonnet-4-6", "max_tokens": 100, "stream": wire != "messages"}
        upstream.handler = messages_round
        usage = {"input_tokens": 1_500, "cache_read_input_tokens": cached, "output_tokens": 8}
        then = JSONReply({**messages.ANSWER, "usage": usage})
    with GatewayServer(settings) as gateway:
        first = httpx.post(
            f"{gateway.url}{url}",
            json={**request, "messages": history},
            headers=headers,
            timeout=30,
        )
        assert first.status_code == 200
        assert len(upstream.received) == 2  # the model restored once
        upstream.handler = None
        upstream.push(then)
        before = breaks(gateway, "unknown")
        history = [
            *history,
            {"role": "assistant", "content": "Seat 7C is BK0007."},
            {"role": "user", "content": "Thanks. Cancel it."},
        ]
        response = httpx.post(
            f"{gateway.url}{url}",
            json={**request, "stream": False, "messages": history},
            headers=headers,
            timeout=30,
        )
        assert response.headers.get("x-contextgate-cache-break") == expected
        assert breaks(gateway, "unknown") == before + (expected is not None)
