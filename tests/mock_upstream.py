"""A scripted OpenAI-compatible upstream: a real HTTP/1.1 server on loopback.

It runs its own event loop on a thread, so sync and async clients alike can talk to it.
Each test pushes the replies it wants (``push``); requests without a scripted reply get a
plain chat completion. Every request is recorded, and so is every client that hung up
while a reply was in flight (``disconnects``), with the time it happened.

Reply kinds: ``JSONReply`` (any status, body and headers, optionally delayed), ``SSEReply``
(events sent one by one, with a first-byte delay, a pause between events, and an ending:
a clean end, a dropped connection, a TCP reset, or silence), ``Drop`` (close without answering) and
``Hang`` (never answer). ``SummaryModel`` is a handler that answers the gateway's summary
calls, counting them, and the chat traffic beside them.

It speaks OpenAI's Responses API too: builders of its bodies and stream events
(``response_body``, the item helpers, ``response_events``, ``sse_of_events``), a handler
answering its routes (``ResponsesRoutes``), and its WebSocket mode on the same port: a
``GET`` with ``Upgrade: websocket`` is accepted (``WSReject`` refuses it), the handshake is
recorded as a ``Received`` and the connection as a ``WSSession``; each client message is a
``Received`` with method ``"WS"``, and each ``response.create`` takes the next reply, sent
as text frames: a ``WSReply`` (event dicts, paced), an ``SSEReply`` (each event's data),
a ``JSONReply`` (a response's events, or an error event), ``WSClose`` (a close frame with
a code and reason), ``Drop`` (the connection cut) or ``Hang`` (no answer).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import re
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson
from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import State
from websockets.server import ServerProtocol

from pipelines.summary import FIELDS, LIST_FIELDS, key_entities

FIXTURES = Path(__file__).parent / "fixtures"


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float
    header_lines: list[tuple[str, str]] = field(default_factory=list)
    """Every header line as sent, in order (``headers`` keeps the last of each name)."""
    hung_up_at: float | None = None
    """When the client hung up while this request's reply was in flight, if it did."""

    def json(self) -> Any:
        return orjson.loads(self.body)


@dataclass
class JSONReply:
    body: Any = None
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


@dataclass
class SSEReply:
    events: list[bytes]
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    first_byte_delay: float = 0.0
    interval: float = 0.0
    pauses: dict[int, float] = field(default_factory=dict)
    """Seconds of silence after the event at each index, on top of ``interval``."""
    ending: Literal["end", "drop", "reset", "hang"] = "end"
    """After the events: the stream's end, the connection closed (FIN) or reset (RST, as
    a crashed peer or a middlebox does), or silence until the client leaves."""
    gate: int = 0
    """Hold the reply until this many requests are in flight at once (at most 30 s)."""


@dataclass
class Drop:
    """Close the connection without a response."""


@dataclass
class Hang:
    """Accept the request and never answer."""


@dataclass
class WSClose:
    """Close a WebSocket with this code and reason (the server's close frame), then wait
    (at most 2 s) for the client's close frame before closing the connection."""

    code: int = 1000
    reason: str = ""


@dataclass
class WSReply:
    """Text frames over a WebSocket in answer to one client message: each event a JSON
    text frame (a ``str`` or ``bytes`` event is sent as it is), after ``delay``, with
    ``interval`` (and ``pauses``) between them, and then ``close`` if given."""

    events: Sequence[dict[str, Any] | str | bytes]
    delay: float = 0.0
    interval: float = 0.0
    pauses: dict[int, float] = field(default_factory=dict)
    """Seconds of silence after the event at each index, on top of ``interval``."""
    close: WSClose | None = None


@dataclass
class WSReject(JSONReply):
    """Refuse a WebSocket handshake with this HTTP answer. It answers the handshake when
    it is next in the script; elsewhere it is a ``JSONReply``."""

    status: int = 403


@dataclass
class WSSession:
    """One WebSocket connection the mock accepted."""

    handshake: Received
    messages: list[Received] = field(default_factory=list)
    """The client's messages, in order (each also in ``MockUpstream.received``)."""
    close_code: int | None = None
    """The code of the client's close frame (1005 if it had none, 1006 if the client
    left without one); ``None`` while the connection is open."""
    close_reason: str = ""
    closed_by: Literal["client", "server"] | None = None
    """Who closed first: the client (a close frame, or it left) or the mock."""
    closed_at: float | None = None
    _closed: threading.Event = field(default_factory=threading.Event, repr=False)

    def wait_closed(self, timeout: float) -> bool:
        """Whether the connection closed within ``timeout`` seconds."""
        return self._closed.wait(timeout)


Reply = JSONReply | SSEReply | Drop | Hang | WSReply | WSClose


def chat_completion(content: str = "Hello from the mock.", model: str = "gpt-4o") -> dict[str, Any]:
    return {
        "id": "chatcmpl-mock123",
        "object": "chat.completion",
        "created": 1727346172,
        "model": model,
        "system_fingerprint": "fp_mock",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
    }


