"""``GET /v1/responses`` as a WebSocket when something goes wrong: an upstream that drops,
hangs, garbles a frame, closes as the client sends or answers another message with an
``error`` event; a client that leaves mid-handshake, sends a binary frame or a message as
large as a body or leaves right after its last event; the drain and a close arriving
while a response is being prepared. Each response holds its slots (the shedder's, the
tenant's lease) from admission and gives them back however the connection ends."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

import httpx
import orjson
import pytest
import redis.asyncio as aioredis
import websockets
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

import gateway.routes.responses_socket as responses_socket
import gateway.tenancy.limits as limits
from gateway.config import LimitSettings, Settings, TenantSettings, UpstreamSettings
from gateway.tenancy.tenants import hash_key
from tests.conftest import settings_for
from tests.harness import GatewayServer
from tests.mock_models import ResponsesModel
from tests.mock_upstream import (
    Hang,
    MockUpstream,
    SSEReply,
    WSClose,
    WSReply,
    message_item,
    reasoning_item,
    response_body,
    response_events,
    sse_of_events,
)

TEAM_KEY = "cg-team-1"


def ws_url(gateway: GatewayServer) -> str:
    return gateway.base_url.replace("http", "ws", 1) + "/responses"


def connect(gateway: GatewayServer, key: str = "sk-test", **options: Any) -> websockets.connect:
    return websockets.connect(
        ws_url(gateway), additional_headers={"authorization": f"Bearer {key}"}, **options
    )


def create(**body: Any) -> str:
    """A ``response.create`` message (``gpt-4o``, ``Hi`` unless given)."""
    body.setdefault("model", "gpt-4o")
    body.setdefault("input", "Hi")
    return orjson.dumps({"type": "response.create", **body}).decode()


ENDS = ("response.completed", "response.failed", "response.incomplete", "error")


async def until_end(ws: ClientConnection, timeout: float = 5) -> list[dict[str, Any]]:
    """The events up to a response's last (completed, failed, incomplete or error)."""
    events = []
    while True:
        event = orjson.loads(await asyncio.wait_for(ws.recv(), timeout))
        events.append(event)
        if event["type"] in ENDS:
            return events


async def until_closed(
    ws: ClientConnection, timeout: float = 5
) -> tuple[list[str], ConnectionClosed]:
    """The frames received until the connection closed, and its close."""
    frames: list[str] = []
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            frames.append(str(await asyncio.wait_for(ws.recv(), timeout)))
    return frames, closed.value


def sent(upstream: MockUpstream) -> list[Any]:
    """The client messages that reached the mock's WebSocket, in order."""
    return [received.json() for received in upstream.received if received.method == "WS"]


async def eventually(condition: Callable[[], bool], what: str, timeout: float = 5) -> None:
    """Wait until ``condition`` holds (the gateway runs on its own thread)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.02)


class LoopCatcher:
    """An ASGI wrapper that remembers the gateway's event loop, to run things on it."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.loop: asyncio.AbstractEventLoop | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.loop = asyncio.get_running_loop()
        await self.app(scope, receive, send)


@pytest.fixture
def team(upstream: MockUpstream) -> Iterator[tuple[GatewayServer, LoopCatcher]]:
    """A gateway of its own, for one tenant allowed one response at once (``TEAM_KEY``)."""
    tenant = TenantSettings(
        "team",
        (hash_key(TEAM_KEY),),
        upstream_api_key="sk-team-upstream",
        limits=LimitSettings(concurrency=1),
    )
    caught: list[LoopCatcher] = []

    def wrap(app: Any) -> LoopCatcher:
        caught.append(LoopCatcher(app))
        return caught[0]

    with GatewayServer(settings_for(upstream, tenants=(tenant,)), wrap=wrap) as server:
        yield server, caught[0]


def begin_drain(server: GatewayServer, caught: LoopCatcher) -> None:
    """Begin the drain (as SIGTERM does) on the gateway's loop."""
    draining = server.app.state.gateway.draining
    assert caught.loop is not None
    caught.loop.call_soon_threadsafe(draining.begin, 30.0)


def slots_free(server: GatewayServer) -> bool:
    """Whether no response holds a shedder slot nor the tenant's lease."""
    gateway = server.app.state.gateway
    return gateway.shedder.in_flight == 0 and not gateway.limiter._busy.get("t:team")


