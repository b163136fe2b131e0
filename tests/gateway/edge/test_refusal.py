"""Refusals answered by the server's protocol as the request is read: the application's
503, its envelope and ``Retry-After``, a request id; the connection kept for the next
request; probes and other routes untouched."""

from __future__ import annotations

import asyncio
import gc
import socket
import threading
import time
import warnings
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

import gateway.edge.server as edge_server
from gateway.config import AnthropicSettings, Settings, UpstreamSettings
from gateway.edge.accept import EagerAccept
from gateway.edge.overload import Shedder
from gateway.edge.refusal import _whole_work_request, first_request_refusal
from tests.harness import GatewayServer
from tests.mock_upstream import JSONReply, MockUpstream, chat_completion

BODY = b'{"model":"gpt-4o","messages":[{"role":"user","content":"Hi"}]}'
CLAUDE = (
    b'{"model":"claude-sonnet-4-6","max_tokens":20,"messages":[{"role":"user","content":"Hi"}]}'
)


def _request(path: str, body: bytes, *, close: bool = False) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer sk-test\r\nContent-Length: {len(body)}\r\n"
        + ("Connection: close\r\n" if close else "")
        + "\r\n"
    ).encode() + body


def _answer(sock: socket.socket, buffered: bytearray) -> tuple[int, dict[str, str], bytes]:
    """One whole answer read from ``sock`` (with Content-Length): status, headers, body."""
    while b"\r\n\r\n" not in buffered:
        chunk = sock.recv(65_536)
        assert chunk, "the connection closed before an answer"
        buffered += chunk
    head, _, rest = bytes(buffered).partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    length = int(headers["content-length"])
    while len(rest) < length:
        chunk = sock.recv(65_536)
        assert chunk, "the connection closed inside an answer"
        rest += chunk
    buffered[:] = rest[length:]
    return int(lines[0].split()[1]), headers, rest[:length]


def _hold_the_slot(
    client: httpx.Client, upstream: MockUpstream, *, delay: float
) -> threading.Thread:
    """A chat request that holds the gateway's one slot for ``delay`` seconds, on a thread
    (join it), once it has reached the upstream."""
    upstream.push(JSONReply(chat_completion(), delay=delay))
    holder = threading.Thread(
        target=client.post,
        args=("/v1/chat/completions",),
        kwargs={"content": BODY, "headers": {"authorization": "Bearer sk-test"}},
    )
    holder.start()
    deadline = time.monotonic() + 5
    while not upstream.in_flight and time.monotonic() < deadline:
        time.sleep(0.01)
    return holder


def test_a_refused_request_is_answered_as_read_and_its_connection_serves_the_next(
    upstream: MockUpstream,
) -> None:
    """One slot, held by a slow request: two requests written at once on one connection
    (chat, then Messages) get the 503 in their envelopes with Retry-After and a request
    id; a third, once the slot is free, is served on the same connection; one asking to
    close gets its 503 and the close; /healthz answers meanwhile."""
    settings = Settings(
        upstream=UpstreamSettings(base_url=upstream.base_url),
        anthropic=AnthropicSettings(base_url=upstream.base_url.removesuffix("/v1")),
        summaries=False,
        max_in_flight=1,
    )
    with GatewayServer(settings) as server, httpx.Client(base_url=server.url) as client:
        assert server.protocol.__name__ == "RefusingProtocol"
        holder = _hold_the_slot(client, upstream, delay=1.0)
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            buffered = bytearray()
            sock.sendall(_request("/v1/chat/completions", BODY) + _request("/v1/messages", CLAUDE))
            chat = _answer(sock, buffered)
            messages = _answer(sock, buffered)
            healthz = client.get("/healthz").status_code
            holder.join()
            sock.sendall(_request("/v1/chat/completions", BODY))
            served = _answer(sock, buffered)
        holder = _hold_the_slot(client, upstream, delay=1.0)
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            buffered = bytearray()
            sock.sendall(_request("/v1/chat/completions", BODY, close=True))
            closing = _answer(sock, buffered)
            after = sock.recv(1)
        holder.join()
        metrics = client.get("/metrics").text
    status, headers, body = chat
    assert status == 503
    assert headers["retry-after"] == "1"
    assert headers["x-contextgate-request-id"].startswith("cg-")
    assert b'"code":"gateway_overloaded"' in body
    status, headers, body = messages
    assert status == 503
    assert headers["retry-after"] == "1"
    assert body.startswith(b'{"type":"error","error":{"type":"api_error"')
    assert chat[1]["x-contextgate-request-id"] != headers["x-contextgate-request-id"]
    assert healthz == 200
    assert served[0] == 200
    assert closing[0] == 503
    assert closing[1]["connection"] == "close"
    assert after == b""
    assert 'contextgate_overload_shed_total{reason="in_flight"} 3.0' in metrics
    assert "contextgate_admitted_in_flight 0.0" in metrics
    assert "contextgate_admission_pending 0.0" in metrics