def chat_chunk(
    delta: dict[str, Any], finish: str | None = None, model: str = "gpt-4o"
) -> dict[str, Any]:
    """One chunk of a streamed chat completion."""
    return {
        "id": "chatcmpl-mock",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def recorded_stream(name: str) -> list[bytes]:
    """The events of a recorded OpenAI stream fixture, each with its terminator."""
    data = (FIXTURES / "openai-recorded" / name).read_bytes()
    return [part + b"\n\n" for part in data.split(b"\n\n") if part.strip()]


def recorded_streams() -> list[str]:
    return sorted(p.name for p in (FIXTURES / "openai-recorded").glob("*.bin"))


class MockUpstream:
    """The server. Use as a context manager, or ``start()`` and ``stop()``."""

    def __init__(self, *, record: bool = True, port: int = 0) -> None:
        self.record = record
        self.received: list[Received] = []
        self.disconnects: list[float] = []
        self.websockets: list[WSSession] = []
        """The WebSocket connections accepted, in order."""
        self.in_flight = 0
        self.max_in_flight = 0
        self.handler: Callable[[Received], Reply | None] | None = None
        self._script: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.StreamWriter] = set()
        self.port = port

    # -- control ---------------------------------------------------------------------------

    def start(self) -> MockUpstream:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(5)
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def __enter__(self) -> MockUpstream:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def ws_url(self) -> str:
        """The Responses API's WebSocket endpoint."""
        return f"ws://127.0.0.1:{self.port}/v1/responses"

    @property
    def open_connections(self) -> int:
        """Client connections open now, idle keep-alive ones included."""
        return len(self._connections)

    def push(self, *replies: Reply) -> None:
        with self._lock:
            self._script.extend(replies)

    def reset(self) -> None:
        with self._lock:
            self._script.clear()
            self.received.clear()
            self.disconnects.clear()
            self.websockets.clear()
            self.handler = None
            self.max_in_flight = self.in_flight

    def wait_for_disconnect(self, timeout: float) -> float | None:
        """Seconds until a client hung up mid-reply, or ``None`` if none did in time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.disconnects:
                return self.disconnects[0]
            time.sleep(0.01)
        return None

    # -- server ----------------------------------------------------------------------------

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]

    async def _stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._connections):
            writer.transport.abort()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2)

    def _next_reply(self, received: Received) -> Reply:
        with self._lock:
            if self._script:
                return self._script.popleft()
        if self.handler is not None:
            reply = self.handler(received)
            if reply is not None:
                return reply
        if received.path.startswith("/v1/models"):
            return JSONReply(
                {
                    "object": "list",
                    "data": [{"id": "gpt-4o", "object": "model", "created": 1, "owned_by": "mock"}],
                }
            )
        return JSONReply(chat_completion())

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._connections.add(writer)
        try:
            while await self._one_exchange(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._connections.discard(writer)
            writer.transport.abort()

    async def _one_exchange(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            return False
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        header_lines: list[tuple[str, str]] = []
        for line in lines[1:]:
            if ":" in line:
                name, value = line.split(":", 1)
                header_lines.append((name.strip().lower(), value.strip()))
        headers = dict(header_lines)
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = await self._chunked(reader)
        else:
            length = int(headers.get("content-length", "0"))
            body = await reader.readexactly(length) if length else b""
        received = Received(method, target, headers, body, time.monotonic(), header_lines)
        if self.record:
            self.received.append(received)
        if method == "GET" and headers.get("upgrade", "").lower() == "websocket":
            return await self._websocket(received, head, reader, writer)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._answer(received, reader, writer)
        finally:
            self.in_flight -= 1

    @staticmethod
    async def _chunked(reader: asyncio.StreamReader) -> bytes:
        """A chunked request body, whole."""
        chunks = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            chunks.append(await reader.readexactly(size))
            await reader.readexactly(2)
            if size == 0:
                return b"".join(chunks)

    async def _answer(
        self, received: Received, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        reply = self._next_reply(received)
        if isinstance(reply, Drop):
            return False
        if isinstance(reply, Hang):
            await self._until_client_leaves(reader, None, received)
            return False
        if isinstance(reply, WSReply | WSClose):
            error = {"message": f"mock: {type(reply).__name__} scripted for an HTTP request"}
            reply = JSONReply({"error": error}, status=500)
        if isinstance(reply, JSONReply):
            if reply.delay and await self._until_client_leaves(reader, reply.delay, received):
                return False
            await self._send_json(reply, writer)
            return True
        return await self._stream(reply, received, reader, writer)

    async def _send_json(self, reply: JSONReply, writer: asyncio.StreamWriter) -> None:
        payload = reply.body if isinstance(reply.body, bytes) else orjson.dumps(reply.body)
        head_out = self._head(
            reply.status,
            {
                "content-type": "application/json",
                "x-request-id": "req_mock",
                **reply.headers,
                "content-length": str(len(payload)),
            },
        )
        writer.write(head_out + payload)
        await writer.drain()

    async def _stream(
        self,
        reply: SSEReply,
        received: Received,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        if reply.first_byte_delay and await self._until_client_leaves(
            reader, reply.first_byte_delay, received
        ):
            return False
        deadline = time.monotonic() + 30
        while self.max_in_flight < reply.gate and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        writer.write(
            self._head(
                reply.status,
                {
                    "content-type": "text/event-stream; charset=utf-8",
                    "x-request-id": "req_mock",
                    **reply.headers,
                    "transfer-encoding": "chunked",
                },
            )
        )
        try:
            for index, event in enumerate(reply.events):
                writer.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
                await writer.drain()
                pause = reply.interval + reply.pauses.get(index, 0.0)
                if pause and await self._until_client_leaves(reader, pause, received):
                    return False
            if reply.ending == "drop":
                return False
            if reply.ending == "reset":
                sock = writer.get_extra_info("socket")
                # A zero linger time makes the close send RST instead of FIN.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
                return False
            if reply.ending == "hang":
                await self._until_client_leaves(reader, None, received)
                return False
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        except ConnectionError:
            self._hung_up(received)
            return False
        return True

    def _hung_up(self, received: Received) -> None:
        received.hung_up_at = time.monotonic()
        self.disconnects.append(received.hung_up_at)

    async def _until_client_leaves(
        self, reader: asyncio.StreamReader, timeout: float | None, received: Received
    ) -> bool:
        """Wait ``timeout`` seconds (forever if ``None``); True if the client hung up."""
        try:
            data = await asyncio.wait_for(reader.read(1), timeout)
        except TimeoutError:
            return False
        except ConnectionError:
            data = b""
        if not data:
            self._hung_up(received)
            return True
        return False

    # -- WebSocket -------------------------------------------------------------------------

    async def _websocket(
        self,
        received: Received,
        head: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        """Upgrade to a WebSocket (or refuse, as scripted), then answer the client's
        messages in order until either side closes."""
        with self._lock:
            reject = (
                self._script.popleft()
                if self._script and isinstance(self._script[0], WSReject)
                else None
            )
        if isinstance(reject, WSReject):
            await self._send_json(reject, writer)
            return True
        protocol = ServerProtocol(max_size=None)
        protocol.receive_data(head)
        request = next(iter(protocol.events_received()), None)
        if not isinstance(request, Request):
            return False
        protocol.send_response(protocol.accept(request))
        session = WSSession(received)
        if protocol.state is State.OPEN and self.record:
            self.websockets.append(session)
        link = _WSLink(protocol, writer, session)
        if not await link.flush() or protocol.state is not State.OPEN:
            return False
        inbox: asyncio.Queue[Received | None] = asyncio.Queue()
        reading = asyncio.create_task(self._ws_read(link, reader, inbox))
        try:
            while (message := await inbox.get()) is not None:
                reply = self._ws_reply(message)
                if reply is not None and not await self._ws_answer(reply, message, link):
                    break
        finally:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(reading), 2)
            reading.cancel()
        return False

    async def _ws_read(
        self, link: _WSLink, reader: asyncio.StreamReader, inbox: asyncio.Queue[Received | None]
    ) -> None:
        """Read frames until the connection ends: each whole message to ``inbox``, pings
        answered, the client's close frame echoed and recorded."""
        protocol, session = link.protocol, link.session
        parts: list[bytes] = []
        try:
            while True:
                try:
                    data = await reader.read(65536)
                except ConnectionError:
                    data = b""
                if data:
                    protocol.receive_data(data)
                else:
                    protocol.receive_eof()
                for frame in protocol.events_received():
                    if not isinstance(frame, Frame):
                        continue
                    if frame.opcode in (Opcode.TEXT, Opcode.BINARY, Opcode.CONT):
                        parts.append(bytes(frame.data))
                        if frame.fin:
                            inbox.put_nowait(self._ws_message(session, b"".join(parts)))
                            parts.clear()
                if protocol.state is not State.OPEN:
                    link.closing.set()
                await link.flush()
                if not data:
                    return
        finally:
            rcvd = protocol.close_rcvd
            session.close_code = rcvd.code if rcvd is not None else 1006
            session.close_reason = rcvd.reason if rcvd is not None else ""
            session.closed_by = session.closed_by or "client"
            session.closed_at = time.monotonic()
            session._closed.set()
            link.closing.set()
            inbox.put_nowait(None)

    def _ws_message(self, session: WSSession, body: bytes) -> Received:
        hs = session.handshake
        message = Received("WS", hs.path, hs.headers, body, time.monotonic(), hs.header_lines)
        session.messages.append(message)
        if self.record:
            self.received.append(message)
        return message

    def _ws_reply(self, message: Received) -> Reply | None:
        """A ``response.create`` takes the script's next reply, else the handler's, else a
        plain answer; other messages get the handler's reply, if it gives one."""
        try:
            body = orjson.loads(message.body)
        except orjson.JSONDecodeError:
            body = None
        if not (isinstance(body, dict) and body.get("type") == "response.create"):
            return self.handler(message) if self.handler is not None else None
        with self._lock:
            if self._script:
                return self._script.popleft()
        if self.handler is not None:
            reply = self.handler(message)
            if reply is not None:
                return reply
        return WSReply(response_events(response_body(body.get("model", "gpt-4o"))))

    async def _ws_answer(self, reply: Reply, message: Received, link: _WSLink) -> bool:
        """Send ``reply`` over the WebSocket; False once the connection is over."""
        if isinstance(reply, Hang):
            return True
        if isinstance(reply, Drop):
            link.session.closed_by = "server"
            link.writer.transport.abort()
            return False
        if isinstance(reply, WSClose):
            return await self._ws_close(reply, link)
        ending: WSClose | str | None
        if isinstance(reply, WSReply):
            frames = [_ws_frame(event) for event in reply.events]
            delay, interval, pauses, ending = reply.delay, reply.interval, reply.pauses, reply.close
        elif isinstance(reply, SSEReply):
            frames = [data for event in reply.events if (data := _sse_data(event)) is not None]
            delay, interval, pauses = reply.first_byte_delay, reply.interval, reply.pauses
            ending = reply.ending
        else:
            frames = [_ws_frame(event) for event in _ws_events_of(reply)]
            delay, interval, pauses, ending = reply.delay, 0.0, {}, None
        if delay and await link.closed_within(delay):
            self._hung_up(message)
            return False
        for index, frame in enumerate(frames):
            if link.protocol.state is not State.OPEN:
                self._hung_up(message)
                return False
            link.protocol.send_text(frame)
            if not await link.flush():
                self._hung_up(message)
                return False
            pause = interval + pauses.get(index, 0.0)
            if pause and await link.closed_within(pause):
                self._hung_up(message)
                return False
        if isinstance(ending, WSClose):
            return await self._ws_close(ending, link)
        if ending in ("drop", "reset"):
            link.session.closed_by = "server"
            if ending == "reset":
                sock = link.writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            link.writer.transport.abort()
            return False
        if ending == "hang":
            await link.closing.wait()
            return False
        return True

    @staticmethod
    async def _ws_close(close: WSClose, link: _WSLink) -> bool:
        if link.protocol.state is State.OPEN:
            link.session.closed_by = "server"
            link.protocol.send_close(close.code, close.reason)
            await link.flush()
            await link.closed_within(2)
        return False

    @staticmethod
    def _head(status: int, headers: dict[str, str]) -> bytes:
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}"]
        lines.extend(f"{name}: {value}" for name, value in headers.items())
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class _WSLink:
    """One WebSocket connection as the server sees it: the protocol's state, the socket,
    and an event set once the client has closed or left."""

    def __init__(
        self, protocol: ServerProtocol, writer: asyncio.StreamWriter, session: WSSession
    ) -> None:
        self.protocol, self.writer, self.session = protocol, writer, session
        self.closing = asyncio.Event()

    async def flush(self) -> bool:
        """Write what the protocol has to send; False if the connection is gone."""
        try:
            for data in self.protocol.data_to_send():
                if data:
                    self.writer.write(data)
                else:
                    self.writer.close()  # the protocol's end of the stream
            await self.writer.drain()
        except ConnectionError:
            return False
        return True

    async def closed_within(self, seconds: float) -> bool:
        """Wait ``seconds``; True as soon as the client closes or leaves."""
        try:
            await asyncio.wait_for(self.closing.wait(), seconds)
        except TimeoutError:
            return False
        return True


