"""A minimal HTTP/1.1 load generator over asyncio streams, closed or open loop.

Closed loop (``closed_loop``): each of ``concurrency`` keep-alive connections sends a
request, reads the whole answer (Content-Length or chunked), and sends the next, for
``seconds``. It does far less work per request than a general-purpose client, so on a small
machine it measures the server rather than itself. Given several ports (replicas behind no
balancer), it opens the connections round-robin over them, as a client-side balancer with
one pool per replica would.

Open loop (``open_loop``): requests start at a fixed rate whatever the answers, as
independent users would send them; each takes an idle keep-alive connection or opens a new
one. A server that falls behind meets ever more requests at once, which is what overload
looks like. Latencies count from the moment a request was due, so a client that could not
keep up does not hide the server's delay. For the same reason the generator makes no
full garbage collection while it sends (``open_loop``): its own pause would be counted as
the server's.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Sequence
from dataclasses import dataclass


async def read_response(reader: asyncio.StreamReader) -> int:
    """Read one whole answer; its status."""
    status, _ = await read_answer(reader)
    return status


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """Read one whole answer; its status and its head (status line and headers)."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    lowered = head.lower()
    if b"transfer-encoding: chunked" in lowered:
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            await reader.readexactly(size + 2)
            if size == 0:
                return status, head
    marker = lowered.index(b"content-length:") + len(b"content-length:")
    length = int(lowered[marker : lowered.index(b"\r\n", marker)])
    await reader.readexactly(length)
    return status, head


def request_bytes(path: str, body: bytes) -> bytes:
    """The whole HTTP/1.1 POST of ``body`` to ``path``, as the load generator sends it."""
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer sk-bench\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def closed_loop(
    port: int | Sequence[int],
    path: str,
    body: bytes,
    *,
    concurrency: int,
    seconds: float,
    latencies: list[float] | None = None,
) -> tuple[float, int]:
    """Requests per second answered 200, and the number of other answers. Connection ``i``
    goes to ``port[i % len(port)]``; ``latencies``, if given, receives every answer's time
    in milliseconds, from the request's first byte sent to the answer's last byte read."""
    ports = [port] if isinstance(port, int) else list(port)
    request = request_bytes(path, body)
    ok = failed = 0
    deadline = time.perf_counter() + seconds

    async def connection(target: int) -> None:
        nonlocal ok, failed
        reader, writer = await asyncio.open_connection("127.0.0.1", target)
        try:
            while time.perf_counter() < deadline:
                sent = time.perf_counter()
                writer.write(request)
                status = await read_response(reader)
                if latencies is not None:
                    latencies.append((time.perf_counter() - sent) * 1000)
                if status == 200:
                    ok += 1
                else:
                    failed += 1
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(connection(ports[i % len(ports)]) for i in range(concurrency)))
    return ok / (time.perf_counter() - started), failed


async def burst(port: int, path: str, body: bytes, *, count: int) -> list[int]:
    """``count`` requests sent at once, each on a new connection: every answer's status
    (0 when none came within 30 s)."""
    request = request_bytes(path, body)

    async def one() -> int:
        try:
            async with asyncio.timeout(30):
                return await on_new_connection(port, request)
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError):
            return 0

    return list(await asyncio.gather(*(one() for _ in range(count))))


async def on_new_connection(port: int, request: bytes) -> int:
    """Send ``request`` on a connection of its own and read the whole answer; its status."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        return await read_response(reader)
    finally:
        writer.close()


@dataclass(frozen=True, slots=True)
class Answer:
    """One request of an open-loop run."""

    due: float
    """Seconds from the run's start at which the request was due to be sent."""
    status: int
    """The answer's status; 0 when none came (timeout, connection error)."""
    ms: float
    """Milliseconds from ``due`` to the answer's last byte (or to the failure)."""
    retry_after: bool
    """The answer carried ``Retry-After``."""
    late_ms: float = 0.0
    """Milliseconds the request went out after ``due`` (the client's own delay: a
    connection to open, or a client short of CPU)."""
    fresh: bool = False
    """The request was the first on a new connection (not one kept alive)."""


