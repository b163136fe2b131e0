"""The client's side of the exchange: reading its body, and noticing when it has gone.

Once a request's body is read, the ASGI ``receive`` channel has nothing more to say until
the client disconnects. ``while_connected`` awaits the upstream exchange and that channel
together, and cancels the exchange (closing its upstream connection) the moment the
client leaves, so a cancelled request stops costing tokens upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

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
    cancelled and ``ClientDisconnected`` raised."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    if task.cancelled():
        raise ClientDisconnected("The client closed the connection before the answer.")
    return task.result()