def _ws_frame(event: dict[str, Any] | str | bytes) -> bytes:
    if isinstance(event, bytes):
        return event
    return event.encode() if isinstance(event, str) else orjson.dumps(event)


def _sse_data(event: bytes) -> bytes | None:
    """The data of one SSE event (``None`` for a comment, or ``[DONE]``)."""
    lines = [
        line.removeprefix(b"data:").removeprefix(b" ")
        for line in event.splitlines()
        if line.startswith(b"data:")
    ]
    data = b"\n".join(lines)
    return None if not lines or data == b"[DONE]" else data


def _ws_events_of(reply: JSONReply) -> list[dict[str, Any] | str | bytes]:
    """What a ``JSONReply`` is over a WebSocket: an error event for an error status, the
    events that stream a response for a response, else its body as one frame."""
    body = reply.body
    if reply.status >= 400:
        error = body.get("error") if isinstance(body, dict) else None
        if not isinstance(error, dict):
            text = body.decode(errors="replace") if isinstance(body, bytes) else str(body)
            error = {"type": "server_error", "code": None, "message": text, "param": None}
        return [{"type": "error", "status": reply.status, "error": error}]
    if isinstance(body, dict) and body.get("object") == "response":
        return list(response_events(body))
    return [body if isinstance(body, bytes | str | dict) else orjson.dumps(body)]


