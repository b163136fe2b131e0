"""Review of branch ``early``: cases where the accept-path screen
(``gateway.edge.refusal.first_request_refusal``) does not do what the protocol does."""

from __future__ import annotations

import asyncio
import gc
import socket
import time
import warnings
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

import gateway.edge.server as edge_server
from gateway.config import Settings, UpstreamSettings
from gateway.edge.accept import EagerAccept
from gateway.edge.overload import Shedder
from gateway.edge.refusal import _whole_work_request, first_request_refusal
from tests.gateway.edge.test_refusal import BODY, _answer, _hold_the_slot, _request
from tests.harness import GatewayServer
from tests.mock_upstream import MockUpstream

HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"


@pytest.mark.parametrize(
    "extra",
    [
        b"Connection: close\r\nConnection: keep-alive\r\n",  # llhttp: close (flags add up)
        b"Proxy-Connection: close\r\n",  # llhttp treats it as Connection
    ],
)
def test_keep_alive_is_what_the_parser_decides(extra: bytes) -> None:
    """uvicorn's httptools protocol would close after these (``should_keep_alive()`` is
    False); the accept path keeps the connection and sends no ``connection: close``."""
    request = _whole_work_request(HEAD + extra + b"\r\n")
    assert request is None or request[2] is False  # left to the parser, or closing


def test_a_huge_content_length_does_not_raise_in_the_accept_callback() -> None:
    """A Content-Length of more than 4,300 digits: ``int()`` raises ValueError in the
    accept callback (the connection then dropped without an answer, a traceback logged,
    the rest of the accept loop skipped); the parser would answer 400."""
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + b"9" * 5000
    assert _whole_work_request(head + b"\r\n\r\n") is None


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_pending_is_given_back_if_the_connection_cannot_be_set_up() -> None:
    """Let through and counted in ``pending``, but connect_accepted_socket fails before the
    protocol exists (or before it is connected): the count is never given back, and every
    later request is screened as if one more were held."""
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
    accepted (the loop busy) gets its 503 on the accept path; then it idles. Refused by
    the protocol, the connection would be closed at uvicorn's keep-alive limit (5 s), as
    test_refusal checks; refused as accepted, the protocol is made afterwards, never
    arms the keep-alive timer, and the idle connection is held until the client goes."""
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
    """(Coverage the branch lacks, passes on it.) One slot, free; the loop busy while a new
    connection's whole first request arrives: the accept path lets it through and counts
    it, the protocol does not screen it again (it would refuse it: the one slot is taken
    by its own count), and the count is given back."""
    from tests.mock_upstream import JSONReply, chat_completion

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
