"""Taking in every connection the kernel has completed, not one per turn of the loop.

Since libuv 1.45 (libuv/libuv#3696), which uvloop embeds, a readable listening socket
yields one ``accept`` per turn of the event loop. A saturated gateway's turns are 10-25 ms
long, so it took in 40-100 connections a second whatever arrived. In a 12 s run at 1.5
times capacity the kernel's accept queue held 110 connections at the median, and the first
request on a new connection waited 1.56 s at p50 and 5.7 s at p99 before the shedder could
even refuse it (docs/RELIABILITY.md, Overload).

``EagerAccept`` watches a duplicate of each listening socket and, each time one is
readable, accepts until the queue is empty, handing every connection to the server's own
protocol, as the server would, in the same callback (not in a task, which would make a
connection's first request wait one turn more). The server's one accept per turn goes on
beside it: each connection is taken by one or the other and served the same way. Given
``first`` (``gateway.edge.refusal.first_request_refusal``), a connection's first request
is screened as it is accepted, and answered there if the shedder refuses it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import ssl
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Final, Protocol

__all__ = ["EagerAccept"]

log = logging.getLogger("contextgate.accept")

_BACKOFF: Final = 0.1
"""Seconds a listening socket is left alone after ``accept`` failed for want of
resources (descriptors, memory): readable all along, it would otherwise spin the loop."""


class Listening(Protocol):
    """A listening socket as the server holds it (``socket.socket`` or uvloop's wrapper)."""

    def fileno(self) -> int: ...


class EagerAccept:
    """Accepts everything waiting on ``sockets`` whenever one is readable, and connects each
    connection to a new protocol from ``protocol_factory``."""

    __slots__ = ("_factory", "_first", "_listeners", "_loop", "_ssl")

    def __init__(
        self,
        sockets: Iterable[Listening],
        protocol_factory: Callable[[], asyncio.Protocol],
        ssl_context: ssl.SSLContext | None = None,
        first: Callable[[socket.socket], Callable[[], asyncio.Protocol] | None] | None = None,
    ) -> None:
        """``first``: called with each new connection before it is set up (not with TLS,
        whose bytes it could not read); the protocol factory to set it up with, or
        ``None`` when it is done with the connection."""
        self._factory = protocol_factory
        self._ssl = ssl_context
        self._first = first if ssl_context is None else None
        self._loop = asyncio.get_running_loop()
        self._listeners: list[socket.socket] = []
        for sock in sockets:
            # A duplicate: uvloop's wrapper cannot accept, and the server's own object
            # stays the server's. It must be closed with the server's (``close``), or the
            # kernel would go on completing connections for a socket no one serves.
            listener = socket.socket(fileno=os.dup(sock.fileno()))
            listener.setblocking(False)
            self._listeners.append(listener)
            self._loop.add_reader(listener.fileno(), self._accept, listener)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("accept failed, retrying in %.1f s: %s", _BACKOFF, exc)
                self._loop.remove_reader(listener.fileno())
                self._loop.call_later(_BACKOFF, self._resume, listener)
                return
            connection.setblocking(False)
            factory: Callable[[], asyncio.Protocol] | None = self._factory
            if self._first is not None:
                try:
                    factory = self._first(connection)
                except Exception:  # never lose the connection (or the rest of the queue)
                    log.exception("screening a new connection's first request failed")
            if factory is not None:
                self._connect(connection, factory)

    def _connect(self, connection: socket.socket, factory: Callable[[], asyncio.Protocol]) -> None:
        """Set the connection up (its transport and protocol) in this callback, as the
        server's own accept does. A task would wait a turn of the loop before its first
        step; a connection's first request then waited a turn longer than the next."""
        setup = self._loop.connect_accepted_socket(factory, connection, ssl=self._ssl)
        self._step(setup, None)

    def _step(self, setup: Coroutine[Any, Any, object], _: object) -> None:
        """Run ``setup`` up to what it waits for (the protocol connected, a TLS
        handshake), and on from there once that is done, as a task would."""
        try:
            waiting = setup.send(None)
        except StopIteration:
            return
        except Exception as exc:
            log.warning("an accepted connection could not be set up: %s", exc)
            return
        if isinstance(waiting, asyncio.Future):
            waiting.add_done_callback(functools.partial(self._step, setup))
        else:  # a bare yield (``asyncio.sleep(0)``): on at the next turn
            self._loop.call_soon(self._step, setup, None)

    def _resume(self, listener: socket.socket) -> None:
        if listener.fileno() != -1:
            self._loop.add_reader(listener.fileno(), self._accept, listener)

    def close(self) -> None:
        """Stop accepting and close the duplicates (before the server closes its own)."""
        for listener in self._listeners:
            if listener.fileno() != -1:
                self._loop.remove_reader(listener.fileno())
                listener.close()
        self._listeners.clear()