_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class SummaryModel:
    """A ``MockUpstream.handler`` playing the summary model beside the chat model.
    Requests with ``response_format`` are the gateway's summary calls: each is counted
    and answered, after ``delay``, with a valid summary that keeps every key entity of
    its input (so one attempt suffices), or with ``overflow`` (a context-length error)
    while ``overflows(body)`` says so. Other requests are the chat traffic, answered
    "ok"."""

    def __init__(
        self,
        *,
        delay: float = 0.0,
        goal: str = "Change the reservation.",
        overflows: Callable[[dict[str, Any]], bool] | None = None,
    ) -> None:
        self.delay, self.goal, self.overflows = delay, goal, overflows
        self.calls: list[dict[str, Any]] = []
        """The summary requests, in the order they came."""
        self.answers: list[dict[str, Any]] = []
        """The summaries given, in the same order (none for an overflow)."""
        self._lock = threading.Lock()

    def __call__(self, received: Received) -> JSONReply:
        body = received.json()
        if "response_format" not in body:
            return JSONReply(chat_completion("ok"))
        with self._lock:
            self.calls.append(body)
        if self.overflows is not None and self.overflows(body):
            error = {
                "error": {
                    "message": "This model's maximum context length is 8192 tokens.",
                    "type": "invalid_request_error",
                    "code": "context_length_exceeded",
                }
            }
            return JSONReply(error, status=400)
        text = "\n".join(str(m.get("content")) for m in body["messages"])
        summary = {n: ([] if n in LIST_FIELDS else "") for n in FIELDS} | {
            "user_goal": self.goal,
            "key_findings": sorted(key_entities([text])),
        }
        with self._lock:
            self.answers.append(summary)
        return JSONReply(chat_completion(orjson.dumps(summary).decode()), delay=self.delay)


