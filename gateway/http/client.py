"""The client's side of the exchange: reading its body, and noticing when it has gone.

Once a request's body is read, the ASGI ``receive`` channel has nothing more to say until
the client disconnects. ``while_connected`` awaits the upstream exchange and that channel
together, and cancels the exchange (closing its upstream connection) the moment the
client leaves, so a cancelled request stops costing tokens upstream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from functools import partial
from typing import Any, TypeVar

from litestar.types import Receive

from gateway.errors import ClientDisconnected, PayloadTooLarge, RequestTimeout

__all__ = ["read_body", "while_connected"]

T = TypeVar("T")


async def read_body(
    receive: Receive, content_length: str | None, limit: int, *, within: float
) -> bytes:
    """The whole request body, refused with 413 as soon as it is known to exceed ``limit``
    bytes (from ``Content-Length``, or while it streams in), 408 if it is not all there
    ``within`` seconds, and 499 if the client leaves before sending all of it."""
    if content_length is not None and content_length.isdigit() and int(content_length) > limit:
        raise PayloadTooLarge(_too_large(limit))
    try:
        async with asyncio.timeout(within):
            return await _receive_body(receive, limit)
    except TimeoutError:
        raise RequestTimeout(
            f"The request body did not arrive within {within:g} seconds."
        ) from None


async def _receive_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected("The client closed the connection while sending its body.")
        chunk: bytes = message.get("body", b"")  # type: ignore[assignment]
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(_too_large(limit))
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _too_large(limit: int) -> str:
    return f"The request body is larger than this gateway accepts ({limit:,} bytes)."


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def while_connected(receive: Receive, work: Awaitable[T]) -> T:
    """The result of ``work``, unless the client disconnects first: then ``work`` is
    cancelled and ``ClientDisconnected`` raised.

    ``work`` runs as a task of its own, which the watcher of the client's channel cancels
    when the channel says the client has gone (a no-op once ``work`` is done); the watcher
    is cancelled as soon as ``work`` ends, without waiting for it to wind down (it only
    awaits the channel). This costs the request no ``asyncio.wait`` and no turn of the
    loop beyond ``work``'s own, twice a request on the chat path."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(receive))
    watcher.add_done_callback(partial(_cancel, task))
    try:
        result = await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if not task.cancelled() or (current is not None and current.cancelling()):
            raise  # cancelled itself (the drain, a timeout), not by the client leaving
        _raise_failure(watcher)
        raise ClientDisconnected("The client closed the connection before the answer.") from None
    finally:
        watcher.cancel()
    _raise_failure(watcher)
    return result


def _cancel(task: asyncio.Future[Any], _: object) -> None:
    task.cancel()


def _raise_failure(watcher: asyncio.Future[None]) -> None:
    """Raise what the watcher of the client's channel failed with, if it did."""
    if watcher.done() and not watcher.cancelled():
        failure = watcher.exception()
        if failure is not None:
            raise failure
