"""Server-sent events as the gateway relays them: whole events, byte for byte.

The relay forwards each event as soon as its blank-line terminator arrives, never a
fragment, so that if the upstream fails mid-stream the gateway can end the stream with one
well-formed terminal error event.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any, Final

import orjson

from gateway.codecs.json_body import json_dict

__all__ = [
    "KEEPALIVE",
    "close",
    "error_event",
    "event_data",
    "event_json",
    "sse_events",
]

# An event ends at a blank line: two line ends in a row, each of which may be CRLF, LF or
# a lone CR (the SSE spec allows all three, mixed).
KEEPALIVE: Final = b": keep-alive\n\n"
"""An SSE comment, sent on an idle stream to keep intermediaries from timing it out; every
SSE decoder (the openai and anthropic SDKs' included) skips it."""

_EVENT_END: Final = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)")


async def sse_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Regroup a byte stream into complete events, each with its terminator."""
    pending = bytearray()
    async for chunk in chunks:
        if not pending and type(chunk) is bytes:
            # A read that is one whole event, as a stream's reads mostly are: relayed as
            # it came, without going through ``pending`` (what that would yield too).
            match = _EVENT_END.search(chunk)
            if match is not None and match.end() == len(chunk) and not chunk.endswith(b"\r"):
                yield chunk
                continue
        scan_from = max(0, len(pending) - 3)
        pending += chunk
        start = 0
        while match := _EVENT_END.search(pending, scan_from):
            if match.end() == len(pending) and pending.endswith(b"\r"):
                break  # the CR may be the first half of a CRLF still on the wire
            yield bytes(pending[start : match.end()])
            start = scan_from = match.end()
        if start:
            del pending[:start]
    start = 0
    while match := _EVENT_END.search(pending, start):
        yield bytes(pending[start : match.end()])
        start = match.end()
    if pending[start:].strip():
        yield bytes(pending[start:]) + b"\n\n"


def error_event(message: str, *, type: str, code: str) -> bytes:
    """A terminal OpenAI-style error event (the openai SDK raises ``APIError`` on it)."""
    body = {"error": {"message": message, "type": type, "param": None, "code": code}}
    return b"data: " + orjson.dumps(body) + b"\n\n"


def event_data(event: bytes) -> bytes:
    """The data of one event (its ``data:`` lines joined by newlines)."""
    if (
        event.startswith(b"data: ")
        and event.endswith(b"\n\n")
        and event.count(b"\n") == 2
        and b"\r" not in event
    ):
        return event[6:-2]  # one data line, as most events are: what the lines give
    lines = event.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    data = [line[5:].removeprefix(b" ") for line in lines if line.startswith(b"data:")]
    return b"\n".join(data)


def event_json(event: bytes) -> dict[str, Any] | None:
    """The JSON object one event's data holds, or ``None`` (a comment, ``[DONE]``, text)."""
    data = event_data(event).strip()
    return json_dict(data) if data.startswith(b"{") else None


async def close(events: object) -> None:
    """Close ``events``, an async iterator of events (a generator, an upstream's event
    reader), if it is one that can be closed."""
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        await aclose()