class OpenAIRoutes:
    """A ``MockUpstream.handler`` answering the OpenAI routes the gateway relays without
    managing them: embeddings, files (a multipart upload kept in memory, its content
    served back), audio speech (binary), stored chat completions (retrieve, update,
    delete, list, messages), model retrieval and deletion, and the Responses API (a
    streamed answer with the event sequence the API sends; ``ResponsesRoutes`` plays the
    whole Responses API). Anything else: ``None``."""

    SPEECH = bytes(range(256)) * 64
    """The audio every speech request gets: 16 KiB of every byte value."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def __call__(self, received: Received) -> Reply | None:
        path = received.path.partition("?")[0]
        method = received.method
        if path == "/v1/embeddings":
            return JSONReply(self._embeddings(received.json()))
        if path == "/v1/files" and method == "POST":
            return JSONReply(self._upload(received))
        if path.startswith("/v1/files/") and path.endswith("/content"):
            content = self.files.get(path.split("/")[3])
            if content is None:
                return JSONReply({"error": {"message": "No such file"}}, status=404)
            return JSONReply(content, headers={"content-type": "application/octet-stream"})
        if path == "/v1/audio/speech":
            return JSONReply(self.SPEECH, headers={"content-type": "audio/mpeg"})
        if path == "/v1/responses" and method == "POST":
            return SSEReply(responses_stream(received.json().get("model", "gpt-4o")))
        if path.startswith("/v1/models/"):
            model = path.removeprefix("/v1/models/")
            if method == "DELETE":
                return JSONReply({"id": model, "object": "model", "deleted": True})
            return JSONReply({"id": model, "object": "model", "created": 1, "owned_by": "org"})
        if path.startswith("/v1/chat/completions") and (method != "POST" or path.count("/") > 3):
            return JSONReply(self._stored(method, path, received))
        return None

    @staticmethod
    def _embeddings(body: dict[str, Any]) -> dict[str, Any]:
        vector = [0.25, -0.5, 0.125]
        embedding: Any = vector
        if body.get("encoding_format") == "base64":
            embedding = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        return {
            "object": "list",
            "data": [{"object": "embedding", "index": 0, "embedding": embedding}],
            "model": body["model"],
            "usage": {"prompt_tokens": 2, "total_tokens": 2},
        }

    def _upload(self, received: Received) -> dict[str, Any]:
        boundary = received.headers["content-type"].split("boundary=")[1].strip('"')
        content, filename = b"", "file"
        for part in received.body.split(b"--" + boundary.encode()):
            head, _, data = part.partition(b"\r\n\r\n")
            if b'name="file"' in head:
                content = data.removesuffix(b"\r\n")
                filename = head.split(b'filename="')[1].split(b'"')[0].decode()
        with self._lock:
            file_id = f"file-mock{len(self.files)}"
            self.files[file_id] = content
        return {
            "id": file_id,
            "object": "file",
            "bytes": len(content),
            "created_at": 1,
            "filename": filename,
            "purpose": "batch",
            "status": "processed",
        }

    @staticmethod
    def _stored(method: str, path: str, received: Received) -> dict[str, Any]:
        parts = path.split("/")  # "", "v1", "chat", "completions", id, "messages"
        if len(parts) == 4:
            return {
                "object": "list",
                "data": [chat_completion()],
                "first_id": "chatcmpl-mock123",
                "last_id": "chatcmpl-mock123",
                "has_more": False,
            }
        completion_id = parts[4]
        if len(parts) == 6:
            message = {"id": f"{completion_id}-0", "role": "user", "content": "Say hello."}
            return {"object": "list", "data": [message], "has_more": False}
        if method == "DELETE":
            return {"object": "chat.completion.deleted", "id": completion_id, "deleted": True}
        completion = chat_completion() | {"id": completion_id}
        if method == "POST":
            completion["metadata"] = received.json().get("metadata")
        return completion


def responses_stream(
    model: str, text: tuple[str, ...] = ("Hello", " from", " the mock.")
) -> list[bytes]:
    """A streamed Responses-API answer, event by event, as the API sends it."""
    message: dict[str, Any] = {
        "id": "msg_mock",
        "type": "message",
        "status": "in_progress",
        "role": "assistant",
        "content": [],
    }
    response: dict[str, Any] = {
        "id": "resp_mock",
        "object": "response",
        "created_at": 1741290958,
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "model": model,
        "output": [],
        "parallel_tool_calls": True,
        "temperature": 1.0,
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "text": {"format": {"type": "text"}},
        "usage": None,
        "metadata": {},
    }
    whole = "".join(text)
    part = {"type": "output_text", "text": whole, "annotations": []}
    done = message | {"status": "completed", "content": [part]}
    usage = {
        "input_tokens": 12,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": len(text),
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 12 + len(text),
    }
    at = {"item_id": "msg_mock", "output_index": 0, "content_index": 0}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": response},
        {"type": "response.in_progress", "response": response},
        {"type": "response.output_item.added", "output_index": 0, "item": message},
        {"type": "response.content_part.added", **at, "part": part | {"text": ""}},
        *(
            {"type": "response.output_text.delta", **at, "delta": delta, "logprobs": []}
            for delta in text
        ),
        {"type": "response.output_text.done", **at, "text": whole, "logprobs": []},
        {"type": "response.content_part.done", **at, "part": part},
        {"type": "response.output_item.done", "output_index": 0, "item": done},
        {
            "type": "response.completed",
            "response": response | {"status": "completed", "output": [done], "usage": usage},
        },
    ]
    return [
        f"event: {event['type']}\n".encode()
        + b"data: "
        + orjson.dumps(event | {"sequence_number": number})
        + b"\n\n"
        for number, event in enumerate(events)
    ]


# -- the Responses API ---------------------------------------------------------------------


def response_usage(
    input_tokens: int = 12,
    output_tokens: int = 5,
    *,
    cached_tokens: int = 0,
    reasoning_tokens: int = 0,
    cache_write_tokens: int = 0,
) -> dict[str, Any]:
    """A response's ``usage``."""
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {
            "cached_tokens": cached_tokens,
            "cache_write_tokens": cache_write_tokens,
        },
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": input_tokens + output_tokens,
    }


