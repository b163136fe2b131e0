"""``x-contextgate-cache-break`` and the ``contextgate_cache_breaks_total`` metric: a
conversation whose cached prefix was lost is told why, and counted."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.harness import GatewayServer
from tests.mock_upstream import JSONReply, MockUpstream, SSEReply, chat_completion, events_of

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
