"""Relaying a stream: keep-alive comments on an idle stream, only between whole events."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest
from litestar.response.streaming import ASGIStreamingResponse
from litestar.types import Message

from gateway.http.responses import RelayStream
from gateway.http.sse import KEEPALIVE

EVENTS = [b'data: {"n": 1}\n\n', b'data: {"n": 2}\n\n', b"data: [DONE]\n\n"]


async def paused_events(pause: float) -> AsyncIterator[bytes]:
    """The events, with ``pause`` seconds of silence after the first."""
    yield EVENTS[0]
    await anyio.sleep(pause)
    for event in EVENTS[1:]:
        yield event


async def relayed(keepalive: float, pause: float) -> list[bytes]:
    """The body messages a stream sends, in order, its end as ``<end>``."""
    sent: list[bytes] = []
    ended = anyio.Event()

    async def send(message: Message) -> None:
        assert message["type"] == "http.response.body"
        assert not ended.is_set(), "sent after the end"
        if message["more_body"]:
            sent.append(message["body"])
        else:
            sent.append(b"<end>")
            ended.set()

    async def receive() -> Message:
        await ended.wait()  # as uvicorn, once the response is complete
        return {"type": "http.disconnect"}

    events = paused_events(pause)
    stream = RelayStream(
        iterator=events, upstream=events, keepalive=keepalive, status_code=200, headers=[]
    )
    await stream.send_body(send, receive)
    return sent


async def test_an_idle_stream_gets_comments_between_its_events() -> None:
    """A stream silent for a while gets a comment per keep-alive period, between whole
    events, and none after its end."""
    sent = await relayed(keepalive=0.05, pause=0.3)
    assert sent[0] == EVENTS[0]
    assert sent[-3:] == [*EVENTS[1:], b"<end>"]
    comments = sent[1:-3]
    assert set(comments) == {KEEPALIVE}
    assert 3 <= len(comments) <= 6


async def test_a_busy_stream_gets_no_comments() -> None:
    """Events closer together than the keep-alive period go out alone."""
    assert await relayed(keepalive=5.0, pause=0.05) == [*EVENTS, b"<end>"]


async def test_keepalive_zero_is_off() -> None:
    """0 sends no comment, however long the silence."""
    assert await relayed(keepalive=0, pause=0.2) == [*EVENTS, b"<end>"]


async def _nothing() -> AsyncIterator[bytes]:
    yield b""


@pytest.mark.parametrize("status", [200, 201, 204, 206, 304])
@pytest.mark.parametrize(
    "headers",
    [
        [],
        [("Content-Type", "text/event-stream"), ("X-Request-Id", "cg-1")],
        [("x-a", "1"), ("X-A", "2"), ("Set-Cookie", "a=1"), ("set-cookie", "b=2")],
        [("content-TYPE", "text/plain"), ("Content-Type", "text/html"), ("x-l", "caf\u00e9")],
    ],
)
def test_a_relayed_stream_is_what_litestars_streaming_response_would_be(
    status: int, headers: list[tuple[str, str]]
) -> None:
    """``RelayStream`` sets itself up without ``ASGIStreamingResponse.__init__``: the same
    status, headers (order, duplicates, the default content type), cookies, length and
    body as Litestar's for the same arguments, so that a Litestar upgrade that changes
    its constructor fails here rather than on the wire."""
    iterator = _nothing()
    ours = RelayStream(
        iterator=iterator, upstream=_nothing(), keepalive=0, status_code=status, headers=headers
    )
    litestars = ASGIStreamingResponse(iterator=iterator, status_code=status, headers=headers)
    assert ours.encode_headers() == litestars.encode_headers()
    for name in (
        "status_code",
        "background",
        "body",
        "content_length",
        "_encoded_cookies",
        "encoding",
        "is_head_response",
    ):
        assert getattr(ours, name) == getattr(litestars, name), name
