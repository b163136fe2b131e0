"""bench.load: the closed-loop load generator, against small servers on loopback."""

from __future__ import annotations

import asyncio
import gc

from bench.load import closed_loop, open_loop

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
PAUSE = 0.005


class Counting:
    """A keep-alive HTTP/1.1 server that answers every request ``ok`` after ``PAUSE``
    seconds, counting connections and requests; with ``idle``, it closes a connection idle
    for that many seconds, as uvicorn closes keep-alive connections (after 5 s)."""

    def __init__(self, idle: float | None = None) -> None:
        self.connections = 0
        self.requests = 0
        self.idle = idle

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.idle)
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                await asyncio.sleep(PAUSE)
                self.requests += 1
                writer.write(ANSWER)
                await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def test_connections_go_round_robin_over_the_ports_and_every_answer_is_timed() -> None:
    """Six connections over two ports: three on each; one latency per answer, none shorter
    than the server's pause."""
    servers = [Counting(), Counting()]
    listening = [await asyncio.start_server(s.serve, "127.0.0.1", 0) for s in servers]
    ports = [server.sockets[0].getsockname()[1] for server in listening]
    latencies: list[float] = []
    try:
        rps, failed = await closed_loop(
            ports, "/v1/chat/completions", b"{}", concurrency=6, seconds=0.3, latencies=latencies
        )
    finally:
        for server in listening:
            server.close()
            await server.wait_closed()
    assert [s.connections for s in servers] == [3, 3]
    assert failed == 0
    assert rps > 0
    assert len(latencies) == sum(s.requests for s in servers)
    assert min(latencies) >= PAUSE * 1000


async def test_a_single_port_still_works_without_latencies() -> None:
    """The original call (one port, no latency list) sends every connection to that port."""
    server = Counting()
    listening = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    try:
        rps, failed = await closed_loop(port, "/", b"{}", concurrency=2, seconds=0.1)
    finally:
        listening.close()
        await listening.wait_closed()
    assert (server.connections, failed) == (2, 0)
    assert rps > 0


async def test_the_open_loop_does_not_reuse_a_connection_the_server_closed() -> None:
    """Requests due further apart than the server keeps an idle connection each get an
    answer, on a new connection, instead of failing on the closed one."""
    server = Counting(idle=0.05)
    listening = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    try:
        answers = await open_loop(port, "/v1/chat/completions", b"{}", rate=5, seconds=1)
    finally:
        listening.close()
        await listening.wait_closed()
    assert [answer.status for answer in answers] == [200] * 5
    assert server.connections == 5


async def test_the_open_loop_closes_a_connection_idle_past_its_keepalive() -> None:
    """Requests due 0.2 s apart: within the keep-alive they share one connection; with a
    keep-alive of 0.05 s each gets a new one, before the server could close the old."""
    counts = []
    for keepalive in (4.0, 0.05):
        server = Counting()
        listening = await asyncio.start_server(server.serve, "127.0.0.1", 0)
        port = listening.sockets[0].getsockname()[1]
        try:
            answers = await open_loop(
                port, "/v1/chat/completions", b"{}", rate=5, seconds=1, keepalive=keepalive
            )
        finally:
            listening.close()
            await listening.wait_closed()
        assert [answer.status for answer in answers] == [200] * 5
        counts.append(server.connections)
    assert counts == [1, 5]


async def test_the_open_loop_makes_no_full_collection_while_it_sends() -> None:
    """While the requests go out, the oldest generation's threshold is out of reach (a
    full collection's pause would be counted as the server's delay); young collections
    still run; afterwards the thresholds are as before."""
    server = Counting()
    listening = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    before = gc.get_threshold()
    seen: list[tuple[int, int, int]] = []

    async def watch() -> None:
        while True:
            seen.append(gc.get_threshold())
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch())
    try:
        answers = await open_loop(port, "/v1/chat/completions", b"{}", rate=20, seconds=0.5)
    finally:
        watcher.cancel()
        listening.close()
        await listening.wait_closed()
    assert [answer.status for answer in answers] == [200] * 10
    during = seen[2]
    assert during[:2] == before[:2]
    assert during[2] >= 1_000_000
    assert gc.get_threshold() == before
