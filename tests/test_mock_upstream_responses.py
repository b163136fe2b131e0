"""The mock upstream speaks the Responses API as the openai SDK expects it: its bodies and
events parse into the SDK's types, over HTTP and over the API's WebSocket mode, and the
WebSocket replies are scripted like the HTTP ones (events, errors, a close code)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pydantic
import pytest
import websockets.version
from openai.types.responses import CompactedResponse, Response, ResponseStreamEvent
from openai.types.responses.response_compaction_item import ResponseCompactionItem
from openai.types.responses.responses_server_event import ResponsesServerEvent
from websockets.exceptions import ConnectionClosedError, InvalidStatus

from tests.mock_upstream import (
    MockUpstream,
    ResponsesRoutes,
    SSEReply,
    WSClose,
    WSReject,
    WSReply,
    custom_tool_call_item,
    function_call_item,
    message_item,
    reasoning_item,
    response_body,
    response_events,
    response_usage,
    sse_of_events,
    ws_error_event,
)

STREAM_EVENT = pydantic.TypeAdapter(ResponseStreamEvent)
SERVER_EVENT = pydantic.TypeAdapter(ResponsesServerEvent)
WEBSOCKETS = tuple(int(part) for part in websockets.version.tag.split(".")[:2])
LEGACY: Any = {"legacy": True} if WEBSOCKETS >= (17, 1) else {}
"""The SDK calls websockets' sync ``connect()`` outside a ``with``, which websockets 17.1
and later warn about (the SDK asks for websockets < 16) unless ``legacy`` is set; earlier
versions neither warn nor know the option (openai-agents keeps websockets below 17)."""


@pytest.fixture
def routes(upstream: MockUpstream) -> ResponsesRoutes:
    upstream.handler = handler = ResponsesRoutes()
    return handler


@pytest.fixture
def client(upstream: MockUpstream) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=upstream.base_url, api_key="sk-test", max_retries=0) as sdk:
        yield sdk


def every_kind() -> dict[str, Any]:
    output = [
        reasoning_item("rs_1", encrypted_content="gAAAA-secret", summary=["Thinking."]),
        message_item("Hello there, you.", "msg_1"),
        function_call_item("get_weather", {"city": "Paris"}, "call_1", "fc_1"),
        custom_tool_call_item("apply_patch", "*** Begin Patch\n*** End Patch", "call_2"),
    ]
    usage = response_usage(100, 30, cached_tokens=64, reasoning_tokens=20)
    return response_body("gpt-5", output, usage=usage)


def test_builders_validate_against_the_sdk_types() -> None:
    """A response with every kind of item is a valid ``Response``; its events are valid
    stream events (over SSE and WebSocket), numbered, in the API's order."""
    response = every_kind()
    parsed = Response.model_validate(response)
    assert parsed.usage is not None
    assert parsed.usage.input_tokens_details.cached_tokens == 64
    assert parsed.usage.output_tokens_details.reasoning_tokens == 20
    events = response_events(response)
    for event in events:
        STREAM_EVENT.validate_python(event)
        SERVER_EVENT.validate_python(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.output_item.done",  # reasoning: added, done
    ]
    assert (events[0]["response"]["output"], events[0]["response"]["usage"]) == ([], None)
    assert events[-1] == {"type": "response.completed", "response": response} | {
        "sequence_number": len(events) - 1
    }
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    arguments = "".join(
        e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"
    )
    assert (text, arguments) == ("Hello there, you.", '{"city":"Paris"}')
    assert kinds.count("response.custom_tool_call_input.done") == 1
    SERVER_EVENT.validate_python(ws_error_event("Previous response not found."))


def test_create_answers_json_and_streams(
    client: openai.OpenAI, routes: ResponsesRoutes, upstream: MockUpstream
) -> None:
    """``responses.create`` parses into a ``Response``; streamed, into the stream events
    ending with the completed response; ``responses.stream`` gathers the same."""
    answer = client.responses.create(model="gpt-4o", input="Hi", instructions="Be brief.")
    assert isinstance(answer, Response)
    assert answer.output_text == "Hello from the mock."
    assert answer.instructions == "Be brief."
    Response.model_validate(routes.responses[answer.id])
    events = list(client.responses.create(model="gpt-4o", input="Hi", stream=True))
    assert events[-1].type == "response.completed"
    assert events[-1].response.usage is not None
    assert upstream.received[-1].json()["stream"] is True
    with client.responses.stream(model="gpt-4o", input="Hi") as stream:
        final = stream.get_final_response()
    assert final.output_text == "Hello from the mock."


