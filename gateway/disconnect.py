"""Stopping upstream work when the client has gone away.

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

from gateway.errors import GatewayError

__all__ = ["ClientDisconnected", "while_connected"]

T = TypeVar("T")


class ClientDisconnected(GatewayError):
    """The client closed the connection before the answer was ready (nginx's 499)."""

    status = 499
    type = "invalid_request_error"
    default_code = "client_closed_request"


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
