"""``GET /v1/responses`` as a WebSocket: the openai SDK's ``responses.connect()`` through
the gateway to the mock upstream's WebSocket, each ``response.create`` through the
pipeline, every event back in order, closes relayed both ways."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest
import websockets
from websockets.exceptions import ConnectionClosedError, InvalidStatus

from gateway.config import TenantSettings
from gateway.tenancy.tenants import hash_key
from tests.conftest import settings_for
from tests.gateway.telemetry.test_metrics import scrape, scrape_when, total
from tests.harness import GatewayServer
from tests.mock_upstream import (
    MockUpstream,
    WSClose,
    WSReject,
    WSReply,
    function_call_item,
    message_item,
    reasoning_item,
    response_body,
    response_events,
    response_usage,
)

BIG_LOG = "".join(f"step {i}: compiled module_{i}.py in {i % 97} ms\n" for i in range(6000))


def answer(text: str, **usage: int) -> WSReply:
    body = response_body("gpt-4o", [message_item(text)], usage=response_usage(**usage))
    return WSReply(response_events(body))


@pytest.fixture
async def client(gateway: GatewayServer) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=gateway.base_url, api_key="sk-test") as client:
        yield client


async def until_done(connection: Any) -> list[Any]:
    events = []
    async for event in connection:
        events.append(event)
        if event.type in ("response.completed", "response.failed", "error"):
            return events
    return events


def sent(upstream: MockUpstream) -> list[dict[str, Any]]:
    """The ``response.create`` messages that reached the mock, in order."""
    return [received.json() for received in upstream.received if received.method == "WS"]


async def test_each_response_goes_through_the_pipeline_and_its_events_come_back_in_order(
    client: openai.AsyncOpenAI, upstream: MockUpstream
) -> None:
    first = response_body("gpt-4o", [message_item("one")], id="resp_1")
    upstream.push(WSReply(response_events(first)), answer("two"))
    items = [
        {"role": "user", "content": "Build it."},
        reasoning_item("rs_1", encrypted_content="gAAAA-secret"),
        function_call_item("shell", '{"cmd":"make"}', call_id="call_1", id="fc_1"),
        {"type": "function_call_output", "call_id": "call_1", "output": BIG_LOG},
    ]
    async with client.responses.connect() as connection:
        await connection.response.create(model="gpt-4o", input="Hi", store=False)
        events = [orjson.loads(await connection.recv_bytes()) for _ in response_events(first)]
        await connection.response.create(model="gpt-4o", input=items, store=False)
        second = await until_done(connection)
    # Every event the upstream sent, as it sent it, in order.
    assert events == response_events(first)
    assert second[-1].response.output_text == "two"
    one, two = sent(upstream)
    assert one == {"type": "response.create", "model": "gpt-4o", "input": "Hi", "store": False}
    # The big output was offloaded behind a preview naming its ref; the reasoning item and
    # the call went up untouched.
    output = two["input"][3]["output"]
    assert len(output) < len(BIG_LOG) // 10
    ref = re.search(r"ctx_[A-Za-z0-9_-]{22,}", output)
    assert ref is not None
    assert two["input"][1] == items[1]
    assert two["input"][2] == items[2]
    async with httpx.AsyncClient() as http:
        stored = await http.get(
            f"{client.base_url}context/objects/{ref.group()}",
            headers={"authorization": "Bearer sk-test"},
        )
    assert stored.content.decode() == BIG_LOG
    # One upstream connection for the client's one, with the client's beta header.
    assert len(upstream.websockets) == 1


async def test_a_request_the_gateway_refuses_gets_an_error_event_and_the_connection_stays(
    client: openai.AsyncOpenAI, upstream: MockUpstream
) -> None:
    upstream.push(answer("fine"))
    async with client.responses.connect() as connection:
        await connection.send({"type": "response.create", "model": "gpt-4o", "input": 5})  # type: ignore[typeddict-item]
        refused = await until_done(connection)
        await connection.response.create(model="gpt-4o", input="Hi")
        events = await until_done(connection)
    assert refused[-1].type == "error"
    assert refused[-1].error.code == "invalid_type"
    assert refused[-1].error.param == "input"
    assert refused[-1].status == 400
    assert events[-1].response.output_text == "fine"
    assert len(sent(upstream)) == 1  # the refused one never went up


async def test_the_upstreams_close_code_reaches_the_client(
    client: openai.AsyncOpenAI, upstream: MockUpstream
) -> None:
    body = response_body("gpt-4o", [message_item("bye")])
    upstream.push(WSReply(response_events(body), close=WSClose(1011, "upstream broke")))
    with pytest.raises(ConnectionClosedError) as closed:
        async with client.responses.connect() as connection:
            await connection.response.create(model="gpt-4o", input="Hi")
            await until_done(connection)
            await connection.recv()
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1011
    assert closed.value.rcvd.reason == "upstream broke"


async def test_a_client_that_leaves_closes_the_upstream_connection(
    client: openai.AsyncOpenAI, upstream: MockUpstream
) -> None:
    upstream.push(answer("hello"))
    async with client.responses.connect() as connection:
        await connection.response.create(model="gpt-4o", input="Hi")
        await until_done(connection)
    session = upstream.websockets[0]
    assert await asyncio.to_thread(session.wait_closed, 5)
    assert session.closed_by == "client"


async def test_an_upstream_that_refuses_the_handshake_refuses_the_clients(
    client: openai.AsyncOpenAI, upstream: MockUpstream
) -> None:
    """The upstream's connection is opened with the client's, so its refusal (a bad key,
    say) is the client's handshake answer, status and body, as without the gateway."""
    upstream.push(WSReject({"error": {"message": "bad key"}}, status=401))
    with pytest.raises(InvalidStatus) as refused:
        async with client.responses.connect() as connection:
            await connection.response.create(model="gpt-4o", input="Hi")
    assert refused.value.response.status_code == 401
    assert b"bad key" in refused.value.response.body


