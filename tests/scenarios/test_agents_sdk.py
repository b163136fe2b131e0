"""The OpenAI Agents SDK (``openai-agents``) through the gateway, as a user writes it: an
``Agent`` with one ``@function_tool``, run by ``Runner.run`` (and ``Runner.run_streamed``)
on the Responses model (over HTTP and over a WebSocket) and on the Chat Completions model,
each pointed at the gateway by its own ``AsyncOpenAI`` client. The mock upstream asks for
the tool, then answers in text once the tool's output comes back. The tool's output is
large and the client's ``x-contextgate-policy`` sets a small ``filter-tokens``, so the
pipeline offloads it: the model sees a preview naming a ref (which restores the output),
the agent keeps the real output, and the run ends with the model's answer."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from agents import (
    Agent,
    FunctionTool,
    Model,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    OpenAIResponsesWSModel,
    RunConfig,
    Runner,
    RunResult,
    RunResultStreaming,
    ToolCallOutputItem,
    function_tool,
)

from tests.harness import GatewayServer
from tests.mock_upstream import (
    JSONReply,
    MockUpstream,
    Reply,
    SSEReply,
    WSReply,
    chat_chunk,
    chat_completion,
    events_of,
    function_call_item,
    message_item,
    response_body,
    response_events,
    sse_of_events,
)

KEY = "sk-agents"
POLICY = "filter-tokens=300"
QUESTION = "What's the weather in Paris tomorrow?"
ANSWER = "Tomorrow in Paris: light rain in the morning, 17 degrees by the afternoon."
CALL_ID = "call_paris"
REF = re.compile(r"ctx_[A-Za-z0-9_-]{22,}")
RUN_CONFIG = RunConfig(tracing_disabled=True)
"""Per run, no trace is made, so nothing is exported to the internet."""


def forecast(city: str) -> str:
    """An hourly forecast: a tool output far over ``filter-tokens``."""
    return "".join(
        f"{city} {hour:02d}:00 - {12 + hour % 7} C, {'light rain' if hour < 10 else 'cloudy'}, "
        f"wind {5 + hour % 4} km/h from the south-west, humidity {60 + hour % 11}%\n"
        for hour in range(48)
    )


def weather_tool(calls: list[str]) -> FunctionTool:
    @function_tool
    def get_weather(city: str) -> str:
        """Get the hourly weather forecast for a city.

        Args:
            city: The city's name.
        """
        calls.append(city)
        return forecast(city)

    return get_weather


@dataclass
class Client:
    """The agent's client to the gateway and the headers of each answer it got over HTTP."""

    sdk: openai.AsyncOpenAI
    answers: list[Mapping[str, str]]


@pytest.fixture
async def client(gateway: GatewayServer) -> AsyncIterator[Client]:
    answers: list[Mapping[str, str]] = []

    async def keep(response: Any) -> None:
        answers.append(response.headers)

    async with openai.AsyncOpenAI(
        base_url=gateway.base_url,
        api_key=KEY,
        max_retries=0,
        default_headers={"x-contextgate-policy": POLICY},
        http_client=openai.DefaultAsyncHttpxClient(event_hooks={"response": [keep]}),
    ) as sdk:
        yield Client(sdk, answers)


def agent_on(model: Model, calls: list[str]) -> Agent[Any]:
    return Agent(
        name="Forecaster",
        instructions="Answer weather questions with the get_weather tool.",
        tools=[weather_tool(calls)],
        model=model,
    )


async def run(agent: Agent[Any], stream: bool) -> tuple[RunResult | RunResultStreaming, str]:
    """The run's result and, streamed, the answer's text as its deltas came (else "")."""
    if not stream:
        return await Runner.run(agent, QUESTION, run_config=RUN_CONFIG), ""
    result = Runner.run_streamed(agent, QUESTION, run_config=RUN_CONFIG)
    text = ""
    async for event in result.stream_events():
        if event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
            text += event.data.delta
    return result, text


