"""Messages answers -> chat completions: thinking blocks survive the way there and back,
and the recorded Messages streams of the Anthropic SDK's test suite become the chat
completions and chunks an OpenAI client expects."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from gateway.codecs.chat_anthropic import Accumulator, ChunkTranslator, from_message, to_messages
from tests.gateway.codecs.chat_anthropic.samples import (
    ANSWERS,
    REDACTED,
    STREAMS,
    THOUGHT,
    events_of,
    recorded,
    thinking_events,
)
from tests.mock_upstream import MockUpstream, SSEReply

PARIS = {"city": "Paris"}


def test_thinking_blocks_go_out_and_come_back_unchanged() -> None:
    answer = {
        "id": "msg_1",
        "model": "claude-sonnet-4",
        "content": [
            {"type": "thinking", "thinking": "The user wants Paris.", "signature": "sig=="},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "Checking."},
            {
                "type": "tool_use",
                "id": "toolu_1",
                "name": "get_weather",
                "input": {"city": "Paris"},
            },
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }
    completion = from_message(answer)
    reply = completion["choices"][0]["message"]
    assert completion["choices"][0]["finish_reason"] == "tool_calls"
    assert reply["reasoning_content"] == "The user wants Paris."
    assert reply["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": '{"city":"Paris"}',
    }
    following = to_messages(
        {
            "model": "claude-sonnet-4",
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                reply,
                {"role": "tool", "tool_call_id": "toolu_1", "content": "18 C"},
            ],
        }
    )
    assert following["messages"][1]["content"] == answer["content"]
    assert following["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"}
    ]


def test_a_recorded_tool_use_stream_becomes_a_tool_call() -> None:
    message = recorded("tool_use_response.txt")
    completion = from_message(message)
    choice = completion["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "I'll check the current weather in Paris for you."
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == message["content"][1]["input"]
    assert "Paris" in call["function"]["arguments"]
    usage = completion["usage"]
    assert usage["prompt_tokens"] == 377
    assert usage["completion_tokens"] == message["usage"]["output_tokens"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}


@pytest.mark.parametrize(
    ("name", "finish"),
    [
        ("basic_response.txt", "stop"),
        ("refusal_response.txt", "content_filter"),
        ("incomplete_partial_json_response.txt", "length"),
    ],
)
def test_recorded_streams_end_with_the_right_finish_reason(name: str, finish: str) -> None:
    completion = from_message(recorded(name))
    assert completion["choices"][0]["finish_reason"] == finish
    assert completion["object"] == "chat.completion"


def test_a_tool_call_cut_off_by_the_token_limit_keeps_what_it_got() -> None:
    completion = from_message(recorded("incomplete_partial_json_response.txt"))
    (call,) = completion["choices"][0]["message"]["tool_calls"]
    assert call["function"]["arguments"].startswith('{"filename": "taxes.txt"')
    assert call["function"]["arguments"].endswith("Filing taxes")


def test_cache_reads_and_writes_count_as_prompt_tokens() -> None:
    usage = from_message(
        {
            "content": [{"type": "text", "text": "ok"}],
            "stop_reason": "end_turn",
            "usage": {
                "input_tokens": 20,
                "cache_read_input_tokens": 3_000,
                "cache_creation_input_tokens": 500,
                "output_tokens": 7,
            },
        }
    )["usage"]
    assert usage == {
        "prompt_tokens": 3_520,
        "completion_tokens": 7,
        "total_tokens": 3_527,
        "prompt_tokens_details": {"cached_tokens": 3_000},
    }


@pytest.mark.parametrize("name", ANSWERS)
def test_the_accumulated_answer_is_what_the_anthropic_sdk_makes_of_the_stream(
    upstream: MockUpstream, name: str
) -> None:
    """The official SDK, reading the recorded stream from the mock over HTTP, ends with the
    same text, tool calls (name, id, input), stop reason and usage as the codec."""
    import anthropic

    upstream.push(SSEReply(events_of(name)))
    with (
        anthropic.Anthropic(
            base_url=upstream.base_url.removesuffix("/v1"), api_key="sk-ant-test", max_retries=0
        ) as client,
        client.messages.stream(
            model="claude-sonnet-4", max_tokens=100, messages=[{"role": "user", "content": "Hi"}]
        ) as stream,
    ):
        final = stream.get_final_message()
    ours = recorded(name)
    theirs = final.model_dump(mode="json", exclude_none=True)
    assert ours["stop_reason"] == theirs["stop_reason"]
    assert ours["usage"]["output_tokens"] == theirs["usage"]["output_tokens"]
    assert ours["usage"]["input_tokens"] == theirs["usage"]["input_tokens"]
    assert [b["type"] for b in ours["content"]] == [b["type"] for b in theirs["content"]]
    for mine, sdk in zip(ours["content"], theirs["content"], strict=True):
        if mine["type"] == "text":
            assert mine["text"] == sdk["text"]
        if mine["type"] == "tool_use" and "partial_json" not in mine:
            assert (mine["id"], mine["name"], mine["input"]) == (
                sdk["id"],
                sdk["name"],
                sdk["input"],
            )


@pytest.mark.parametrize("name", ANSWERS)
def test_the_stream_translated_to_chunks_adds_up_to_the_same_completion(name: str) -> None:
    """The chunks made event by event, read by the OpenAI SDK's own stream accumulator,
    end with the text, tool calls, finish reason and usage of the whole answer."""
    from openai.lib.streaming.chat import ChatCompletionStreamState
    from openai.types.chat import ChatCompletionChunk

    translator = ChunkTranslator(include_usage=True)
    state: ChatCompletionStreamState[None] = ChatCompletionStreamState()
    usage = None
    for line in (STREAMS / name).read_text().splitlines():
        if not line.startswith("data: "):
            continue
        for chunk in translator.add(orjson.loads(line[6:])):
            parsed = ChatCompletionChunk.model_validate(chunk)
            if parsed.usage is not None:
                usage = parsed.usage.model_dump(exclude_none=True)
            state.handle_chunk(parsed)
    final = state.current_completion_snapshot.choices[0]
    expected = from_message(recorded(name))
    reply = expected["choices"][0]["message"]
    assert final.finish_reason == expected["choices"][0]["finish_reason"]
    assert (final.message.content or None) == reply["content"]
    streamed = [
        (c.id, c.function.name, _arguments(c.function.arguments))
        for c in final.message.tool_calls or ()
    ]
    whole = [
        (c["id"], c["function"]["name"], _arguments(c["function"]["arguments"]))
        for c in reply.get("tool_calls", ())
    ]
    assert streamed == whole
    assert usage == expected["usage"]


def _arguments(text: str) -> Any:
    """Arguments compared as JSON where they are JSON (whitespace aside), else as text."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def test_streamed_thinking_comes_as_reasoning_and_one_lossless_block() -> None:
    def delta(index: int, **fields: str) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": index, "delta": fields}

    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {"id": "msg_t", "model": "claude", "usage": {}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking"}},
        delta(0, type="thinking_delta", thinking="Paris "),
        delta(0, type="thinking_delta", thinking="in May."),
        delta(0, type="signature_delta", signature="c2ln"),
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        delta(1, type="text_delta", text="Mild."),
        {"type": "content_block_stop", "index": 1},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {}},
        {"type": "message_stop"},
    ]
    translator, accumulator = ChunkTranslator(), Accumulator()
    chunks = []
    for event in events:
        chunks.extend(translator.add(event))
        accumulator.add(event)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Paris in May."
    assert "".join(d.get("content", "") for d in deltas) == "Mild."
    (blocks,) = [d["thinking_blocks"] for d in deltas if "thinking_blocks" in d]
    assert blocks == [{"index": 0, **accumulator.message["content"][0]}]
    assert blocks[0]["signature"] == "c2ln"
    assert translator.add({"type": "error", "error": {"type": "overloaded_error"}}) == [
        {"error": {"type": "overloaded_error"}}
    ]


