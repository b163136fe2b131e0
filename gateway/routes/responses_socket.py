"""``GET /v1/responses`` upgraded to a WebSocket: the Responses API's persistent
connection (the openai SDK's ``client.responses.connect()``, Codex CLI), relayed to the
upstream's own WebSocket with each ``response.create`` through the context pipeline.

One client connection is one upstream connection, opened during the client's handshake
with the caller's upstream key and the client's headers (``OpenAI-Beta`` included), so
that everything a connection sends goes up under one key (encrypted reasoning decrypts
only under the key that made it), the upstream's handshake headers reach the client (Codex
reads ``x-codex-turn-state`` there), and the upstream's refusal is the client's, status and
body. Per message from the client:

- ``response.create``: read as a Responses request (its fields beside ``type``), within
  the caller's limits and the process's load, compacted like an HTTP request
  (``routes.responses.compacted``), and sent up as the request the pipeline made (the
  client's own text when it changed nothing). A request the gateway refuses (malformed,
  a model the tenant may not use, over its limits or its budget) is answered with an
  ``error`` event as the API sends one (``status`` and ``error``); the connection stays.
  A ``previous_response_id`` naming an earlier response of this connection (as Codex
  sends every request after its first, with only the new items) is rebuilt into the
  whole history, that response's input and output then the new items, and sent
  stateless: the gateway sees it all, so it compacts it all, as over HTTP. One naming a
  response the gateway did not see (stored upstream) continues state the gateway cannot
  see: kept to hygiene, as over HTTP.
- anything else (``response.steer``, ...) goes up as it came.

Every server event comes back as it came, in order. A response ends at
``response.completed``, ``.incomplete``, ``.failed`` or an ``error`` event: then its usage
feeds the conversation's record (cache warmth, breaks) and it is counted and logged as one
exchange (``WS /v1/responses``), as an HTTP request is. The upstream's close code and
reason reach the client; a client that leaves closes the upstream connection.

A caller without valid credentials is refused at the handshake (401, OpenAI's envelope). At
shutdown (``gateway.edge.drain``) an idle connection is closed with 1001 at once, a busy one
after the last event of its response in flight; a ``response.create`` that comes meanwhile,
or a response the grace period cuts short, gets an ``error`` event
(``gateway_shutting_down``) before the close.

The upstream's side is the ``websockets`` library's client, imported by the first
connection (the functions that use it import its names), as uvicorn's side of it is at the
first upgrade (``gateway.edge.server``): a process whose clients never open one does not
hold it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from time import perf_counter
from typing import TYPE_CHECKING, Any, Final

import anyio
import orjson
from litestar import WebSocket, websocket
from litestar.exceptions import WebSocketDisconnect
from litestar.types import (
    HTTPDisconnectEvent,
    WebSocketResponseBodyEvent,
    WebSocketResponseStartEvent,
)
from opentelemetry.trace import INVALID_SPAN_CONTEXT

from gateway.codecs.responses import (
    chat_usage,
    from_body,
    input_items,
    response_of,
    to_request,
)
from gateway.context.cache_breaks import note_cache_break
from gateway.context.call import Call
from gateway.context.compaction import ChatRequest
from gateway.context.record import RequestRecord, new_request_id
from gateway.edge.access import ACCESS_LOG, AccessLog, Exchange
from gateway.errors import (
    GatewayError,
    PayloadTooLarge,
    ShuttingDown,
    UpstreamTimeout,
    UpstreamUnreachable,
    envelope_of,
)
from gateway.http.forwarding import HOP_BY_HOP, upstream_request_headers
from gateway.routes.responses import compacted, with_preferred
from gateway.runtime import Gateway
from gateway.store.shared import namespace_id
from gateway.tenancy.auth import Caller, identify
from gateway.tenancy.limits import Lease

if TYPE_CHECKING:  # websockets is loaded at the first connection (see the module's doc)
    from websockets.asyncio.client import ClientConnection

__all__ = ["responses_socket"]

log = logging.getLogger("contextgate.responses_socket")

ROUTE: Final = "/v1/responses"
_ENDS: Final = frozenset({"response.completed", "response.incomplete", "response.failed", "error"})
"""Server events after which a response is over."""
_HANDSHAKE: Final = ("sec-websocket-", "content-type")
_NOT_RELAYED: Final = HOP_BY_HOP | {"content-length", "date", "server", "set-cookie"}
"""Headers of the upstream's handshake answer the client's does not take."""
"""Client headers that describe its own handshake, not the request: never sent up."""
_HISTORIES: Final = 4
"""Responses whose whole history a connection keeps for a ``previous_response_id``."""
_GOING_AWAY: Final = 1001
_POLICY: Final = 1008
_INTERNAL: Final = 1011


@websocket(ROUTE)
async def responses_socket(socket: WebSocket[Any, Any, Any]) -> None:
    """The Responses API's WebSocket, each response through the context pipeline."""
    gateway: Gateway = socket.app.state.gateway
    headers = {name.lower(): value for name, value in socket.headers.items()}
    try:
        if gateway.draining.started:
            raise ShuttingDown("The gateway is shutting down; connect again.")
        caller = await identify(gateway.tenants, gateway.stores, headers)
        upstream = await _open_upstream(gateway, caller, headers, socket.scope)
    except _Refused as refused:
        await _deny(socket, refused.status, refused.body, refused.headers)
        return
    except GatewayError as error:
        body = envelope_of(error)
        await _deny(socket, error.status, body, [(b"content-type", b"application/json")])
        return
    try:
        await socket.accept(headers=_handshake_headers(upstream))
    except BaseException:
        with anyio.CancelScope(shield=True):
            await upstream.close()
        raise
    access = socket.scope.get("state", {}).get(ACCESS_LOG)
    connection = _Connection(gateway, socket, headers, caller, access, upstream)
    with gateway.draining.socket() as cancel:
        await connection.serve()
    if cancel.cancelled_caught:
        # The grace period ran out with a response in flight: it will not be answered.
        await connection.shut(ShuttingDown("The gateway is shutting down; connect again."))