def test_a_refused_body_in_later_packets_and_a_client_expecting_100_continue(
    upstream: MockUpstream,
) -> None:
    """One slot, held by a slow request. A refused request whose body comes after its 503
    (a large body arrives in several reads) keeps its connection in step: the body is
    discarded, the next request on the connection is answered, and the connection, idle
    after that, is closed at uvicorn's keep-alive limit as any other. A client that waits
    for ``100 Continue`` gets the 503 and the close: it will not send its body, so the
    connection could not be read on. The refusal carries a ``date``, as the application's
    answers do."""
    settings = Settings(
        upstream=UpstreamSettings(base_url=upstream.base_url),
        summaries=False,
        max_in_flight=1,
    )
    with GatewayServer(settings) as server, httpx.Client(base_url=server.url) as client:
        holder = _hold_the_slot(client, upstream, delay=3.0)
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            buffered = bytearray()
            request = _request("/v1/chat/completions", BODY)
            head = request[: request.index(b"\r\n\r\n")] + b"\r\nExpect: 100-continue\r\n\r\n"
            sock.sendall(head)
            waiting = _answer(sock, buffered)
            after = sock.recv(1)
        with socket.create_connection(("127.0.0.1", server.port), timeout=15) as sock:
            buffered = bytearray()
            request = _request("/v1/chat/completions", BODY)
            head = request[: request.index(b"\r\n\r\n") + 4]
            sock.sendall(head)
            refused = _answer(sock, buffered)
            time.sleep(0.3)
            sock.sendall(request[len(head) :])
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            healthz = _answer(sock, buffered)
            idle_from = time.monotonic()
            closed = sock.recv(1)
            idle = time.monotonic() - idle_from
        holder.join()
    assert refused[0] == 503
    assert "date" in refused[1]
    assert healthz[0] == 200
    assert closed == b""
    assert idle < 14  # closed by the keep-alive limit (5 s), not left open
    assert waiting[0] == 503
    assert waiting[1]["connection"] == "close"
    assert after == b""


