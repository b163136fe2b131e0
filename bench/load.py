"""A minimal closed-loop HTTP/1.1 load generator over asyncio streams.

Each of ``concurrency`` keep-alive connections sends a request, reads the whole answer
(Content-Length or chunked), and sends the next, for ``seconds``. It does far less work per
request than a general-purpose client, so on a small machine it measures the server rather
than itself.
"""

from __future__ import annotations

import asyncio
import time


async def _read_response(reader: asyncio.StreamReader) -> int:
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


async def closed_loop(
    port: int, path: str, body: bytes, *, concurrency: int, seconds: float
) -> tuple[float, int]:
    """Requests per second answered 200, and the number of other answers."""
    request = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer sk-bench\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    ok = failed = 0
    deadline = time.perf_counter() + seconds

    async def connection() -> None:
        nonlocal ok, failed
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.perf_counter() < deadline:
                writer.write(request)
                if await _read_response(reader) == 200:
                    ok += 1
                else:
                    failed += 1
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(connection() for _ in range(concurrency)))
    return ok / (time.perf_counter() - started), failed