def message_item(
    text: str,
    id: str = "msg_mock",
    *,
    status: Literal["completed", "incomplete"] = "completed",
    phase: Literal["commentary", "final_answer"] | None = None,
) -> dict[str, Any]:
    """An assistant message with one ``output_text`` part."""
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    item = {"id": id, "type": "message", "status": status, "role": "assistant"}
    return item | ({"phase": phase} if phase else {}) | {"content": [part]}


def function_call_item(
    name: str,
    arguments: str | dict[str, Any],
    call_id: str = "call_mock",
    id: str = "fc_mock",
    *,
    namespace: str | None = None,
) -> dict[str, Any]:
    """A function call; ``arguments`` as the JSON text the model wrote (a dict is dumped)."""
    if not isinstance(arguments, str):
        arguments = orjson.dumps(arguments).decode()
    return {
        "id": id,
        "type": "function_call",
        "status": "completed",
        "name": name,
        **({"namespace": namespace} if namespace else {}),
        "arguments": arguments,
        "call_id": call_id,
    }


def custom_tool_call_item(
    name: str, input: str, call_id: str = "call_mock", id: str = "ctc_mock"
) -> dict[str, Any]:
    """A call of a custom (free-form) tool, like Codex's ``apply_patch``."""
    return {
        "id": id,
        "type": "custom_tool_call",
        "status": "completed",
        "name": name,
        "input": input,
        "call_id": call_id,
    }


def reasoning_item(
    id: str = "rs_mock",
    *,
    encrypted_content: str | None = None,
    summary: Iterable[str] = (),
) -> dict[str, Any]:
    """A reasoning item: its summary's texts and, if given, its encrypted content."""
    return {
        "id": id,
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": text} for text in summary],
        "encrypted_content": encrypted_content,
    }


def compaction_item(
    encrypted_content: str = "gAAAAAmock-compaction", id: str = "cmp_mock"
) -> dict[str, Any]:
    """What ``responses.compact`` (or automatic compaction) puts in place of the history."""
    return {"id": id, "type": "compaction", "encrypted_content": encrypted_content}


def response_body(
    model: str = "gpt-4o",
    output: list[dict[str, Any]] | None = None,
    *,
    id: str = "resp_mock",
    usage: dict[str, Any] | None = None,
    status: Literal["completed", "incomplete", "failed", "in_progress", "cancelled"] = "completed",
    created_at: int = 1741290958,
    **fields: Any,
) -> dict[str, Any]:
    """A whole ``Response``: ``output`` (by default one message), ``usage`` (by default
    ``response_usage()``), the request's settings at the API's defaults; ``fields``
    override any of them (e.g. ``instructions``, ``previous_response_id``, ``tools``)."""
    if output is None:
        output = [message_item("Hello from the mock.")]
    finished = status in ("completed", "incomplete", "failed", "cancelled")
    return {
        "id": id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": False,
        "completed_at": created_at + 1 if finished else None,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "max_output_tokens": None,
        "max_tool_calls": None,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "prompt_cache_key": None,
        "reasoning": {"effort": None, "summary": None},
        "safety_identifier": None,
        "service_tier": "default",
        "store": True,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": "auto",
        "tools": [],
        "top_logprobs": 0,
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": response_usage() if usage is None else usage,
        "user": None,
        "metadata": {},
    } | fields


_FINAL_EVENT = {"incomplete": "response.incomplete", "failed": "response.failed"}


def _pieces(text: str) -> list[str]:
    """``text`` in the word-sized deltas a stream sends it in (none if it is empty)."""
    return re.findall(r"\s*\S+|\s+$", text)


_PART_STREAMS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "output_text": ("text", "response.output_text", {"logprobs": []}),
    "refusal": ("refusal", "response.refusal", {}),
}
"""Content parts streamed in deltas: the part's text field, the events' stem, and what
else the events carry."""

_CALL_STREAMS = {
    "function_call": ("arguments", "response.function_call_arguments"),
    "custom_tool_call": ("input", "response.custom_tool_call_input"),
}
"""Calls whose text is streamed in deltas: the item's field and the events' stem."""