def test_compact_and_the_stored_response_routes(
    client: openai.OpenAI, routes: ResponsesRoutes
) -> None:
    """Compaction, retrieval, input items, cancel and delete answer as the SDK expects."""
    compacted = client.responses.compact(
        model="gpt-4o", input=[{"role": "user", "content": "Remember 42."}]
    )
    assert isinstance(compacted, CompactedResponse)
    assert compacted.object == "response.compaction"
    ResponseCompactionItem.model_validate(compacted.output[-1].model_dump())
    assert compacted.usage.total_tokens > 0
    created = client.responses.create(
        model="gpt-4o",
        input=[{"role": "user", "content": "one"}, {"role": "user", "content": "two"}],
    )
    assert client.responses.retrieve(created.id) == created
    items = list(client.responses.input_items.list(created.id, order="asc"))
    assert [item.content[0].text for item in items] == ["one", "two"]  # type: ignore[union-attr,index]
    assert client.responses.cancel(created.id).status == "cancelled"
    client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)


def completed(connection: Any) -> list[Any]:
    """The events of one response, up to its ``response.completed``."""
    events = []
    for event in connection:
        events.append(event)
        if event.type == "response.completed":
            return events
    raise AssertionError(f"the connection ended after {[e.type for e in events]}")


def test_websocket_answers_each_response_create_in_order(
    client: openai.OpenAI, routes: ResponsesRoutes, upstream: MockUpstream
) -> None:
    """``responses.connect()`` reaches the mock's WebSocket: two ``response.create`` on one
    connection get their events in order; handshake and messages are recorded."""
    with client.responses.connect(websocket_connection_options=LEGACY) as connection:
        connection.response.create(model="gpt-4o", input="Hi")
        first = completed(connection)
        connection.response.create(
            model="gpt-4o", input="Again", previous_response_id=first[-1].response.id
        )
        second = completed(connection)
    assert [e.type for e in first] == [e.type for e in second]
    assert second[-1].response.previous_response_id == first[-1].response.id
    assert second[-1].response.output_text == "Hello from the mock."
    (session,) = upstream.websockets
    assert (session.handshake.method, session.handshake.path) == ("GET", "/v1/responses")
    assert session.handshake.headers["authorization"] == "Bearer sk-test"
    assert [m.json()["input"] for m in session.messages] == ["Hi", "Again"]
    assert [r.method for r in upstream.received] == ["GET", "WS", "WS"]
    assert session.wait_closed(2)
    assert (session.closed_by, session.close_code) == ("client", 1000)


def test_websocket_replies_are_scripted(client: openai.OpenAI, upstream: MockUpstream) -> None:
    """An error event, then an ``SSEReply`` sent as frames, then a close with its code."""
    events = response_events(response_body("gpt-4o", [message_item("From SSE.")]))
    upstream.push(
        WSReply([ws_error_event("No such response.", code="previous_response_not_found")]),
        SSEReply(sse_of_events(events)),
        WSClose(1011, "server overloaded"),
    )
    with client.responses.connect(websocket_connection_options=LEGACY) as connection:
        connection.response.create(model="gpt-4o", input="Hi", previous_response_id="resp_x")
        error = connection.recv()
        assert error.type == "error"
        assert error.error.code == "previous_response_not_found"
        connection.response.create(model="gpt-4o", input="Hi")
        got = completed(connection)
        assert [(e.type, e.sequence_number) for e in got] == [
            (e["type"], e["sequence_number"]) for e in events
        ]
        assert got[-1].response.output_text == "From SSE."
        connection.response.create(model="gpt-4o", input="Hi")
        with pytest.raises(ConnectionClosedError) as closed:
            connection.recv()
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1011, "server overloaded")
    (session,) = upstream.websockets
    assert session.wait_closed(2)
    assert (session.closed_by, session.close_code) == ("server", 1011)


def test_the_client_close_code_is_recorded(client: openai.OpenAI, upstream: MockUpstream) -> None:
    connection = client.responses.connect(websocket_connection_options=LEGACY).enter()
    connection.close(code=4000, reason="bye")
    (session,) = upstream.websockets
    assert session.wait_closed(2)
    assert (session.closed_by, session.close_code, session.close_reason) == ("client", 4000, "bye")


def test_a_handshake_is_refused_as_scripted(client: openai.OpenAI, upstream: MockUpstream) -> None:
    upstream.push(WSReject({"error": {"message": "Invalid key."}}, status=401))
    with pytest.raises(InvalidStatus) as refused:
        client.responses.connect(websocket_connection_options=LEGACY).enter()
    assert refused.value.response.status_code == 401
    assert upstream.websockets == []
