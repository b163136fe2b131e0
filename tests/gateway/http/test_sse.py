"""SSE regrouping: whole events out, whatever the chunking in."""

from __future__ import annotations

from collections.abc import AsyncIterator

from hypothesis import given
from hypothesis import strategies as st

from gateway.http.sse import event_data, sse_events

EVENTS = [b'data: {"a": 1}\n\n', b": keep-alive\n\n", b"event: x\ndata: y\n\n", b"data: [DONE]\n\n"]


async def _chunks(data: bytes, cuts: list[int]) -> AsyncIterator[bytes]:
    start = 0
    for cut in sorted(set(cuts)):
        yield data[start:cut]
        start = cut
    yield data[start:]


async def _collect(data: bytes, cuts: list[int]) -> list[bytes]:
    return [event async for event in sse_events(_chunks(data, cuts))]


@given(st.lists(st.integers(min_value=0, max_value=sum(len(e) for e in EVENTS)), max_size=30))
async def test_any_chunking_gives_the_same_events(cuts: list[int]) -> None:
    """However the bytes are cut, the same complete events come out, byte for byte."""
    assert await _collect(b"".join(EVENTS), cuts) == EVENTS


async def test_crlf_terminators_are_kept() -> None:
    """Events terminated by CRLF pairs come out whole with their own terminators."""
    data = b"data: 1\r\n\r\ndata: 2\r\n\r\n"
    assert await _collect(data, [7, 9, 11]) == [b"data: 1\r\n\r\n", b"data: 2\r\n\r\n"]


async def test_unterminated_tail_is_flushed_as_an_event() -> None:
    """A last event without its blank line still reaches the client, terminated."""
    assert await _collect(b"data: 1\n\ndata: 2", []) == [b"data: 1\n\n", b"data: 2\n\n"]


line_end = st.sampled_from([b"\n", b"\r\n", b"\r"])


@given(
    st.lists(
        st.tuples(st.text("abc:{} ", min_size=1, max_size=12), line_end, line_end).filter(
            lambda part: (part[1], part[2]) != (b"\r", b"\n")  # that is one CRLF, not two
        ),
        min_size=1,
        max_size=6,
    ),
    st.lists(st.integers(min_value=0, max_value=200), max_size=20),
)
async def test_mixed_line_endings(parts: list[tuple[str, bytes, bytes]], cuts: list[int]) -> None:
    """Events ended by any pair of CRLF, LF and CR line ends come out whole, however the
    bytes are cut, each as soon as its blank line is complete."""
    events = [b"data: " + text.encode() + first + second for text, first, second in parts]
    data = b"".join(events)
    out = await _collect(data, [cut for cut in cuts if cut <= len(data)])
    assert out == events


_PIECES = st.sampled_from(
    [b"data:", b"data: ", b" ", b"\n", b"\r", b"x", b"{}", b"event: e", b":c"]
)


@given(st.lists(_PIECES, max_size=12).map(b"".join))
def test_event_data_is_its_data_lines_joined(event: bytes) -> None:
    """An event of one data line (taken out directly) and any other give what its
    ``data:`` lines joined by newlines are, whatever its line ends."""
    lines = event.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    data = [line[5:].removeprefix(b" ") for line in lines if line.startswith(b"data:")]
    assert event_data(event) == b"\n".join(data)