async def test_usage_feeds_the_conversation_and_each_response_is_counted(
    client: openai.AsyncOpenAI, upstream: MockUpstream, gateway: GatewayServer
) -> None:
    counted = {"route": "/v1/responses", "status": "200", "model": "gpt-4o"}
    before = total(
        await asyncio.to_thread(scrape, gateway), "contextgate_requests_total", **counted
    )
    upstream.push(answer("a", input_tokens=2000), answer("b", input_tokens=2100))
    history: list[Any] = [{"role": "user", "content": "Tell me about caching. " * 500}]
    async with client.responses.connect() as connection:
        await connection.response.create(model="gpt-4o", input=history, store=False)
        await until_done(connection)
        history += [message_item("a"), {"role": "user", "content": "More."}]
        await connection.response.create(model="gpt-4o", input=history, store=False)
        await until_done(connection)
    one, two = sent(upstream)
    # The gateway keys the conversation's prompt cache the same on both turns.
    assert one["prompt_cache_key"] == two["prompt_cache_key"]
    samples = await asyncio.to_thread(
        scrape_when,
        gateway,
        lambda s: total(s, "contextgate_requests_total", **counted) >= before + 2,
    )
    assert total(samples, "contextgate_requests_total", **counted) == before + 2


@pytest.fixture
def tenant_gateway(upstream: MockUpstream) -> Iterator[GatewayServer]:
    tenant = TenantSettings(
        "team", (hash_key("cg-team-1"), hash_key("cg-team-2")), upstream_api_key="sk-team-upstream"
    )
    with GatewayServer(settings_for(upstream, tenants=(tenant,))) as server:
        yield server


async def test_without_a_valid_key_the_handshake_is_refused(
    tenant_gateway: GatewayServer, upstream: MockUpstream
) -> None:
    url = tenant_gateway.base_url.replace("http", "ws", 1) + "/responses"
    with pytest.raises(InvalidStatus) as refused:
        async with websockets.connect(url, additional_headers={"authorization": "Bearer nope"}):
            pass
    assert refused.value.response.status_code == 401
    assert orjson.loads(refused.value.response.body)["error"]["code"] == "invalid_api_key"
    assert upstream.websockets == []


