"""The exchange with the upstream: what happens around the wire, whatever its format."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.context.call import Call
from gateway.context.exchange import _Metered, _Remembering, _Sent
from gateway.context.record import RequestRecord
from gateway.context.wires import ChatWire
from gateway.telemetry.metrics import Metrics
from pipelines import ConversationState
from pipelines.report import Report


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