def _part_events(at: dict[str, Any], part: dict[str, Any]) -> list[dict[str, Any]]:
    """The events that stream one content part of a message."""
    added, done = "response.content_part.added", "response.content_part.done"
    stream = _PART_STREAMS.get(part["type"])
    if stream is None:
        return [{"type": added, **at, "part": part}, {"type": done, **at, "part": part}]
    key, stem, extra = stream
    whole = part[key]
    empty = part | {key: ""} | ({"annotations": []} if "annotations" in part else {})
    return [
        {"type": added, **at, "part": empty},
        *({"type": f"{stem}.delta", **at, "delta": d, **extra} for d in _pieces(whole)),
        {"type": f"{stem}.done", **at, key: whole, **extra},
        {"type": done, **at, "part": part},
    ]


def _item_events(index: int, item: dict[str, Any]) -> list[dict[str, Any]]:
    """The events that stream one output item, from ``output_item.added`` to ``.done``."""
    kind = item.get("type")
    where = {"item_id": item.get("id", ""), "output_index": index}
    added: dict[str, Any] = item | ({"status": "in_progress"} if "status" in item else {})
    body: list[dict[str, Any]] = []
    if kind == "message":
        added |= {"content": []}
        for part_index, part in enumerate(item["content"]):
            body += _part_events(where | {"content_index": part_index}, part)
    elif kind in _CALL_STREAMS:
        key, stem = _CALL_STREAMS[kind]
        added |= {key: ""}
        body += [{"type": f"{stem}.delta", **where, "delta": d} for d in _pieces(item[key])]
        body.append({"type": f"{stem}.done", **where, key: item[key]})
    elif kind == "reasoning":
        added |= {"summary": []}
    return [
        {"type": "response.output_item.added", "output_index": index, "item": added},
        *body,
        {"type": "response.output_item.done", "output_index": index, "item": item},
    ]


def response_events(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The events a streamed answer sends for ``response``, numbered, in the API's order:
    ``response.created`` and ``response.in_progress`` (the response in progress, no
    output yet), each output item's events (a message's content parts and text deltas, a
    function call's argument deltas, a custom tool call's input deltas, a reasoning item
    added and done), then ``response.completed`` (``.incomplete``, ``.failed``, after
    the response's status) with the whole response, usage included."""
    started = response | {"status": "in_progress", "output": [], "usage": None}
    if "completed_at" in response:
        started["completed_at"] = None
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": started},
        {"type": "response.in_progress", "response": started},
    ]
    for index, item in enumerate(response["output"]):
        events += _item_events(index, item)
    final = _FINAL_EVENT.get(response.get("status", ""), "response.completed")
    events.append({"type": final, "response": response})
    return [event | {"sequence_number": number} for number, event in enumerate(events)]


def sse_of_events(events: Iterable[dict[str, Any]]) -> list[bytes]:
    """Responses-API events as SSE events (``event: <type>`` and ``data: <json>``)."""
    return [
        f"event: {event['type']}\n".encode() + b"data: " + orjson.dumps(event) + b"\n\n"
        for event in events
    ]


def ws_error_event(
    message: str,
    *,
    type: str = "invalid_request_error",
    code: str | None = None,
    param: str | None = None,
    status: int = 400,
) -> dict[str, Any]:
    """The error event the Responses API's WebSocket mode sends (``WSReply([...])``)."""
    error = {"type": type, "code": code, "message": message, "param": param}
    return {"type": "error", "status": status, "error": error}