async def test_one_connection_goes_up_under_the_tenants_one_key(
    tenant_gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """Encrypted items decrypt only under the key that made them: whichever gateway key a
    client uses, its conversation goes up under the tenant's upstream key."""
    upstream.push(answer("one"), answer("two"))
    for key in ("cg-team-1", "cg-team-2"):
        client = openai.AsyncOpenAI(base_url=tenant_gateway.base_url, api_key=key)
        async with client, client.responses.connect() as connection:
            await connection.response.create(model="gpt-4o", input="Hi", store=False)
            await until_done(connection)
    keys = {session.handshake.headers.get("authorization") for session in upstream.websockets}
    assert keys == {"Bearer sk-team-upstream"}


async def test_a_response_continued_on_the_connection_goes_up_whole_and_is_compacted(
    client: openai.AsyncOpenAI, upstream: MockUpstream
) -> None:
    """Codex sends each request after its first with ``previous_response_id`` and only the
    new items: the gateway rebuilds the whole history it saw on the connection, compacts
    it, and sends it stateless; an id it never saw is relayed as it came."""
    call = function_call_item("shell", '{"cmd":"make"}', call_id="call_1", id="fc_1")
    reasoning = reasoning_item("rs_1", encrypted_content="gAAAA-secret")
    first = response_body("gpt-4o", [reasoning, call], id="resp_1")
    upstream.push(WSReply(response_events(first)), answer("built"), answer("elsewhere"))
    output = {"type": "function_call_output", "call_id": "call_1", "output": BIG_LOG}
    async with client.responses.connect() as connection:
        await connection.response.create(model="gpt-4o", input="Build it.", store=False)
        await until_done(connection)
        await connection.response.create(
            model="gpt-4o", input=[output], previous_response_id="resp_1", store=False
        )
        await until_done(connection)
        await connection.response.create(
            model="gpt-4o", input="Hi", previous_response_id="resp_stored"
        )
        await until_done(connection)
    _, whole, stored = sent(upstream)
    assert "previous_response_id" not in whole
    assert [item.get("type") for item in whole["input"]] == [
        None,
        "reasoning",
        "function_call",
        "function_call_output",
    ]
    assert whole["input"][1:3] == [reasoning, call]
    assert len(whole["input"][3]["output"]) < len(BIG_LOG) // 10  # offloaded
    assert stored["previous_response_id"] == "resp_stored"
    assert stored["input"] == "Hi"


async def test_a_failure_inside_the_gateway_is_an_error_event_and_frees_the_callers_slot(
    upstream: MockUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fault of the gateway's own while it prepares a response (injected here into the
    compaction) is an ``error`` event, as over HTTP a 500 is: the connection stays, and the
    caller's concurrency slot taken for that response is given back."""
    from gateway.config import LimitSettings
    from gateway.routes import responses_socket

    tenant = TenantSettings(
        "solo",
        (hash_key("cg-solo"),),
        upstream_api_key="sk-solo-upstream",
        limits=LimitSettings(concurrency=1),
    )
    real = responses_socket.compacted
    failures = iter([RuntimeError("a bug")])

    async def faulty(*args: Any, **kwargs: Any) -> Any:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return await real(*args, **kwargs)

    monkeypatch.setattr(responses_socket, "compacted", faulty)
    upstream.push(answer("after the fault"), answer("on a new connection"))
    with GatewayServer(settings_for(upstream, tenants=(tenant,))) as server:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="cg-solo")
        async with client, client.responses.connect() as connection:
            await connection.response.create(model="gpt-4o", input="Hi")
            failed = await until_done(connection)
            await connection.response.create(model="gpt-4o", input="Hi")
            after = await until_done(connection)
        async with client.responses.connect() as again:
            await again.response.create(model="gpt-4o", input="Hi")
            fresh = await until_done(again)
    assert failed[-1].type == "error"
    assert failed[-1].status == 500
    assert after[-1].response.output_text == "after the fault"
    assert fresh[-1].response.output_text == "on a new connection"