def test_requests_read_in_one_turn_are_screened_with_those_let_through_before_them(
    upstream: MockUpstream,
) -> None:
    """One slot, free. Two requests on two connections arrive while the loop is busy, so
    both are read in the same turn, before either's task has run: the first is let
    through and counted, and the second is refused there and then by the protocol, not
    let through as well for the application to refuse a turn later (the application sees
    one request, not two)."""
    seen: list[str] = []

    def wrap(app: Any) -> Any:
        async def recorded(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                seen.append(scope["path"])
                if scope["query_string"] == b"block":
                    time.sleep(1.0)  # noqa: ASYNC251 -- the point: the loop is busy
            await app(scope, receive, send)

        return recorded

    settings = Settings(  # no loop-wait limit: the slot and the count alone decide
        upstream=UpstreamSettings(base_url=upstream.base_url),
        summaries=False,
        max_in_flight=1,
        max_queue_delay=None,
    )
    upstream.push(JSONReply(chat_completion()))
    with GatewayServer(settings, wrap=wrap) as server:
        with (
            socket.create_connection(("127.0.0.1", server.port), timeout=5) as blocker,
            socket.create_connection(("127.0.0.1", server.port), timeout=5) as first,
            socket.create_connection(("127.0.0.1", server.port), timeout=5) as second,
        ):
            # Both connections set up, then the loop is held while both requests arrive.
            blocker.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            _answer(blocker, bytearray())
            blocker.sendall(b"GET /healthz?block HTTP/1.1\r\nHost: x\r\n\r\n")
            deadline = time.monotonic() + 5
            while len(seen) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            first.sendall(_request("/v1/chat/completions", BODY))
            second.sendall(_request("/v1/chat/completions", BODY))
            served = _answer(first, bytearray())
            refused = second.recv(65_536)
            _answer(blocker, bytearray())
        shedder = server.app.state.gateway.shedder
    assert served[0] == 200
    assert refused.startswith(b"HTTP/1.1 503 ")
    assert seen.count("/v1/chat/completions") == 1, "the second refused by the application"
    assert shedder.shed == {"in_flight": 1, "loop_wait": 0}
    assert shedder.pending == 0
    assert shedder.in_flight == 0


class Connected(asyncio.Protocol):
    """What a server's protocol factory makes (here: nothing more)."""


def _accepted(request: bytes) -> tuple[socket.socket, socket.socket]:
    """A new connection as ``gateway.edge.accept`` is handed it (accepted, non-blocking)
    once its client has sent ``request``; and the client's end."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname()[:2], timeout=5)
        client.sendall(request)
        connection, _ = listener.accept()
    connection.setblocking(False)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # loopback: the bytes are there at once, or nearly
        try:
            if len(connection.recv(65_536, socket.MSG_PEEK)) >= len(request):
                break
        except BlockingIOError:
            pass
        time.sleep(0.001)
    return connection, client


def _waiting(connection: socket.socket) -> bytes:
    """What is still unread in ``connection`` (b"" if nothing)."""
    try:
        return connection.recv(65_536, socket.MSG_PEEK)
    except BlockingIOError:
        return b""


def test_a_new_connections_first_request_is_refused_as_it_is_accepted() -> None:
    """The shedder full: a new connection's first request, all arrived, is read and
    answered as the connection is accepted (the 503 in the route's envelope, Retry-After,
    a request id, the server's date), and the connection handed on for the next request,
    which stays in the socket; one asking to close gets its 503 and the close."""
    shedder = Shedder(max_in_flight=1, max_queue_delay=None)
    assert shedder.admit() is None
    server_state = SimpleNamespace(default_headers=[(b"date", b"Sun, 29 Nov 2026 22:00:00 GMT")])
    made: list[asyncio.Protocol] = []

    def protocol() -> asyncio.Protocol:
        made.append(Connected())
        return made[-1]

    screen = first_request_refusal(shedder, server_state, protocol)
    following = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    connection, client = _accepted(_request("/v1/chat/completions", BODY) + following)
    with connection, client:
        answered = screen(connection)
        assert answered is not None
        assert answered() is made[-1]  # made knowing its first request was answered
        status, headers, body = _answer(client, bytearray())
        assert _waiting(connection) == following
    assert status == 503
    assert headers["retry-after"] == "1"
    assert headers["date"] == "sun, 29 nov 2026 22:00:00 gmt"  # (read lowercased)
    assert headers["x-contextgate-request-id"].startswith("cg-")
    assert "connection" not in headers
    assert b'"code":"gateway_overloaded"' in body
    connection, client = _accepted(_request("/v1/messages", CLAUDE, close=True))
    with connection, client:
        assert screen(connection) is None
        status, headers, body = _answer(client, bytearray())
        assert client.recv(1) == b""
    assert status == 503
    assert headers["connection"] == "close"
    assert body.startswith(b'{"type":"error","error":{"type":"api_error"')
    assert shedder.shed == {"in_flight": 2, "loop_wait": 0}
    assert shedder.pending == 0


def test_a_new_connections_first_request_let_through_is_counted_as_it_is_accepted() -> None:
    """The shedder with room: the first request is left in the socket for the protocol,
    counted as let through at once (the requests read in the same turn see it), and the
    connection's protocol made knowing it (it will not screen that request again)."""
    shedder = Shedder(max_in_flight=1, max_queue_delay=None)
    screen = first_request_refusal(shedder, SimpleNamespace(default_headers=[]), Connected)
    request = _request("/v1/chat/completions", BODY)
    connection, client = _accepted(request)
    with connection, client:
        factory = screen(connection)
        assert factory is not None
        assert factory is not Connected
        assert factory()._let_through  # type: ignore[attr-defined]
        assert _waiting(connection) == request
    assert shedder.pending == 1
    assert shedder.screen() is not None, "the one slot is taken by the request let through"


def test_a_new_connections_first_request_is_left_to_the_protocol_unless_whole_and_work() -> None:
    """The shedder full, and new connections whose first request is not one to screen as
    accepted: a probe, HEAD, a body still coming, chunked, Expect: 100-continue, an
    escaped path, HTTP/1.0, nothing sent yet: left in the socket, nothing counted."""
    shedder = Shedder(max_in_flight=1, max_queue_delay=None)
    assert shedder.admit() is None
    screen = first_request_refusal(shedder, SimpleNamespace(default_headers=[]), asyncio.Protocol)
    chat = _request("/v1/chat/completions", BODY)
    head = chat[: chat.index(b"\r\n\r\n")]
    cases = [
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
        b"HEAD /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
        chat[:-5],
        head.replace(b"Content-Length", b"Transfer-Encoding: chunked\r\nX-Length") + b"\r\n\r\n",
        head + b"\r\nExpect: 100-continue\r\n\r\n",
        chat.replace(b"/v1/chat/completions", b"/v1/%6Dessages"),
        chat.replace(b"HTTP/1.1", b"HTTP/1.0"),
        b"",
    ]
    for sent in cases:
        connection, client = _accepted(sent)
        with connection, client:
            assert screen(connection) is asyncio.Protocol, sent
            assert _waiting(connection) == sent
    assert shedder.shed == {"in_flight": 0, "loop_wait": 0}
    assert shedder.pending == 0


HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"


@pytest.mark.parametrize(
    "extra",
    [
        b"Connection: close\r\nConnection: keep-alive\r\n",  # llhttp: close (flags add up)
        b"Proxy-Connection: close\r\n",  # llhttp treats it as Connection
    ],
)
def test_keep_alive_is_what_the_parser_decides(extra: bytes) -> None:
    """Headers after which uvicorn's httptools protocol closes the connection
    (``should_keep_alive()`` False): the accept path does not answer them as kept alive."""
    request = _whole_work_request(HEAD + extra + b"\r\n")
    assert request is None or request[2] is False  # left to the parser, or closing


def test_a_huge_content_length_does_not_raise_in_the_accept_callback() -> None:
    """A Content-Length of more than 4,300 digits (``int()`` would raise in the accept
    callback): left to the parser, which answers 400."""
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + b"9" * 5000
    assert _whole_work_request(head + b"\r\n\r\n") is None


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_pending_is_given_back_if_the_connection_cannot_be_set_up() -> None:
    """A request let through as its connection is accepted, whose connection then cannot
    be set up (``connect_accepted_socket`` fails before the protocol exists): it was never
    counted in ``pending``, so no later request is screened as if it were held."""
    shedder = Shedder(max_in_flight=4, max_queue_delay=None)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        screen = first_request_refusal(
            shedder, SimpleNamespace(default_headers=[]), asyncio.Protocol
        )
        with socket.create_server(("127.0.0.1", 0)) as listener:
            accept = EagerAccept([listener], asyncio.Protocol, None, screen)

            async def failing(factory: Any, sock: socket.socket, **kwargs: Any) -> Any:
                sock.close()  # (the traceback, kept by the log record, would hold it)
                raise OSError("set-up failed")

            loop.connect_accepted_socket = failing  # type: ignore[method-assign]
            client = socket.create_connection(listener.getsockname()[:2], timeout=5)
            client.sendall(_request("/v1/chat/completions", BODY))
            time.sleep(0.05)  # noqa: ASYNC251 -- the bytes in before the accept
            await asyncio.sleep(0.05)
            accept.close()
            client.close()
            await asyncio.sleep(0.05)

    with warnings.catch_warnings():  # the accepted socket is not closed either: GC'd here
        warnings.simplefilter("ignore", ResourceWarning)
        asyncio.run(main())
        gc.collect()
    assert shedder.pending == 0


def test_a_connection_refused_as_accepted_is_closed_at_the_keep_alive_limit(
    upstream: MockUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One slot, held. A new connection whose whole first request is in before it is
    accepted (the loop busy) gets its 503 as it is accepted; then it idles, and is closed
    at uvicorn's keep-alive limit (5 s), as one refused by the protocol is."""
    refused_as_accepted: list[bool] = []
    real = edge_server.first_request_refusal

    def recording(shedder: Shedder, state: Any, protocol: Any) -> Any:
        screen = real(shedder, state, protocol)

        def recorded(connection: socket.socket) -> Any:
            before = sum(shedder.shed.values())
            made = screen(connection)
            refused_as_accepted.append(sum(shedder.shed.values()) > before)
            return made

        return recorded

    monkeypatch.setattr(edge_server, "first_request_refusal", recording)

    def wrap(app: Any) -> Any:
        async def blocking(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http" and scope.get("query_string") == b"block":
                time.sleep(0.5)  # noqa: ASYNC251 -- the loop busy while the request arrives
            await app(scope, receive, send)

        return blocking

    settings = Settings(
        upstream=UpstreamSettings(base_url=upstream.base_url), summaries=False, max_in_flight=1
    )
    with (
        GatewayServer(settings, wrap=wrap) as server,
        httpx.Client(base_url=server.url, timeout=30) as client,
    ):
        holder = _hold_the_slot(client, upstream, delay=3.0)
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as blocker:
            blocker.sendall(b"GET /healthz?block HTTP/1.1\r\nHost: x\r\n\r\n")
            time.sleep(0.1)  # the loop now asleep
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=9)
            sock.sendall(_request("/v1/chat/completions", BODY))
            _answer(blocker, bytearray())
        with sock:
            status = _answer(sock, bytearray())[0]
            started = time.monotonic()
            try:
                closed = sock.recv(1) == b""
            except TimeoutError:
                closed = False
            idle = time.monotonic() - started
        holder.join()
    assert status == 503
    assert refused_as_accepted, "taken by uvicorn's own accept"
    assert refused_as_accepted[-1], "taken by uvicorn's own accept"
    assert closed, f"still open after {idle:.1f} s idle"


def test_a_first_request_let_through_as_accepted_is_served_and_counted_back(
    upstream: MockUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One slot, free; the loop busy while a new connection's whole first request arrives:
    the accept path lets it through and counts it, the protocol does not screen it again
    (it would refuse it: the one slot is taken by its own count), it is served, and the
    count is given back."""
    let_through: list[bool] = []
    real = edge_server.first_request_refusal

    def recording(shedder: Shedder, state: Any, protocol: Any) -> Any:
        screen = real(shedder, state, protocol)

        def recorded(connection: socket.socket) -> Any:
            made = screen(connection)
            let_through.append(made is not None and made is not protocol)
            return made

        return recorded

    monkeypatch.setattr(edge_server, "first_request_refusal", recording)

    def wrap(app: Any) -> Any:
        async def blocking(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http" and scope.get("query_string") == b"block":
                time.sleep(0.5)  # noqa: ASYNC251
            await app(scope, receive, send)

        return blocking

    settings = Settings(
        upstream=UpstreamSettings(base_url=upstream.base_url),
        summaries=False,
        max_in_flight=1,
        max_queue_delay=None,
    )
    upstream.push(JSONReply(chat_completion()))
    with GatewayServer(settings, wrap=wrap) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as blocker:
            blocker.sendall(b"GET /healthz?block HTTP/1.1\r\nHost: x\r\n\r\n")
            time.sleep(0.1)
            with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
                sock.sendall(_request("/v1/chat/completions", BODY))
                _answer(blocker, bytearray())
                status = _answer(sock, bytearray())[0]
        shedder = server.app.state.gateway.shedder
    assert let_through, "taken by uvicorn's own accept"
    assert let_through[-1], "taken by uvicorn's own accept"
    assert status == 200
    assert shedder.pending == 0
    assert shedder.shed == {"in_flight": 0, "loop_wait": 0}
