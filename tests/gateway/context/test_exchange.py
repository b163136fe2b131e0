"""The exchange with the upstream: what happens around the wire, whatever its format."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from gateway.context.call import Call
from gateway.context.exchange import _Metered, _Remembering, _Sent
from gateway.context.record import RequestRecord
from gateway.context.wires import ChatWire
from gateway.telemetry.metrics import Metrics
from pipelines import ConversationState
from pipelines.report import Report
from tests.in_process import in_process
from tests.mock_upstream import chat_completion, events_of


@pytest.mark.parametrize("restoring", [False, True])
async def test_a_stream_closed_before_it_started_still_stores_the_record(
    restoring: bool,
) -> None:
    """The client can leave right after the headers: the record is stored once and the
    upstream events are closed, though the relay never iterated them (nor the restore
    loop around them, which would close nothing); the access log is told it got no usage."""
    closed: list[bool] = []
    remembered: list[Any] = []

    async def upstream_events() -> AsyncIterator[bytes]:
        try:
            yield b"data: {}\n\n"
        finally:
            closed.append(True)

    async def restore_loop(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        async for event in events:  # never reached: the loop never starts
            yield event

    class Recorder:
        metrics = Metrics()

        def remember(self, namespace: str, conversation: str, state: Any) -> None:
            remembered.append((namespace, conversation, state))

    class Result:
        state = ConversationState()
        report = Report("gpt-4o", 128_000, 16_384, 111_616, 10)

    class Chat:
        namespace, conversation, result, state = "ns", "conv", Result(), None
        native = compaction = None

    record = RequestRecord("cg-test")
    call = Call({}, None, record, None, 0.0)  # type: ignore[arg-type]
    events = upstream_events()
    await events.__anext__()  # the first event, already taken by the relay
    tracker = ChatWire(None).usage_tracker()  # type: ignore[arg-type]
    metered = _Metered(events, tracker)
    sent = _Sent(
        Recorder(),  # type: ignore[arg-type]
        call,
        Chat(),  # type: ignore[arg-type]
        ChatWire(None),  # type: ignore[arg-type]
        {},
        object() if restoring else None,  # type: ignore[arg-type]
        5.0,
        0.0,
        {},
    )
    wrapper = _Remembering(sent, restore_loop(metered) if restoring else metered, metered, tracker)
    await wrapper.aclose()
    await wrapper.aclose()
    assert closed == [True]
    assert (record.usage, record.cache_break) == (None, None)
    assert len(remembered) == 1
    assert remembered[0][2].restore_tool is restoring
    assert remembered[0][2].last_seen == 5.0


# In process (``tests/in_process.py``): the exchange's effects a client or an operator sees.

_ASKED = [{"role": "user", "content": "Say hello."}]


def _tokens(metrics: str, kind: str) -> float:
    prefix = f'contextgate_upstream_tokens_total{{kind="{kind}",model="gpt-4o",'
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith(prefix)
    )


def _chunk(content: str) -> dict[str, Any]:
    return {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-4o",
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}],
    }


def _usage_chunk(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-4o",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


@pytest.mark.parametrize("stream", [False, True])
async def test_the_upstreams_usage_is_counted_once_per_answer(stream: bool) -> None:
    """The tokens the upstream reports reach the metrics, from a buffered answer's body or
    from the usage chunk at the end of a stream (not counted again for each event)."""

    def answer(request: httpx.Request) -> httpx.Response:
        if not stream:
            return httpx.Response(200, json=chat_completion("Hello."))
        chunks = [_chunk("Hel"), _chunk("lo."), _usage_chunk(12, 5)]
        return httpx.Response(
            200, headers={"content-type": "text/event-stream"}, content=b"".join(events_of(chunks))
        )

    async with in_process(answer) as gateway:
        for _ in range(2):
            response = await gateway.client.post(
                "/v1/chat/completions",
                json={"model": "gpt-4o", "messages": _ASKED, "stream": stream},
            )
            assert response.status_code == 200
        metrics = (await gateway.client.get("/metrics")).text
    assert _tokens(metrics, "input") == 24
    assert _tokens(metrics, "output") == 10