class _Refused(Exception):
    """The upstream refused the WebSocket's handshake: its answer, relayed to the client."""

    def __init__(self, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        super().__init__(status)
        self.status, self.body, self.headers = status, body, headers


async def _open_upstream(
    gateway: Gateway, caller: Caller, headers: dict[str, str], scope: Any
) -> ClientConnection:
    """The upstream's WebSocket for one client connection: the OpenAI-compatible
    upstream's ``/responses``, with the client's headers and the caller's upstream key
    (one key for everything the connection sends). Its refusal is ``_Refused``."""
    settings = gateway.settings.upstream
    base = settings.base_url.rstrip("/")
    url = ("ws" + base[4:] if base.startswith("http") else base) + "/responses"
    query = scope.get("query_string", b"")
    if query:
        url += "?" + query.decode("latin-1")
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus, WebSocketException

    key = gateway.upstream_key(caller, "")  # the OpenAI-compatible upstream's, any model
    sent = [
        (name, value)
        for name, value in upstream_request_headers(headers.items(), key).items()
        if not name.startswith(_HANDSHAKE)
    ]
    try:
        return await connect(
            url,
            additional_headers=sent,
            user_agent_header=None,
            open_timeout=settings.connect_timeout,
            max_size=None,
            proxy=None,
        )
    except InvalidStatus as refused:
        answer = refused.response
        kept = [
            (name.lower().encode(), value.encode("latin-1", "replace"))
            for name, value in answer.headers.raw_items()
            if name.lower() in ("content-type", "retry-after") or name.lower().startswith("x-")
        ]
        raise _Refused(answer.status_code, bytes(answer.body or b""), kept) from refused
    except (OSError, TimeoutError, WebSocketException) as failed:
        raise UpstreamUnreachable(
            f"The upstream's WebSocket could not be opened: {failed}"
        ) from failed


def _handshake_headers(upstream: ClientConnection) -> list[tuple[bytes, bytes]]:
    """The upstream's handshake answer's own headers, for the client's (Codex reads
    ``x-codex-turn-state`` and the model headers there)."""
    answer = upstream.response
    if answer is None:
        return []
    return [
        (name.lower().encode(), value.encode("latin-1", "replace"))
        for name, value in answer.headers.raw_items()
        if name.lower() not in _NOT_RELAYED and not name.lower().startswith("sec-websocket-")
    ]


async def _deny(
    socket: WebSocket[Any, Any, Any],
    status: int,
    body: bytes,
    headers: list[tuple[bytes, bytes]],
) -> None:
    """Refuse the handshake with an HTTP answer (the ASGI WebSocket denial response)."""
    if socket.connection_state == "init":
        await socket.receive()  # the connection request
    start: WebSocketResponseStartEvent = {
        "type": "websocket.http.response.start",
        "status": status,
        "headers": headers,
    }
    await socket.send(start)
    end: WebSocketResponseBodyEvent = {
        "type": "websocket.http.response.body",
        "body": body,
        "more_body": False,
    }
    await socket.send(end)


def _detail(error: GatewayError) -> dict[str, Any]:
    return {"type": error.type, "code": error.code, "message": error.message, "param": error.param}


@dataclass(slots=True)
class _Response:
    """One response on the connection, from its ``response.create`` to its last event."""

    record: RequestRecord
    chat: ChatRequest | None
    started: float
    sent_at: float
    lease: Lease | None
    shedding: bool
    history: list[Any] | None = None
    """The whole input as the client sees it (its own items, never the gateway's
    compaction), when the response can be continued on this connection."""
    output: list[Any] = field(default_factory=list)
    """The output items streamed so far (``response.output_item.done``)."""
    sent: bool = False
    """Whether it went up (until then no event can be its own)."""
    begun: bool = False
    """Whether the upstream began it (``response.created``): an ``error`` event after that
    is not its end."""


class _Connection:
    """One client's connection and its upstream's."""

    def __init__(
        self,
        gateway: Gateway,
        socket: WebSocket[Any, Any, Any],
        headers: dict[str, str],
        caller: Caller,
        access: AccessLog | None,
        upstream: ClientConnection,
    ) -> None:
        self.gateway, self.socket, self.headers = gateway, socket, headers
        self.caller, self.access = caller, access
        self.upstream = upstream
        self.pending: deque[_Response] = deque()
        self.idle = asyncio.Event()
        """Set while no response is in flight."""
        self.idle.set()
        self.histories: dict[str, list[Any]] = {}
        """Each recent response's whole history (input and output), by its id: what a
        ``previous_response_id`` on this connection continues."""
        self.closed = False
        self.heard = time.monotonic()
        """When the upstream last sent anything (or a response went up)."""
        self._group: anyio.abc.TaskGroup | None = None

    async def serve(self) -> None:
        try:
            async with anyio.create_task_group() as group:
                self._group = group
                group.start_soon(self._until_drained)
                group.start_soon(self._from_upstream, self.upstream)
                group.start_soon(self._until_silent)
                await self._from_client()
                group.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self._close_upstream()
                for response in list(self.pending):
                    await self._finish(response, 499, None)

    async def _until_drained(self) -> None:
        """Once the gateway drains, close the connection when no response is in flight
        (at once when idle, else after the last event of the one running)."""
        await self.gateway.draining.begun()
        await self.idle.wait()
        await self.shut(ShuttingDown("The gateway is shutting down; connect again."), told=False)
        assert self._group is not None
        self._group.cancel_scope.cancel()

    async def _until_silent(self) -> None:
        """End the connection when the upstream has said nothing for ``read_timeout``
        while a response waits: an ``error`` event (504) and a close with 1011."""
        timeout = self.gateway.settings.upstream.read_timeout
        while True:
            await anyio.sleep(min(1.0, timeout / 4))
            waiting = any(response.sent for response in self.pending)
            if waiting and time.monotonic() - self.heard > timeout:
                error = UpstreamTimeout(
                    f"The upstream sent nothing for {timeout:g} s.", code="upstream_timeout"
                )
                with anyio.CancelScope(shield=True):
                    await self._refuse(error, None)
                    for response in list(self.pending):
                        await self._finish(response, error.status, None)
                    await self._close_client(_INTERNAL, "upstream timeout")
                assert self._group is not None
                self._group.cancel_scope.cancel()
                return

    # -- the client's side -------------------------------------------------------------

    async def _from_client(self) -> None:
        from websockets.exceptions import ConnectionClosed

        limit = self.gateway.settings.max_body_bytes
        while True:
            event = await self.socket.receive()
            if event["type"] != "websocket.receive":
                self.closed = True
                return
            found = event.get("text")
            if found is None:  # a binary frame: its UTF-8 text
                found = (event.get("bytes") or b"").decode("utf-8", "replace")
            text: str = found
            if len(text) > limit:
                await self._refuse(
                    PayloadTooLarge(f"The message is larger than {limit:,} bytes."), None
                )
                continue
            try:
                message = orjson.loads(text)
            except orjson.JSONDecodeError:
                message = None
            create = isinstance(message, dict) and message.get("type") == "response.create"
            if create and self.gateway.draining.started:
                # No new response; the one in flight (if any) ends first, then the close.
                await self._refuse(ShuttingDown("The gateway is shutting down."), None)
                if self.idle.is_set():
                    await self.shut(ShuttingDown("The gateway is shutting down."), told=False)
                    return
                continue
            try:
                if create:
                    assert isinstance(message, dict)
                    await self._create(message, text)
                else:
                    await self.upstream.send(text)
            except ConnectionClosed:
                # The upstream is closing: its close is the client's.
                upstream = self.upstream
                await self._close_client(
                    upstream.close_code or _INTERNAL, upstream.close_reason or ""
                )
                return

    async def _create(self, message: dict[str, Any], text: str) -> None:
        """A ``response.create``: admitted, compacted, sent up."""
        from websockets.exceptions import ConnectionClosed

        record = RequestRecord(new_request_id())
        record.caller = self.caller
        response = _Response(record, None, perf_counter(), time.time(), None, False)
        # Pending from the start: whatever ends the connection meanwhile gives its slots
        # back (``serve``).
        self.pending.append(response)
        self.idle.clear()
        try:
            await self._admit(response)
            asked = {key: value for key, value in message.items() if key != "type"}
            body = self._whole(asked)
            rebuilt = body is not asked
            inbound = from_body(body)
            if not inbound.stateful:
                response.history = input_items(body.get("input"))
            record.read(inbound.chat)
            call = Call(self.headers, self.caller, record, _never, response.started)
            chat = response.chat = await compacted(self.gateway, call, inbound, restore_tool=False)
            record.report, record.attempts, record.chat = chat.result.report, 1, chat
            preferred = with_preferred(inbound, chat)
            if chat.result.changed or rebuilt or preferred is not inbound:
                sent = to_request(chat.result.request, preferred.native, inbound.messages)
                text = orjson.dumps({"type": "response.create", **sent}).decode()
            response.sent_at = time.time()
            response.sent = True
            self.heard = time.monotonic()
            await self.upstream.send(text)
        except GatewayError as refused:
            await self._refuse(refused, response)
        except ConnectionClosed:
            await self._finish(response, 502, None)
            raise
        except Exception:
            log.exception("a response.create failed", extra={"request_id": record.request_id})
            await self._refuse(GatewayError("The gateway failed this request."), response)

    def _whole(self, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` with the whole history when it continues a response of this
        connection (``previous_response_id``, as Codex sends every request after its
        first): that response's input and output, then the new items, stateless. The
        gateway sees all, so compacts all; the upstream gets what it would hold.
        ``body`` itself otherwise."""
        previous = body.get("previous_response_id")
        history = self.histories.get(previous) if isinstance(previous, str) else None
        if history is None or body.get("conversation") is not None:
            return body
        if body.get("store") is False and not all(_replayable(item) for item in history):
            return body  # reasoning sent back by id only, which store=false did not keep
        whole = {key: value for key, value in body.items() if key != "previous_response_id"}
        whole["input"] = [*history, *input_items(body.get("input"))]
        return whole

    async def _admit(self, response: _Response) -> None:
        """The process's load, then the caller's limits, for one response."""
        gateway = self.gateway
        refusal = gateway.shedder.admit()
        if refusal is not None:
            raise refusal
        response.shedding = True
        tenant = self.caller.tenant
        key = "t:" + tenant if tenant is not None else namespace_id(self.caller.namespace)
        limits = self.caller.profile.limits
        response.lease = await gateway.limiter.admit(key, tenant or "passthrough", limits)

    async def _refuse(self, error: GatewayError, response: _Response | None) -> None:
        """An ``error`` event for a request the gateway would not send; the response (if
        any) counted and logged with the error's status."""
        detail = _detail(error)
        event = {"type": "error", "status": error.status, "error": detail}
        await self._to_client(orjson.dumps(event).decode())
        if response is not None:
            await self._finish(response, error.status, None, error_body=envelope_of(error))

    async def shut(self, error: GatewayError, *, told: bool = True) -> None:
        """Close with 1001 (going away) and ``error``'s message as the reason; ``told``:
        first an ``error`` event, for a response that will not be answered."""
        if self.closed:
            return
        with anyio.CancelScope(shield=True):
            if told:
                await self._refuse(error, None)
            await self._close_client(_GOING_AWAY, error.message[:120])

    async def _to_client(self, text: str) -> None:
        if self.closed:
            return
        try:
            await self.socket.send_text(text)
        except (WebSocketDisconnect, RuntimeError, OSError):
            self.closed = True

    async def _close_client(self, code: int, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        from websockets.exceptions import WebSocketException

        with contextlib.suppress(RuntimeError, OSError, WebSocketException, WebSocketDisconnect):
            await self.socket.close(code=_sendable(code), reason=reason[:120])

    # -- the upstream's side -----------------------------------------------------------

    async def _from_upstream(self, upstream: ClientConnection) -> None:
        """Every server event to the client, in order; the upstream's close relayed."""
        from websockets.exceptions import ConnectionClosed

        try:
            async for message in upstream:
                self.heard = time.monotonic()
                text = message if isinstance(message, str) else message.decode("utf-8", "replace")
                await self._to_client(text)
                if self.pending and self.pending[0].sent:
                    await self._ended(text)
        except ConnectionClosed:
            pass
        code = upstream.close_code or _INTERNAL
        reason = upstream.close_reason or ""
        for response in list(self.pending):
            await self._finish(response, 502, None)
        await self._close_client(code, reason)
        assert self._group is not None
        self._group.cancel_scope.cancel()

    async def _ended(self, text: str) -> None:
        """The oldest response's end, when ``text`` is its last event (its output items
        noted on the way)."""
        head, response = text[:200], self.pending[0]
        if '"response.created"' in head:
            response.begun = True
            return
        noted = '"response.output_item.done"' in head and response.history is not None
        if not noted and not any(f'"{kind}"' in head for kind in _ENDS):
            return
        try:
            event = orjson.loads(text)
        except orjson.JSONDecodeError:
            return  # not an event: relayed, read no further
        if not isinstance(event, dict):
            return
        kind = event.get("type")
        if kind == "response.output_item.done" and response.history is not None:
            item = event.get("item")
            if isinstance(item, dict):
                response.output.append(item)
            return
        if kind not in _ENDS or (kind == "error" and response.begun):
            return
        found = response_of(text.encode())
        usage = chat_usage(found.get("usage")) if found is not None else None
        answer_id = found.get("id") if found is not None else None
        if kind == "error":
            found_status = event.get("status")
            status = found_status if isinstance(found_status, int) else 502
            error = orjson.dumps({"error": event.get("error")})
            await self._finish(response, status, None, error_body=error)
            return
        if response.history is not None and isinstance(answer_id, str) and found is not None:
            output = found.get("output")
            made = output if isinstance(output, list) and output else response.output
            self._keep(answer_id, [*response.history, *made])
        await self._finish(response, 200, usage, answer_id=answer_id)

    def _keep(self, response_id: str, history: list[Any]) -> None:
        """Remember a response's whole history for the next one to continue (the few
        latest: a client continues the last, or one just before it)."""
        self.histories[response_id] = history
        while len(self.histories) > _HISTORIES:
            del self.histories[next(iter(self.histories))]

    async def _close_upstream(self) -> None:
        await self.upstream.close()

    # -- accounting --------------------------------------------------------------------

    async def _finish(
        self,
        response: _Response,
        status: int,
        usage: dict[str, Any] | None,
        *,
        answer_id: Any = None,
        error_body: bytes | None = None,
    ) -> None:
        """A response over: its slots given back, its usage in the conversation's record,
        its metrics and its log line (shielded: a close meanwhile must not strand them)."""
        with anyio.CancelScope(shield=True):
            await self._finished(response, status, usage, answer_id, error_body)

    async def _finished(
        self,
        response: _Response,
        status: int,
        usage: dict[str, Any] | None,
        answer_id: Any,
        error_body: bytes | None,
    ) -> None:
        if response in self.pending:
            self.pending.remove(response)
        if not self.pending:
            self.idle.set()
        record, chat = response.record, response.chat
        if chat is not None and status == 200:
            cause = note_cache_break(self.gateway.metrics, chat, usage)
            record.answered, record.usage, record.cache_break = True, usage, cause
            found = answer_id if isinstance(answer_id, str) else None
            state = chat.result.state.answered(at=response.sent_at, usage=usage, answer_id=found)
            self.gateway.remember(chat.namespace, chat.conversation, state)
        if response.shedding:
            response.shedding = False
            self.gateway.shedder.release()
        if response.lease is not None:
            await response.lease.release()
        if self.access is not None:
            exchange = Exchange("WS", ROUTE, ROUTE, status, INVALID_SPAN_CONTEXT, error_body)
            self.access.record(record, exchange, perf_counter() - response.started)


def _sendable(code: int) -> int:
    """A close code that may be sent in a close frame: 1005 (none given) as 1000, 1006
    and 1015 (no frame, TLS) and anything out of range as 1011."""
    if code == 1005:
        return 1000
    if code in (1006, 1015) or not (1000 <= code <= 4999) or 1016 <= code < 3000:
        return _INTERNAL
    return code


def _replayable(item: Any) -> bool:
    """Whether an item of a kept history may go up again stateless: a reasoning item only
    with its ``encrypted_content`` (by id alone it is found only where it was stored)."""
    if isinstance(item, dict) and item.get("type") == "reasoning":
        return isinstance(item.get("encrypted_content"), str)
    return True


async def _never() -> HTTPDisconnectEvent:
    """A ``receive`` that never reports a disconnect: on a WebSocket the connection's own
    messages are read by the route, and its close ends the whole connection."""
    await anyio.sleep_forever()
    raise AssertionError("unreachable")
