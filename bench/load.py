"""A minimal closed-loop HTTP/1.1 load generator over asyncio streams.

Each of ``concurrency`` keep-alive connections sends a request, reads the whole answer
(Content-Length or chunked), and sends the next, for ``seconds``. It does far less work per
request than a general-purpose client, so on a small machine it measures the server rather
than itself. Given several ports (replicas behind no balancer), it opens the connections
round-robin over them, as a client-side balancer with one pool per replica would.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence


async def read_response(reader: asyncio.StreamReader) -> int:
    """Read one whole answer; its status."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    lowered = head.lower()
    if b"transfer-encoding: chunked" in lowered:
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            await reader.readexactly(size + 2)
            if size == 0:
                return status
    marker = lowered.index(b"content-length:") + len(b"content-length:")
    length = int(lowered[marker : lowered.index(b"\r\n", marker)])
    await reader.readexactly(length)
    return status


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