def responses_reply(body: dict[str, Any], stream: bool) -> Reply:
    return SSEReply(sse_of_events(response_events(body))) if stream else JSONReply(body)


def chat_call_reply(stream: bool) -> Reply:
    call = {"id": CALL_ID, "type": "function"}
    if stream:
        start = call | {"index": 0, "function": {"name": "get_weather", "arguments": ""}}
        pieces = ['{"city"', ': "Par', 'is"}']
        return SSEReply(
            events_of(
                [
                    chat_chunk({"role": "assistant", "content": None, "tool_calls": [start]}),
                    *(
                        chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": p}}]})
                        for p in pieces
                    ),
                    chat_chunk({}, finish="tool_calls"),
                ]
            )
        )
    reply = chat_completion()
    function = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    message = {"role": "assistant", "content": None, "tool_calls": [call | {"function": function}]}
    reply["choices"][0] |= {"message": message, "finish_reason": "tool_calls"}
    return JSONReply(reply)


def chat_text_reply(stream: bool) -> Reply:
    if not stream:
        return JSONReply(chat_completion(ANSWER))
    words = re.findall(r"\S+\s*", ANSWER)
    first = chat_chunk({"role": "assistant", "content": words[0]})
    rest = [chat_chunk({"content": word}) for word in words[1:]]
    return SSEReply(events_of([first, *rest, chat_chunk({}, finish="stop")]))


async def restored(client: Client, output: str) -> str:
    """What the ref in a preview restores to, through the gateway, with the agent's key."""
    ref = REF.search(output)
    assert ref is not None, output
    async with httpx.AsyncClient() as http:
        got = await http.get(
            f"{client.sdk.base_url}context/objects/{ref.group()}",
            headers={"authorization": f"Bearer {KEY}"},
        )
    assert got.status_code == 200
    return got.text


def assert_user_saw_the_answer(
    result: RunResult | RunResultStreaming, streamed: str, stream: bool, calls: list[str]
) -> None:
    """The run ended on the model's answer (streamed, in deltas too), after the tool ran
    once with the model's arguments; the agent's own record keeps the tool's whole output."""
    assert result.final_output == ANSWER
    assert streamed == (ANSWER if stream else "")
    assert calls == ["Paris"]
    outputs = [item for item in result.new_items if isinstance(item, ToolCallOutputItem)]
    assert [item.output for item in outputs] == [forecast("Paris")]


def assert_went_through_the_pipeline(client: Client, upstream: MockUpstream) -> None:
    """Two model calls, each answered by the gateway (its headers on both); the second,
    carrying the big output, was rewritten by the filter stage. The policy header stays
    at the gateway."""
    assert len(upstream.received) == 2
    assert len(client.answers) == 2
    for headers in client.answers:
        assert headers.get("x-contextgate-request-id")
    assert "filter" in client.answers[1]["x-contextgate-actions"]
    for received in upstream.received:
        assert received.headers["authorization"] == f"Bearer {KEY}"
        assert "x-contextgate-policy" not in received.headers


async def assert_responses_history(client: Client, first: Any, second: Any) -> None:
    """The first request offered the tool; the second resends the whole history (no
    previous_response_id): the question, the model's call as it made it, and the tool's
    output paired with it by call_id, that output offloaded behind a preview whose ref
    restores it."""
    assert "get_weather" in [tool["name"] for tool in first["tools"]]
    assert "previous_response_id" not in second
    items = second["input"]
    assert items[0]["role"] == "user"
    assert items[0]["content"] == QUESTION
    (made,) = [item for item in items if item.get("type") == "function_call"]
    assert (made["call_id"], made["name"], made["arguments"]) == (
        CALL_ID,
        "get_weather",
        '{"city":"Paris"}',
    )
    (output,) = [item for item in items if item.get("type") == "function_call_output"]
    assert output["call_id"] == CALL_ID
    assert items.index(output) > items.index(made)
    assert isinstance(output["output"], str)
    assert "Paris 00:00" in output["output"]
    assert len(output["output"]) < len(forecast("Paris")) // 2
    assert await restored(client, output["output"]) == forecast("Paris")