def test_several_streamed_thinking_blocks_add_up_in_the_openai_sdk_and_go_back() -> None:
    """A streamed answer with a thinking and a redacted thinking block, read by the OpenAI
    SDK's own accumulator, ends with both blocks in order; the accumulated message sent
    back gives Anthropic exactly the blocks it wrote (no key the chunks needed)."""
    from openai.lib.streaming.chat import ChatCompletionStreamState
    from openai.types.chat import ChatCompletionChunk

    call = {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}
    events = thinking_events(call)
    translator = ChunkTranslator()
    state: ChatCompletionStreamState[None] = ChatCompletionStreamState()
    for event in events:
        for chunk in translator.add(event):
            state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    message = state.current_completion_snapshot.choices[0].message.model_dump(
        mode="json", exclude_none=True
    )
    assert [b["type"] for b in message["thinking_blocks"]] == ["thinking", "redacted_thinking"]
    sent = to_messages(
        {
            "model": "claude-sonnet-4",
            "messages": [
                {"role": "user", "content": "Weather?"},
                message,
                {"role": "tool", "tool_call_id": "toolu_1", "content": "Mild."},
            ],
        }
    )
    assert sent["messages"][1]["content"] == [THOUGHT, REDACTED, call]


def test_a_streamed_call_without_arguments_gets_an_empty_object() -> None:
    translator = ChunkTranslator()
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {"id": "m", "model": "claude", "usage": {}}},
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "tool_use", "id": "t1", "name": "now", "input": {}},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": ""},
        },
        {"type": "content_block_stop", "index": 0},
    ]
    chunks = [c for e in events for c in translator.add(e)]
    arguments = "".join(
        call["function"].get("arguments", "")
        for c in chunks
        for call in c["choices"][0]["delta"].get("tool_calls", ())
    )
    assert arguments == "{}"
