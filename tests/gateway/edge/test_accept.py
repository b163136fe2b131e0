"""The eager accept that lets a saturated process take in its connections."""

from __future__ import annotations

import asyncio
import socket
import struct

import uvloop

from gateway.edge.accept import EagerAccept


def _accept_queue(listener: socket.socket) -> int:
    info = listener.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 32)
    return int(struct.unpack_from("I", info, 24)[0])


def test_a_busy_uvloop_server_takes_in_every_waiting_connection_at_once() -> None:
    """uvloop takes one connection per turn of its loop; with eager accept, 50 connections
    waiting in the kernel's queue are all connected to the server's protocol within a few
    turns. Closed, the duplicate no longer keeps the port open: connecting is refused."""

    async def main() -> tuple[int, int, bool]:
        made: list[asyncio.BaseTransport] = []

        class Counted(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                made.append(transport)

        loop = asyncio.get_running_loop()
        listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        server = await loop.create_server(Counted, sock=listener)
        eager = EagerAccept(server.sockets, Counted)
        port = listener.getsockname()[1]
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(50)]
        for _ in range(4):
            await asyncio.sleep(0)
        connected, waiting = len(made), _accept_queue(listener)
        eager.close()
        server.close()
        await server.wait_closed()
        for transport in made:
            transport.close()
        for client in clients:
            client.close()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except ConnectionRefusedError:
            refused = True
        else:
            refused = False
        return connected, waiting, refused

    connected, waiting, refused = uvloop.run(main())
    assert (connected, waiting) == (50, 0)
    assert refused