def answers() -> tuple[dict[str, Any], dict[str, Any]]:
    """The model's two responses: the call for the tool, then the text answer."""
    call = function_call_item("get_weather", {"city": "Paris"}, CALL_ID, "fc_1")
    return (
        response_body("gpt-4o", [call], id="resp_1"),
        response_body("gpt-4o", [message_item(ANSWER)], id="resp_2"),
    )


@pytest.mark.parametrize("stream", [False, True], ids=["run", "run_streamed"])
async def test_agent_with_a_tool_on_the_responses_model(
    client: Client, upstream: MockUpstream, stream: bool
) -> None:
    upstream.push(*(responses_reply(body, stream) for body in answers()))
    calls: list[str] = []
    model = OpenAIResponsesModel(model="gpt-4o", openai_client=client.sdk)

    result, streamed = await run(agent_on(model, calls), stream)

    assert_user_saw_the_answer(result, streamed, stream, calls)
    assert_went_through_the_pipeline(client, upstream)
    assert [r.path for r in upstream.received] == ["/v1/responses"] * 2
    first, second = (received.json() for received in upstream.received)
    assert first.get("stream", False) is stream
    await assert_responses_history(client, first, second)


@pytest.mark.parametrize("stream", [False, True], ids=["run", "run_streamed"])
async def test_agent_with_a_tool_on_the_responses_model_over_a_websocket(
    client: Client, upstream: MockUpstream, stream: bool
) -> None:
    """``OpenAIResponsesWSModel``: one WebSocket to the gateway, whose ``response.create``
    messages go through the pipeline to the upstream's WebSocket (``Runner.run`` too: the
    model streams over a socket either way)."""
    upstream.push(*(WSReply(response_events(body)) for body in answers()))
    calls: list[str] = []
    model = OpenAIResponsesWSModel(model="gpt-4o", openai_client=client.sdk)
    try:
        result, streamed = await run(agent_on(model, calls), stream)
    finally:
        await model.close()

    assert_user_saw_the_answer(result, streamed, stream, calls)
    (socket,) = upstream.websockets
    assert socket.handshake.headers["authorization"] == f"Bearer {KEY}"
    assert "x-contextgate-policy" not in socket.handshake.headers
    first, second = (message.json() for message in socket.messages)
    assert first["type"] == second["type"] == "response.create"
    await assert_responses_history(client, first, second)


@pytest.mark.parametrize("stream", [False, True], ids=["run", "run_streamed"])
async def test_agent_with_a_tool_on_the_chat_completions_model(
    client: Client, upstream: MockUpstream, stream: bool
) -> None:
    upstream.push(chat_call_reply(stream), chat_text_reply(stream))
    calls: list[str] = []
    model = OpenAIChatCompletionsModel(model="gpt-4o", openai_client=client.sdk)

    result, streamed = await run(agent_on(model, calls), stream)

    assert_user_saw_the_answer(result, streamed, stream, calls)
    assert_went_through_the_pipeline(client, upstream)
    first, second = (received.json() for received in upstream.received)
    assert [r.path for r in upstream.received] == ["/v1/chat/completions"] * 2
    assert "get_weather" in [tool["function"]["name"] for tool in first["tools"]]
    assert first.get("stream", False) is stream
    # The assistant's call, then the tool message answering it by tool_call_id, its
    # content offloaded behind a preview whose ref restores it.
    messages = second["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
    assert messages[1]["content"] == QUESTION
    (made,) = messages[2]["tool_calls"]
    assert made["id"] == CALL_ID
    assert made["function"]["name"] == "get_weather"
    assert made["function"]["arguments"] == '{"city": "Paris"}'
    tool = messages[3]
    assert tool["tool_call_id"] == CALL_ID
    assert "Paris 00:00" in tool["content"]
    assert len(tool["content"]) < len(forecast("Paris")) // 2
    assert await restored(client, tool["content"]) == forecast("Paris")