# -- the upstream's faults -------------------------------------------------------------------


async def test_an_upstream_that_drops_mid_response_closes_the_client_with_1011(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """An upstream connection that drops (TCP abort, no close frame) has no close code to
    relay (1006 may not be sent): the client gets what came, then a close with 1011, not
    4500."""
    events = response_events(response_body("gpt-4o", [message_item("half")]))
    upstream.push(SSEReply(sse_of_events(events[:3]), ending="drop"))
    async with connect(gateway) as ws:
        await ws.send(create())
        frames, closed = await until_closed(ws)
    assert [orjson.loads(frame) for frame in frames] == events[:3]
    assert closed.rcvd is not None
    assert closed.rcvd.code == 1011


async def test_an_upstream_that_never_answers_is_ended_by_the_read_timeout(
    upstream: MockUpstream,
) -> None:
    """Over the WebSocket as over HTTP, an upstream silent for ``read_timeout`` while a
    response waits ends it: an ``error`` event (504), a close with 1011, its slot given
    back."""
    upstream.push(Hang())
    with GatewayServer(settings_for(upstream, read_timeout=1.0)) as server:
        async with connect(server) as ws:
            await ws.send(create())
            events = await until_end(ws)
            _, closed = await until_closed(ws)
        await eventually(lambda: slots_free(server), "the shedder slot given back")
    assert events[-1]["type"] == "error"
    assert events[-1]["status"] == 504
    assert closed.rcvd is not None
    assert closed.rcvd.code == 1011


async def test_a_garbled_upstream_frame_is_relayed_and_the_response_goes_on(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """A frame that is not JSON (here cut short, and looking like a response's end) is
    relayed as it came and read no further: the response goes on to its real end."""
    events = response_events(response_body("gpt-4o", [message_item("ok")]))
    garbled = '{"type":"response.completed","sequence_number":9,"response":{"id":"resp_x"'
    upstream.push(WSReply([*events[:-1], garbled, events[-1]]))
    async with connect(gateway) as ws:
        await ws.send(create())
        frames = [await asyncio.wait_for(ws.recv(), 5) for _ in range(len(events) + 1)]
        await ws.send(create())
        after = await until_end(ws)
    assert frames[-2] == garbled
    assert orjson.loads(frames[-1]) == events[-1]
    assert after[-1]["type"] == "response.completed"


class ConcurrentUpstream:
    """An upstream that reads every client message as it comes (as the API does:
    ``response.steer`` exists), answers one it cannot parse at once with an ``error``
    event, and streams each response slowly."""

    def __init__(self) -> None:
        self.creates: list[dict[str, Any]] = []
        self._streams: set[asyncio.Task[None]] = set()

    async def handle(self, ws: ServerConnection) -> None:
        async for text in ws:
            try:
                event = orjson.loads(text)
            except orjson.JSONDecodeError:
                error = {
                    "type": "invalid_request_error",
                    "code": "invalid_json",
                    "message": "The event could not be parsed.",
                    "param": None,
                }
                await ws.send(
                    orjson.dumps({"type": "error", "status": 400, "error": error}).decode()
                )
                continue
            if event.get("type") == "response.create":
                self.creates.append(event)
                answer = response_body(
                    "gpt-4o", [message_item("ok")], id=f"resp_{len(self.creates)}"
                )
                stream = asyncio.ensure_future(self._stream(ws, response_events(answer)))
                self._streams.add(stream)
                stream.add_done_callback(self._streams.discard)

    @staticmethod
    async def _stream(ws: ServerConnection, events: list[dict[str, Any]]) -> None:
        for event in events:
            await ws.send(orjson.dumps(event).decode())
            await asyncio.sleep(0.05)


@pytest.fixture
async def concurrent() -> AsyncIterator[tuple[ConcurrentUpstream, str]]:
    """A ``ConcurrentUpstream`` and its base URL."""
    upstream = ConcurrentUpstream()
    async with serve(upstream.handle, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield upstream, f"http://127.0.0.1:{port}/v1"


async def test_an_error_event_for_another_message_does_not_end_the_response_in_flight(
    concurrent: tuple[ConcurrentUpstream, str],
) -> None:
    """An ``error`` event after the upstream began a response answers something else (a
    bad message of the client's): it is relayed, and the response runs on to its end, its
    history kept, so the next ``previous_response_id`` continuing it goes up whole."""
    upstream, base_url = concurrent
    settings = Settings(upstream=UpstreamSettings(base_url=base_url), summaries=False)
    with GatewayServer(settings) as gateway:
        async with connect(gateway) as ws:
            await ws.send(create(input="first", store=False))
            first = [orjson.loads(await asyncio.wait_for(ws.recv(), 5))]  # begun
            await ws.send("{not json")  # a client's bug, a truncated frame...
            first += await until_end(ws)
            if first[-1]["type"] == "error":  # the stray error, relayed
                first += await until_end(ws)
            await ws.send(create(input="second", store=False, previous_response_id="resp_1"))
            await until_end(ws)
    assert [event["type"] for event in first].count("error") == 1
    assert first[-1]["type"] == "response.completed"
    second = upstream.creates[1]
    assert "previous_response_id" not in second
    assert [item.get("role") for item in second["input"]] == ["user", "assistant", "user"]


async def test_a_message_sent_as_the_upstream_closes_gets_the_upstreams_close(
    gateway: GatewayServer, upstream: MockUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message that goes up after the upstream's connection closed (the relay not yet
    aware of the close, on a loaded event loop) ends the client's connection with the
    upstream's close code, not a 4500 of the gateway's."""
    real_compacted = responses_socket.compacted
    real_relay = responses_socket._Connection._from_upstream

    async def compacted(*args: Any, **kwargs: Any) -> Any:
        result = await real_compacted(*args, **kwargs)
        await asyncio.to_thread(upstream.websockets[-1].wait_closed, 5)
        return result

    async def late_relay(self: Any, connection: Any) -> None:
        await connection.wait_closed()
        await asyncio.sleep(1.0)  # notices the close a second late
        await real_relay(self, connection)

    monkeypatch.setattr(responses_socket, "compacted", compacted)
    monkeypatch.setattr(responses_socket._Connection, "_from_upstream", late_relay)
    upstream.handler = lambda received: WSClose(1001, "server restarting")
    async with connect(gateway) as ws:
        await ws.send(orjson.dumps({"type": "session.touch"}).decode())  # the upstream closes
        await ws.send(create())  # compacted meanwhile, then sent
        _, closed = await until_closed(ws)
    assert closed.rcvd is not None
    assert closed.rcvd.code == 1001
    assert closed.rcvd.reason == "server restarting"


class ReasoningModel(ResponsesModel):
    """A reasoning model: without ``include: ["reasoning.encrypted_content"]`` its answer
    still leads with a reasoning item, with an id and no encrypted content, as the API's
    does; the history it continues is its own (a connection's cache), so only a request's
    own reasoning items are looked up."""

    def _answer(
        self, body: Mapping[str, Any], whole: list[dict[str, Any]], connection: str | None
    ) -> dict[str, Any]:
        response = super()._answer(body, whole, connection)
        if "reasoning.encrypted_content" not in (body.get("include") or ()):
            item = reasoning_item(f"rs_plain_{len(self.outputs)}", summary=["Thinking."])
            response["output"].insert(0, item)
            history, stored, made_on = self._responses[response["id"]]
            self._responses[response["id"]] = (
                [*whole, item, *history[len(whole) :]],
                stored,
                made_on,
            )
        return response

    def _refused(self, items: Any, body: Mapping[str, Any]) -> str | None:
        previous = body.get("previous_response_id")
        if previous is not None:
            continued = self._responses[previous][0]
            items = [i for i in items if i not in continued or i.get("type") != "reasoning"]
        return super()._refused(items, body)


async def test_a_store_false_response_with_bare_reasoning_is_continued_as_sent(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """Continuing a ``store: false`` response whose reasoning item came without encrypted
    content (the client did not ``include`` it) works through the gateway as it does
    directly: the history is not rebuilt, since the API could not look that item up by id
    ("Items are not persisted when `store` is set to false")."""
    upstream.handler = ReasoningModel()

    async def two_turns(url: str) -> list[dict[str, Any]]:
        headers = {"authorization": "Bearer sk-test"}
        async with websockets.connect(url, additional_headers=headers) as ws:
            await ws.send(create(model="gpt-5", input="Say hi.", store=False))
            previous = (await until_end(ws))[-1]["response"]["id"]
            await ws.send(
                create(model="gpt-5", input="Again.", store=False, previous_response_id=previous)
            )
            return await until_end(ws)

    direct = await two_turns(upstream.ws_url)
    assert direct[-1]["type"] == "response.completed"  # the upstream takes it
    through = await two_turns(ws_url(gateway))
    assert through[-1]["type"] == "response.completed", through[-1]


# -- the client's side -----------------------------------------------------------------------


async def test_a_client_gone_during_the_handshake_leaves_no_upstream_connection() -> None:
    """A client that gives up while the upstream's handshake is slow (its open timeout the
    shorter) is gone when the gateway accepts it: the upstream connection just opened for
    it is closed, not kept open by pings for as long as the upstream allows."""
    opened, closed = threading.Event(), threading.Event()

    async def slow_handshake(connection: ServerConnection, request: Any) -> None:
        await asyncio.sleep(1.0)  # TLS, a far region, load

    async def handle(ws: ServerConnection) -> None:
        opened.set()
        try:
            await ws.wait_closed()
        finally:
            closed.set()

    async with serve(handle, "127.0.0.1", 0, process_request=slow_handshake) as upstream:
        port = next(iter(upstream.sockets)).getsockname()[1]
        settings = Settings(
            upstream=UpstreamSettings(base_url=f"http://127.0.0.1:{port}/v1"), summaries=False
        )
        with GatewayServer(settings) as gateway:
            with pytest.raises((TimeoutError, OSError, websockets.exceptions.WebSocketException)):
                async with connect(gateway, open_timeout=0.3):
                    pass
            await eventually(opened.is_set, "the upstream connection opened")
            await eventually(closed.is_set, "the upstream connection closed", timeout=3)


async def test_a_response_create_in_a_binary_frame_is_answered(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """A client message in a binary frame is read as its UTF-8 text: a ``response.create``
    sent so goes through the pipeline and is answered."""
    async with connect(gateway) as ws:
        await ws.send(create(input="In binary.").encode())
        events = await until_end(ws)
    assert events[-1]["type"] == "response.completed"
    (message,) = sent(upstream)
    assert message["input"] == "In binary."


async def test_a_response_create_as_large_as_a_body_is_handled_as_the_body_is(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """A message over 16 MiB (uvicorn's default cap on a WebSocket message) and within
    ``max_body_bytes`` reaches the route: its answer is the one the same body gets over HTTP
    (here the policy's refusal of so big a turn), and the connection stays."""
    body = {"model": "gpt-4o", "input": [{"role": "user", "content": "x" * (17 * 1024 * 1024)}]}
    assert len(orjson.dumps(body)) < gateway.app.state.gateway.settings.max_body_bytes
    async with connect(gateway, max_size=None) as ws:
        await ws.send(create(**body))
        refused = (await until_end(ws, timeout=30))[-1]
        await ws.send(create())
        after = await until_end(ws)
    async with httpx.AsyncClient(timeout=30) as http:
        twin = await http.post(
            f"{gateway.base_url}/responses",
            json=body,
            headers={"authorization": "Bearer sk-test"},
        )
    assert refused["type"] == "error"
    assert (refused["status"], refused["error"]) == (twin.status_code, twin.json()["error"])
    assert after[-1]["type"] == "response.completed"


# -- slots given back however the connection ends --------------------------------------------


@pytest.fixture
def slow_compaction(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Compaction that takes a second (a summary model near its timeout, a big history);
    the event is set when one begins."""
    real = responses_socket.compacted
    begun = threading.Event()

    async def compacted(*args: Any, **kwargs: Any) -> Any:
        begun.set()
        await asyncio.sleep(1.0)
        return await real(*args, **kwargs)

    monkeypatch.setattr(responses_socket, "compacted", compacted)
    return begun


async def test_an_upstream_closing_during_compaction_gives_the_slots_back(
    team: tuple[GatewayServer, LoopCatcher], upstream: MockUpstream, slow_compaction: Any
) -> None:
    """The upstream's close (its idle or 60-minute limit, say) while a ``response.create``
    is being compacted ends the connection with that close, and the response's shedder
    slot and lease are given back: the tenant's next connection is served."""
    server, _ = team
    upstream.handler = lambda received: WSClose(1001, "going away")  # on a non-create
    async with connect(server, TEAM_KEY) as ws:
        await ws.send(orjson.dumps({"type": "session.touch"}).decode())
        await ws.send(create())
        _, closed = await until_closed(ws)
    assert closed.rcvd is not None
    assert closed.rcvd.code == 1001
    await eventually(lambda: slots_free(server), "the slots given back", timeout=3)
    upstream.handler = None
    async with connect(server, TEAM_KEY) as ws:
        await ws.send(create())
        events = await until_end(ws)
    assert events[-1]["type"] == "response.completed", events[-1]


async def test_a_response_being_compacted_when_the_drain_begins_is_in_flight(
    team: tuple[GatewayServer, LoopCatcher], upstream: MockUpstream, slow_compaction: Any
) -> None:
    """A ``response.create`` still being compacted when the drain begins is in flight, not
    idle: it is answered, then the connection closes with 1001, its slots given back."""
    server, caught = team
    async with connect(server, TEAM_KEY) as ws:
        await ws.send(create())
        assert await asyncio.to_thread(slow_compaction.wait, 5)
        begin_drain(server, caught)
        frames, closed = await until_closed(ws)
    assert orjson.loads(frames[-1])["type"] == "response.completed"
    assert closed.rcvd is not None
    assert closed.rcvd.code == 1001
    await eventually(lambda: slots_free(server), "the slots given back", timeout=3)


async def test_a_message_during_the_drain_does_not_cut_the_response_in_flight(
    team: tuple[GatewayServer, LoopCatcher], upstream: MockUpstream
) -> None:
    """The drain lets the response in flight finish even when the client sends more
    meanwhile (Codex queueing the user's next input as a ``response.steer``): that message
    is relayed, the response answered whole, then the connection closes with 1001."""
    server, caught = team
    events = response_events(response_body("gpt-4o", [message_item("finished in time")]))
    upstream.push(WSReply(events, delay=1.0))
    async with connect(server, TEAM_KEY) as ws:
        await ws.send(create())
        await eventually(lambda: len(sent(upstream)) == 1, "the response sent up")
        begin_drain(server, caught)
        await eventually(lambda: server.app.state.gateway.draining.started, "the drain begun")
        await ws.send(orjson.dumps({"type": "response.steer", "input": "Also X."}).decode())
        frames, closed = await until_closed(ws)
    assert [orjson.loads(frame) for frame in frames] == events
    assert closed.rcvd is not None
    assert closed.rcvd.code == 1001
    assert sent(upstream)[-1] == {"type": "response.steer", "input": "Also X."}


async def test_a_client_leaving_after_its_last_event_leaves_no_lease_in_redis(
    upstream: MockUpstream, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that closes as soon as it has ``response.completed`` (the SDK's ``async
    with connect()`` around one turn) does not cut the release of its response's lease,
    however far Redis is: none stays for ``LEASE_SECONDS``."""
    real = limits.Limiter.release

    async def release(self: limits.Limiter, lease: limits.Lease) -> None:
        await asyncio.sleep(0.05)  # a Redis in another zone
        await real(self, lease)

    monkeypatch.setattr(limits.Limiter, "release", release)
    tenant = TenantSettings(
        "wsredis",
        (hash_key("cg-wsredis-1"),),
        upstream_api_key="sk-wsredis-upstream",
        limits=LimitSettings(concurrency=1),
    )
    busy = "cg:{l:t:wsredis}:busy"
    store = aioredis.from_url(redis_url)
    try:
        settings = settings_for(upstream, tenants=(tenant,), redis_url=redis_url)
        with GatewayServer(settings) as server:
            async with connect(server, "cg-wsredis-1") as ws:
                await ws.send(create())
                await until_end(ws)
            deadline = time.monotonic() + 2
            while await store.zcard(busy) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert await store.zcard(busy) == 0
    finally:
        await store.delete(busy, "cg:{l:t:wsredis}:rate")
        await store.aclose()
