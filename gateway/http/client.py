"""The client's side of the exchange: reading its body, and noticing when it has gone.

Once a request's body is read, the ASGI ``receive`` channel has nothing more to say until
the client disconnects. ``while_connected`` awaits the upstream exchange and that channel
together, and cancels the exchange (closing its upstream connection) the moment the
client leaves, so a cancelled request stops costing tokens upstream.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable
from types import TracebackType
from typing import Any, NoReturn, TypeVar

from litestar.types import Receive

from gateway.errors import ClientDisconnected, PayloadTooLarge, RequestTimeout

__all__ = ["ClientWatch", "read_body", "while_connected"]

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
        with _Deadline(within):
            return await _receive_body(receive, limit)
    except TimeoutError:
        raise RequestTimeout(
            f"The request body did not arrive within {within:g} seconds."
        ) from None


class _Deadline:
    """``within`` seconds for a ``with`` block in the calling task, as ``asyncio.timeout``
    gives them: at the deadline the task is cancelled, and the block ends in
    ``TimeoutError`` when that cancellation is the only one (any other goes on as it
    came). A plain context manager around one timer of the loop's: ``asyncio.timeout``'s
    asynchronous one and its states cost a request's body read about 20,000 instructions
    more (``bench.instructions``)."""

    __slots__ = ("_cancelling", "_expired", "_task", "_timer", "_within")

    def __init__(self, within: float) -> None:
        self._within = within
        self._expired = False

    def __enter__(self) -> None:
        task = asyncio.current_task()
        assert task is not None, "a deadline is kept in a task"
        self._task, self._cancelling = task, task.cancelling()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_at(loop.time() + self._within, self._expire)

    def _expire(self) -> None:
        self._expired = True
        self._task.cancel()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._timer.cancel()
        if (
            self._expired
            and self._task.uncancel() <= self._cancelling
            and kind is asyncio.CancelledError
        ):
            raise TimeoutError from error


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
    cancelled and ``ClientDisconnected`` raised (``ClientWatch.run`` with a watch of its
    own)."""
    watch = ClientWatch(receive)
    try:
        return await watch.run(work)
    finally:
        watch.close()


class ClientWatch:
    """The client's channel watched while one request awaits its upstream, across the
    awaits of an exchange (the answer's headers, then its body or first event): one
    watcher task for all of them, cancelled by ``close``.

    ``run`` awaits its work in the calling task, beside the watcher, which cancels that
    task when the channel says the client has gone, as ``asyncio.timeout`` does for a
    deadline: that cancellation is taken back (``Task.uncancel``) and told from any other
    (the drain, a timeout), which goes on as it came. A task per await and a watcher
    per await cost a chat request a tenth of its work in the gateway (counted in
    instructions, ``bench.instructions``); this costs it one task, no ``asyncio.wait`` and
    no turn of the loop beyond the work's own."""

    __slots__ = ("_watcher",)

    def __init__(self, receive: Receive) -> None:
        self._watcher = asyncio.ensure_future(_disconnected(receive))

    async def run(self, work: Awaitable[T]) -> T:
        """The result of ``work``, unless the client disconnects first (or had, since the
        last ``run``): then ``work`` is cancelled (or never started) and
        ``ClientDisconnected`` raised."""
        watcher = self._watcher
        if watcher.done():
            _discard(work)
            _raise_gone(watcher)
        current = asyncio.current_task()
        assert current is not None, "a client is watched from a task"
        left = _Left(current)
        watcher.add_done_callback(left)
        taken_back = False
        try:
            return await work
        except asyncio.CancelledError:
            if not left.cancelled:
                raise  # cancelled by someone else (the drain, a timeout)
            taken_back = True
            if current.uncancel() > 0:
                raise  # cancelled by someone else too
            _raise_gone(watcher)
        finally:
            left.watching = False
            watcher.remove_done_callback(left)
            if left.cancelled and not taken_back:
                # The work swallowed our cancellation (or turned it into another error):
                # take it back all the same, or the task stays "cancelling" for good.
                current.uncancel()

    def close(self) -> None:
        """Stop watching, without waiting for the watcher to wind down (it only awaits
        the channel)."""
        self._watcher.cancel()


def _discard(work: Awaitable[Any]) -> None:
    """``work`` that will not be awaited, closed (a coroutine) or cancelled (a task)."""
    if inspect.iscoroutine(work):
        work.close()
    elif isinstance(work, asyncio.Future):
        work.cancel()


class _Left:
    """The watcher's done callback: cancels the task awaiting the work while it still
    does, once (a watcher that failed reading the channel counts as the client gone: its
    failure is raised instead of ``ClientDisconnected``)."""

    __slots__ = ("cancelled", "task", "watching")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self.watching = True
        self.cancelled = False

    def __call__(self, watcher: asyncio.Future[None]) -> None:
        if self.watching and not watcher.cancelled():
            self.cancelled = True
            self.task.cancel()


def _raise_gone(watcher: asyncio.Future[None]) -> NoReturn:
    """The watcher's failure reading the channel, else ``ClientDisconnected``."""
    _raise_failure(watcher)
    raise ClientDisconnected("The client closed the connection before the answer.") from None


def _raise_failure(watcher: asyncio.Future[None]) -> None:
    """Raise what the watcher of the client's channel failed with, if it did."""
    if watcher.done() and not watcher.cancelled():
        failure = watcher.exception()
        if failure is not None:
            raise failure