async def open_loop(
    port: int,
    path: str,
    body: bytes,
    *,
    rate: float,
    seconds: float,
    answer_within: float = 30.0,
    max_connections: int = 4_000,
    keepalive: float = 4.0,
) -> list[Answer]:
    """Send ``rate`` requests a second for ``seconds``, each at its due time whatever the
    answers to the earlier ones; every request's ``Answer``, in the order they were due.
    One without an answer within ``answer_within`` seconds counts as failed (status 0).
    Past ``max_connections`` open at once a due request is not sent (status 0, ms 0).
    A connection idle for more than ``keepalive`` seconds is closed rather than reused, as
    an HTTP client's pool expires idle connections before the server's limit (uvicorn's is
    5 s): a request sent just as the server closes its connection would fail, which no
    server could prevent (seen: 22-104 such failures in 100,000-146,000 requests, all on
    connections idle 5.3 s).

    No full (oldest-generation) garbage collection runs in this process while the requests
    are sent: with the run's tasks and answers, tens of thousands of objects, each took
    51-86 ms, two or three in a 12-second run, during which no request went out and no
    answer was read; the requests due meanwhile were counted that much late, a delay of the
    generator's own, not the server's (at twice a gateway's capacity they made a second's
    503 p99 73-136 ms where the others were 8-32 ms). Young collections still run; the
    thresholds, which are the process's, are restored at the end (two open loops at once in
    one process would restore each other's: none runs so)."""
    thresholds = gc.get_threshold()
    gc.collect()
    gc.set_threshold(thresholds[0], thresholds[1], _NO_FULL_COLLECTION)
    try:
        return await _open_loop(
            port, path, body, rate, seconds, answer_within, max_connections, keepalive
        )
    finally:
        gc.set_threshold(*thresholds)


_NO_FULL_COLLECTION = 1_000_000_000
"""A threshold for the oldest generation never reached in a run: young collections run, the
full ones wait."""


async def _open_loop(
    port: int,
    path: str,
    body: bytes,
    rate: float,
    seconds: float,
    answer_within: float,
    max_connections: int,
    keepalive: float,
) -> list[Answer]:
    request = request_bytes(path, body)
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]] = []
    open_count = 0
    answers: list[Answer | None] = []
    started = time.perf_counter()

    def reusable() -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """An idle connection the server has not closed (uvicorn closes one idle for 5 s);
        a closed one is dropped, as an HTTP client checks a pooled connection first."""
        nonlocal open_count
        while idle:
            reader, writer, since = idle.pop()
            if not reader.at_eof() and time.perf_counter() - since <= keepalive:
                return reader, writer
            open_count -= 1
            writer.close()
        return None

    async def one(index: int, due: float) -> None:
        nonlocal open_count
        status, head, late = 0, b"", 0.0
        connection = reusable()
        fresh = connection is None
        if connection is None and open_count >= max_connections:
            answers[index] = Answer(due, 0, 0.0, False, fresh=True)
            return
        try:
            async with asyncio.timeout(answer_within):
                if connection is None:
                    open_count += 1
                    try:
                        connection = await asyncio.open_connection("127.0.0.1", port)
                    except BaseException:
                        open_count -= 1
                        raise
                late = (time.perf_counter() - started - due) * 1000
                connection[1].write(request)
                status, head = await read_answer(connection[0])
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError):
            status = 0
        ms = (time.perf_counter() - started - due) * 1000
        retry_after = b"\r\nretry-after:" in head.lower()
        answers[index] = Answer(due, status, ms, retry_after, late, fresh)
        if status and connection is not None:
            idle.append((*connection, time.perf_counter()))
        elif connection is not None:
            open_count -= 1
            connection[1].close()

    tasks: list[asyncio.Task[None]] = []
    interval = 1.0 / rate
    for index in range(int(rate * seconds)):
        due = index * interval
        wait = started + due - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        answers.append(None)
        tasks.append(asyncio.create_task(one(index, due)))
    await asyncio.gather(*tasks)
    for _, writer, _ in idle:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return [answer for answer in answers if answer is not None]
