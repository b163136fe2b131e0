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
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson

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


Reply = JSONReply | SSEReply | Drop | Hang


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
        if isinstance(reply, JSONReply):
            if reply.delay and await self._until_client_leaves(reader, reply.delay, received):
                return False
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
            return True
        return await self._stream(reply, received, reader, writer)

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

    @staticmethod
    def _head(status: int, headers: dict[str, str]) -> bytes:
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}"]
        lines.extend(f"{name}: {value}" for name, value in headers.items())
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
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
    streamed answer with the event sequence the API sends). Anything else: ``None``."""

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
