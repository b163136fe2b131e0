"""Reading the client's body and noticing when it leaves, over a scripted ASGI channel."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.errors import ClientDisconnected, PayloadTooLarge, RequestTimeout
from gateway.http.client import read_body, while_connected


def channel(*messages: dict[str, Any], then_wait: bool = True) -> Any:
    """An ASGI receive callable that hands out ``messages``, then blocks (or disconnects)."""
    queue = list(messages)

    async def receive() -> dict[str, Any]:
        if queue:
            return queue.pop(0)
        if then_wait:
            await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    return receive


async def test_body_in_chunks_is_joined() -> None:
    """A body sent in several ASGI messages comes back whole."""
    receive = channel(
        {"type": "http.request", "body": b"ab", "more_body": True},
        {"type": "http.request", "body": b"cd"},
    )
    assert await read_body(receive, None, 10, within=5) == b"abcd"


async def test_body_over_limit_is_refused_early() -> None:
    """A Content-Length over the limit is refused before reading; so is a streamed body
    once it passes the limit."""
    with pytest.raises(PayloadTooLarge):
        await read_body(channel(), "11", 10, within=5)
    streamed = channel(
        {"type": "http.request", "body": b"x" * 8, "more_body": True},
        {"type": "http.request", "body": b"x" * 8, "more_body": True},
    )
    with pytest.raises(PayloadTooLarge):
        await read_body(streamed, None, 10, within=5)


async def test_disconnect_mid_body_is_499() -> None:
    """A client gone before its body is complete is ClientDisconnected."""
    receive = channel(
        {"type": "http.request", "body": b"{", "more_body": True}, {"type": "http.disconnect"}
    )
    with pytest.raises(ClientDisconnected):
        await read_body(receive, None, 10, within=5)


async def test_slow_body_is_408() -> None:
    """A body still incomplete when its time is up is RequestTimeout, not a hang."""
    receive = channel({"type": "http.request", "body": b"{", "more_body": True})
    with pytest.raises(RequestTimeout):
        await read_body(receive, None, 10, within=0.05)


async def test_a_cancellation_during_a_slow_body_is_not_a_timeout() -> None:
    """A body read cancelled from elsewhere (the drain, the server) ends cancelled, also
    when its deadline passes too; the task is left cancelling as often as it was asked."""
    receive = channel({"type": "http.request", "body": b"{", "more_body": True})
    reading = asyncio.create_task(read_body(receive, None, 10, within=5))
    await asyncio.sleep(0.01)
    reading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reading

    async def cancelled_at_the_deadline() -> bytes:
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().call_later(0.05, task.cancel)
        try:
            return await read_body(receive, None, 10, within=0.05)
        finally:
            assert task.cancelling() == 1

    with pytest.raises(asyncio.CancelledError):
        await asyncio.create_task(cancelled_at_the_deadline())


async def test_work_is_cancelled_when_the_client_leaves() -> None:
    """Work still running when the disconnect arrives is cancelled, and the caller told."""
    cancelled = asyncio.Event()

    async def slow() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "done"

    with pytest.raises(ClientDisconnected):
        await while_connected(channel(then_wait=False), slow())
    assert cancelled.is_set()
    assert await while_connected(channel(), asyncio.sleep(0, "fast")) == "fast"


async def test_a_cancellation_the_work_swallowed_is_taken_back_all_the_same() -> None:
    """The client leaves and the work turns the watcher's cancellation into its own error
    (a cleanup failing): the error comes out and the task is no longer "cancelling", so a
    later timeout or task group in the same request still works."""
    gone = asyncio.Event()

    async def receive() -> dict[str, str]:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def work() -> None:
        try:
            asyncio.get_running_loop().call_soon(gone.set)
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            raise RuntimeError("cleanup failed") from None

    with pytest.raises(RuntimeError):
        await while_connected(receive, work())
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0
    async with asyncio.timeout(0.05):
        await asyncio.sleep(0)