class ResponsesRoutes:
    """A ``MockUpstream.handler`` playing the Responses API, over HTTP and WebSocket.

    ``POST /v1/responses`` creates a response (output from ``output(body)``, by default
    one message saying ``text``; echoing the request's settings) and keeps it with its
    input: a JSON answer, or its events when the body says ``stream``; a WebSocket
    ``response.create`` gets the same events as text frames. ``POST
    /v1/responses/compact`` answers a ``response.compaction`` (the input's user messages
    and a compaction item), ``POST /v1/responses/input_tokens`` a count. For a kept
    response: ``GET /v1/responses/{id}``, ``GET .../input_items``, ``POST .../cancel``
    (the response, cancelled) and ``DELETE`` (it goes); an unknown id gets a 404. Anything
    else: ``None``."""

    ECHOED = (
        "instructions",
        "previous_response_id",
        "metadata",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "temperature",
        "top_p",
        "max_output_tokens",
        "reasoning",
        "store",
        "text",
        "truncation",
        "prompt_cache_key",
        "service_tier",
        "background",
    )
    """The request's settings a response repeats."""

    def __init__(
        self,
        *,
        text: str = "Hello from the mock.",
        output: Callable[[dict[str, Any]], list[dict[str, Any]]] | None = None,
    ) -> None:
        self.text = text
        self.output = output
        self.responses: dict[str, dict[str, Any]] = {}
        """The responses kept, by id."""
        self.inputs: dict[str, list[dict[str, Any]]] = {}
        """Each kept response's input, as input items."""
        self._count = 0
        self._lock = threading.Lock()

    def __call__(self, received: Received) -> Reply | None:
        path, _, query = received.path.partition("?")
        method = received.method
        if method == "WS":
            body = received.json()
            if body.get("type") != "response.create":
                return None
            return WSReply(response_events(self.create(body)))
        if path == "/v1/responses" and method == "POST":
            body = received.json()
            response = self.create(body)
            if body.get("stream"):
                return SSEReply(sse_of_events(response_events(response)))
            return JSONReply(response)
        if path == "/v1/responses/compact" and method == "POST":
            return JSONReply(self.compact(received.json()))
        if path == "/v1/responses/input_tokens" and method == "POST":
            count = max(1, len(received.body) // 4)
            return JSONReply({"object": "response.input_tokens", "input_tokens": count})
        parts = path.split("/")  # "", "v1", "responses", id[, "input_items" | "cancel"]
        if len(parts) not in (4, 5) or parts[2] != "responses":
            return None
        response_id = parts[3]
        with self._lock:
            kept = self.responses.get(response_id)
            if kept is not None and method == "DELETE" and len(parts) == 4:
                del self.responses[response_id]
        if kept is None:
            message = f"Response with id '{response_id}' not found."
            error = {"message": message, "type": "invalid_request_error", "param": None}
            return JSONReply({"error": error | {"code": None}}, status=404)
        if len(parts) == 4:
            if method == "DELETE":
                deleted = {"id": response_id, "object": "response.deleted", "deleted": True}
                return JSONReply(deleted)
            return JSONReply(kept) if method == "GET" else None
        if parts[4] == "cancel" and method == "POST":
            return JSONReply(kept | {"status": "cancelled"})
        if parts[4] == "input_items" and method == "GET":
            items = self.inputs.get(response_id, [])
            if "order=asc" not in query:
                items = items[::-1]
            page = {"object": "list", "data": items, "has_more": False}
            ends = {"first_id": items[0]["id"], "last_id": items[-1]["id"]} if items else {}
            return JSONReply(page | ends)
        return None

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        """A new response to the request ``body``, kept."""
        with self._lock:
            self._count += 1
            number = self._count
        if body.get("generate") is False:
            output: list[dict[str, Any]] = []
        elif self.output is not None:
            output = self.output(body)
        else:
            output = [message_item(self.text, f"msg_mock{number}")]
        settings = {name: body[name] for name in self.ECHOED if name in body}
        response = response_body(
            body.get("model", "gpt-4o"), output, id=f"resp_mock{number}", **settings
        )
        with self._lock:
            self.responses[response["id"]] = response
            self.inputs[response["id"]] = _input_items(body.get("input", []), number)
        return response

    def compact(self, body: dict[str, Any]) -> dict[str, Any]:
        """The answer to ``responses.compact``: the input's user messages, then one
        compaction item."""
        with self._lock:
            self._count += 1
            number = self._count
        given = _input_items(body.get("input", []), number)
        kept = [item for item in given if item.get("role") == "user"]
        compaction = compaction_item(f"gAAAAAmock-compaction-{number}", f"cmp_mock{number}")
        return {
            "id": f"resp_mock{number}",
            "object": "response.compaction",
            "created_at": 1741290958,
            "output": [*kept, compaction],
            "usage": response_usage(12 * max(1, len(given)), 40),
        }


def _input_items(given: str | list[dict[str, Any]], number: int) -> list[dict[str, Any]]:
    """A request's input as the API lists it back: items, each with an id."""
    if isinstance(given, str):
        given = [{"role": "user", "content": given}]
    items = []
    for index, item in enumerate(given):
        item_id = item.get("id") or f"in_mock{number}_{index}"
        if item.get("type", "message") == "message":
            content = item.get("content")
            if isinstance(content, str):
                assistant = item.get("role") == "assistant"
                text_part = {"type": "output_text", "annotations": []} if assistant else {}
                content = [{"type": "input_text", "text": content} | text_part]
            item = item | {"type": "message", "status": "completed", "content": content}
        items.append({"id": item_id} | item)
    return items


def events_of(chunks: Iterable[dict[str, Any]], done: bool = True) -> list[bytes]:
    """SSE events for the given chunk objects, optionally followed by ``[DONE]``."""
    events = [b"data: " + orjson.dumps(chunk) + b"\n\n" for chunk in chunks]
    if done:
        events.append(b"data: [DONE]\n\n")
    return events


def _serve_forever() -> None:
    """``python -m tests.mock_upstream --port N``: a standalone mock for benchmarks.

    It answers chat requests with a fixed completion, or a recorded stream when the request
    asks to stream, and keeps no history, so it costs the same on every path measured.
    ``--stream-interval`` paces a stream's events and ``--delay`` holds each completion, so
    that a benchmark can keep many requests in flight at once (both 0 by default)."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--stream-interval", type=float, default=0.0, help="seconds per event")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before a completion")
    args = parser.parse_args()
    events = recorded_stream("e2aad469b71d1d4894ff833ea147020a9d875eb7ce644a0ff355581690a4cbfd.bin")
    completion = JSONReply(chat_completion(), delay=args.delay)
    stream = SSEReply(events, interval=args.stream_interval)

    def answer(received: Received) -> Reply | None:
        if received.path.startswith("/v1/models"):
            return None  # the model list, never held: it tells that the mock is up
        return stream if b'"stream":true' in received.body else completion

    serve_until_signalled(answer, args.port)


def serve_until_signalled(handler: Callable[[Received], Reply | None], port: int) -> None:
    """Run a mock on ``port`` answering with ``handler`` until SIGTERM or SIGINT; print
    ``ready <port>`` once it listens (what the benchmarks wait for)."""
    import signal

    server = MockUpstream(record=False, port=port)
    server.handler = handler
    server.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(f"ready {server.port}", flush=True)
    stop.wait()
    server.stop()


if __name__ == "__main__":
    _serve_forever()
