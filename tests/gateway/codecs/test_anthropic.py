"""The OpenAI <-> Anthropic Messages codec: tau-bench histories become valid Messages
requests (every tool call answered in the next user turn), images and thinking blocks
survive, and the recorded Messages streams of the Anthropic SDK's test suite become the
chat completions an OpenAI client expects."""

from __future__ import annotations

import base64
import itertools
import json
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest

from bench.compaction import requests_of
from gateway.codecs.anthropic import Accumulator, ChunkTranslator, from_message, to_messages
from gateway.errors import InvalidRequest
from tests.gateway.codecs.anthropic_params import assert_valid_params
from tests.harness import GatewayServer
from tests.mock_upstream import JSONReply, MockUpstream, SSEReply

ROOT = Path(__file__).resolve().parents[3]
TRACES = ROOT / "bench" / "data" / "tau-bench-gpt-4o-airline.json"
STREAMS = ROOT / "tests" / "fixtures" / "anthropic-sse"


def recorded(name: str) -> dict[str, Any]:
    """The answer a recorded stream adds up to."""
    accumulator = Accumulator()
    for line in (STREAMS / name).read_text().splitlines():
        if line.startswith("data: "):
            accumulator.add(orjson.loads(line[6:]))
    return accumulator.message


def test_every_tau_bench_history_becomes_a_valid_messages_request() -> None:
    for trajectory in json.loads(TRACES.read_text())[:40]:
        history = requests_of(trajectory["traj"])[-1]
        request = to_messages({"model": "claude-sonnet-4", "messages": history})
        assert request["system"][0]["text"] == history[0]["content"]
        turns = request["messages"]
        assert turns[0]["role"] == "user"
        assert all(a["role"] != b["role"] for a, b in itertools.pairwise(turns))
        for index, turn in enumerate(turns):
            calls = [b["id"] for b in turn["content"] if b["type"] == "tool_use"]
            if calls:
                answers = [
                    b["tool_use_id"]
                    for b in turns[index + 1]["content"]
                    if b["type"] == "tool_result"
                ]
                assert answers == calls
        sent_calls = sum(len(m.get("tool_calls") or ()) for m in history)
        blocks = [b for t in turns for b in t["content"]]
        assert sum(b["type"] == "tool_use" for b in blocks) == sent_calls
        assert sum(b["type"] == "tool_result" for b in blocks) == sum(
            m["role"] == "tool" for m in history
        )


def test_parameters_tools_and_choices_map_across() -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather now.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    body = {
        "model": "claude-sonnet-4",
        "messages": [{"role": "user", "content": "Paris?"}],
        "tools": [tool],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_completion_tokens": 300,
        "stop": "END",
        "temperature": 0.2,
        "user": "u-42",
    }
    request = to_messages(body)
    assert request["tools"] == [
        {
            "name": "get_weather",
            "input_schema": tool["function"]["parameters"],
            "description": "Weather now.",
        }
    ]
    assert request["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    assert request["max_tokens"] == 300
    assert request["stop_sequences"] == ["END"]
    assert request["temperature"] == 0.2
    assert request["metadata"] == {"user_id": "u-42"}
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert to_messages({**body, "tool_choice": named, "parallel_tool_calls": None})[
        "tool_choice"
    ] == {"type": "tool", "name": "get_weather"}
    assert "max_tokens" in to_messages({"model": "m", "messages": body["messages"]})


INLINE = "data:image/png;base64,iVBORw0K"


def test_images_become_base64_or_url_sources() -> None:
    request = to_messages(
        {
            "model": "claude-sonnet-4",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What differs?"},
                        {
                            "type": "image_url",
                            "image_url": {"url": "data:image/png;base64,iVBORw0K"},
                        },
                        {"type": "image_url", "image_url": {"url": "https://example.com/b.png"}},
                    ],
                }
            ],
        }
    )
    text, inline, linked = request["messages"][0]["content"]
    assert text == {"type": "text", "text": "What differs?"}
    assert inline["source"] == {"type": "base64", "media_type": "image/png", "data": "iVBORw0K"}
    assert linked["source"] == {"type": "url", "url": "https://example.com/b.png"}


def test_an_image_part_without_a_usable_url_is_not_a_server_error() -> None:
    """A malformed image part makes an image block the API will refuse with a 400, not
    a crash in the gateway; a bare string URL (some clients send one) is still read."""
    request = to_messages(
        {
            "model": "claude-sonnet-4",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": 5}},
                        {"type": "image_url", "image_url": "https://example.com/c.png"},
                    ],
                }
            ],
        }
    )
    broken, bare = request["messages"][0]["content"]
    assert broken["source"] == {"type": "url", "url": ""}
    assert bare["source"] == {"type": "url", "url": "https://example.com/c.png"}


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


def test_arguments_that_are_not_an_object_are_refused() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[1, 2"}}
    with pytest.raises(InvalidRequest, match="c1"):
        to_messages(
            {
                "model": "claude-sonnet-4",
                "messages": [
                    {"role": "user", "content": "go"},
                    {"role": "assistant", "content": None, "tool_calls": [call]},
                ],
            }
        )


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


ANSWERS = (
    "basic_response.txt",
    "tool_use_response.txt",
    "refusal_response.txt",
    "incomplete_partial_json_response.txt",
)
"""The recorded streams that are one answer each (text, a tool call, a refusal, a call
cut off by the token limit)."""


def events_of(name: str) -> list[bytes]:
    data = (STREAMS / name).read_bytes()
    return [part + b"\n\n" for part in data.split(b"\n\n") if part.strip()]


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


THOUGHT = {"type": "thinking", "thinking": "Paris in May.", "signature": "c2ln"}
REDACTED = {"type": "redacted_thinking", "data": "EmwK"}


def thinking_events(last: dict[str, Any], *deltas: dict[str, Any]) -> list[dict[str, Any]]:
    """A Messages stream of a thinking block, a redacted thinking block, then ``last``
    (streamed with ``deltas``), ending as ``last`` would end the answer."""
    reasoning = {"type": "thinking_delta", "thinking": THOUGHT["thinking"]}
    stop = "tool_use" if last["type"] == "tool_use" else "end_turn"
    return [
        {"type": "message_start", "message": {"id": "msg_t", "model": "claude", "usage": {}}},
        {"type": "content_block_start", "index": 0, "content_block": {**THOUGHT, "thinking": ""}},
        {"type": "content_block_delta", "index": 0, "delta": reasoning},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": REDACTED},
        {"type": "content_block_stop", "index": 1},
        {"type": "content_block_start", "index": 2, "content_block": last},
        *({"type": "content_block_delta", "index": 2, "delta": d} for d in deltas),
        {"type": "content_block_stop", "index": 2},
        {"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {}},
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


def test_empty_turns_are_left_out_of_the_request() -> None:
    """Claude sometimes answers with nothing; sent back, an empty turn would be refused."""
    request = to_messages(
        {
            "model": "claude-sonnet-4",
            "messages": [
                {"role": "user", "content": "First."},
                {"role": "assistant", "content": ""},
                {"role": "user", "content": [{"type": "text", "text": ""}]},
                {"role": "user", "content": "Second."},
            ],
        }
    )
    assert request["messages"] == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "First."}, {"type": "text", "text": "Second."}],
        }
    ]


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


EPHEMERAL = {"type": "ephemeral"}


def _markers(request: dict[str, Any]) -> list[tuple[str, ...]]:
    """Where ``cache_control`` appears in a Messages request: (place, block type) pairs."""
    found = [("system", b["type"]) for b in request.get("system", ()) if "cache_control" in b]
    for number, turn in enumerate(request["messages"]):
        assert set(turn) == {"role", "content"}
        found += [
            (f"{number}:{turn['role']}", b["type"]) for b in turn["content"] if "cache_control" in b
        ]
    return found


def test_a_message_level_marker_lands_on_the_last_block_of_its_message() -> None:
    """A ``cache_control`` on a whole message (the cache_markers stage's, LiteLLM's) marks
    the last block that message becomes, and no other block or turn."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    thought = {"type": "thinking", "thinking": "Hm.", "signature": "c2ln"}
    request = to_messages(
        {
            "model": "claude-sonnet-4",
            "messages": [
                {
                    "role": "system",
                    "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
                    "cache_control": EPHEMERAL,
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Look."},
                        {"type": "image_url", "image_url": {"url": INLINE}},
                    ],
                    "cache_control": EPHEMERAL,
                },
                {
                    "role": "assistant",
                    "content": "Calling.",
                    "tool_calls": [call, {**call, "id": "c2"}],
                    "cache_control": EPHEMERAL,
                },
                {"role": "tool", "tool_call_id": "c1", "content": "1", "cache_control": EPHEMERAL},
                {"role": "tool", "tool_call_id": "c2", "content": "2"},
                {
                    "role": "assistant",
                    "content": None,
                    "thinking_blocks": [thought],
                    "cache_control": EPHEMERAL,
                },
                {"role": "user", "content": "Go on.", "cache_control": EPHEMERAL},
                {
                    "role": "assistant",
                    "content": "Done.",
                    "thinking_blocks": [thought],
                    "cache_control": EPHEMERAL,
                },
            ],
        }
    )
    assert _markers(request) == [
        ("system", "text"),
        ("0:user", "image"),
        ("1:assistant", "tool_use"),
        ("2:user", "tool_result"),
        ("4:user", "text"),
        ("5:assistant", "text"),
    ]
    assert request["system"][1]["cache_control"] == EPHEMERAL
    assert request["messages"][1]["content"][-1]["id"] == "c2"
    assert request["messages"][2]["content"][0]["tool_use_id"] == "c1"
    # Thinking blocks cannot carry a marker: an answer of nothing else carries none.
    assert all("cache_control" not in b for b in request["messages"][3]["content"][:2])
    # A malformed block is not a thinking block: marked, for the API to refuse (a 400,
    # not a crash here).
    odd = {"role": "assistant", "thinking_blocks": [{"type": []}], "cache_control": EPHEMERAL}
    assert _markers(to_messages({"model": "claude-sonnet-4", "messages": [odd]})) == [
        ("0:assistant", [])
    ]


def test_markers_inside_a_tool_results_content_go_on_the_tool_result() -> None:
    """The API takes no breakpoint inside a tool result's content (``invalid_cache``): a
    marker a client set on a part of a tool message (LiteLLM's habit) marks the
    ``tool_result`` itself, the last one in prompt order when there are several, and a
    message-level marker still wins."""
    hour = {"type": "ephemeral", "ttl": "1h"}
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    parts = [
        {"type": "text", "text": "18 C", "cache_control": hour},
        {**image, "cache_control": EPHEMERAL},
    ]
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": parts},
    ]
    request = to_messages({"model": "claude-sonnet-4", "messages": messages})
    assert request["messages"][2]["content"] == [
        {
            "type": "tool_result",
            "tool_use_id": "c1",
            "content": [
                {"type": "text", "text": "18 C"},
                {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
            ],
            "cache_control": EPHEMERAL,
        }
    ]
    messages[2] = {**messages[2], "cache_control": hour}
    request = to_messages({"model": "claude-sonnet-4", "messages": messages})
    assert request["messages"][2]["content"][0]["cache_control"] == hour
    assert orjson.dumps(request).count(b"cache_control") == 1


def test_anthropic_blocks_keys_and_tools_in_a_chat_request_pass_through() -> None:
    """What the inbound /v1/messages codec carries in the chat form reaches Anthropic as
    it was: block keys, blocks OpenAI has no part for, error flags, server tools."""
    cited = {"type": "text", "text": "Per the memo.", "citations": None, "cache_control": EPHEMERAL}
    document = {
        "type": "document",
        "source": {"type": "text", "media_type": "text/plain", "data": "Memo."},
        "citations": {"enabled": True},
    }
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "read", "arguments": '{"path":"memo.txt"}'},
        "cache_control": EPHEMERAL,
    }
    server_tool = {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}
    request = to_messages(
        {
            "model": "claude-sonnet-4",
            "messages": [
                {
                    "role": "user",
                    "content": [cited, document],
                },
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": [document], "is_error": True},
            ],
            "tools": [
                {
                    "type": "function",
                    "function": {"name": "read", "parameters": {"type": "object"}},
                    "cache_control": EPHEMERAL,
                    "strict": True,
                },
                server_tool,
            ],
        }
    )
    user, assistant, results = request["messages"]
    assert user["content"] == [cited, document]
    assert assistant["content"] == [
        {
            "type": "tool_use",
            "id": "c1",
            "name": "read",
            "input": {"path": "memo.txt"},
            "cache_control": EPHEMERAL,
        }
    ]
    assert results["content"] == [
        {"type": "tool_result", "tool_use_id": "c1", "content": [document], "is_error": True}
    ]
    assert request["tools"] == [
        {
            "name": "read",
            "input_schema": {"type": "object"},
            "cache_control": EPHEMERAL,
            "strict": True,
        },
        server_tool,
    ]


PDF = "JVBERi0xLjQKJcfsj6IKMSAwIG9iago8PC9UeXBlL0NhdGFsb2cvUGFnZXMgMiAwIFI+PgplbmRvYmoK"
PDF_PART: dict[str, Any] = {
    "type": "file",
    "file": {"filename": "spec.pdf", "file_data": f"data:application/pdf;base64,{PDF}"},
    "cache_control": EPHEMERAL,
}
PDF_BLOCK: dict[str, Any] = {
    "type": "document",
    "source": {"type": "base64", "media_type": "application/pdf", "data": PDF},
    "title": "spec.pdf",
    "cache_control": EPHEMERAL,
}
HI = {"role": "user", "content": "Hi"}
READ_CALL = {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}
ANSWER: dict[str, Any] = {
    "id": "msg_02",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-20250514",
    "content": [{"type": "text", "text": "Sunny."}],
    "stop_reason": "end_turn",
    "usage": {"input_tokens": 20, "output_tokens": 2},
}


def with_content(content: Any, *, result: Any = "ok") -> dict[str, Any]:
    """A chat request: a user message, a tool call answered with ``result`` (message
    2), then a user message of ``content`` (message 3)."""
    return {
        "model": "claude-sonnet-4",
        "messages": [
            HI,
            {"role": "assistant", "content": None, "tool_calls": [READ_CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": result},
            {"role": "user", "content": content},
        ],
    }


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_a_pdf_or_text_file_part_reaches_claude_as_a_document() -> None:
    """A PDF sent as an OpenAI file part (in a user message or a tool result) is a
    document Claude reads, titled with its filename and with its cache marker; a
    plain-text file is a text document: the model sees them, not silence."""
    notes = "Gate B12 closes at 07:40.\n"
    text_part = {
        "type": "file",
        "file": {"file_data": "data:text/plain;charset=utf-8;base64," + b64(notes.encode())},
    }
    content = [PDF_PART, text_part, {"type": "text", "text": "Summarize both."}]
    request = to_messages(with_content(content, result=[PDF_PART]))
    assert_valid_params(request)
    result, pdf, text, _ = request["messages"][2]["content"]
    assert result["content"] == [{k: v for k, v in PDF_BLOCK.items() if k != "cache_control"}]
    assert result["cache_control"] == EPHEMERAL
    assert pdf == PDF_BLOCK
    assert text == {
        "type": "document",
        "source": {"type": "text", "media_type": "text/plain", "data": notes},
    }


@pytest.mark.parametrize(
    ("part", "says"),
    [
        ({"type": "file", "file": {"file_id": "file-abc123"}}, "file_id"),
        ({"type": "input_audio", "input_audio": {"data": "UklG", "format": "wav"}}, "input_audio"),
        (
            {"type": "file", "file": {"file_data": "data:image/png;base64,iVBORw0K"}},
            "not image/png",
        ),
    ],
)
def test_a_part_claude_cannot_take_is_a_400_naming_it(part: dict[str, Any], says: str) -> None:
    """An audio part, or a file given by an uploaded file's id, in a user message or a
    tool result, is refused with the part's path instead of being left out of what the
    model sees."""
    listen = {"type": "text", "text": "Listen."}
    for index, body in (
        (3, with_content([listen, part])),
        (2, with_content("Go on.", result=[listen, part])),
    ):
        with pytest.raises(InvalidRequest, match=says) as caught:
            to_messages(body)
        assert (caught.value.code, caught.value.param) == (
            "unsupported_content",
            f"messages[{index}].content[1]",
        )


def test_a_text_file_that_is_not_base64_text_is_a_400() -> None:
    """A plain-text file whose data does not decode is refused, not a server error."""
    broken = {"type": "file", "file": {"file_data": "data:text/plain;base64,@@@"}}
    with pytest.raises(InvalidRequest) as caught:
        to_messages(with_content([broken]))
    assert (caught.value.code, caught.value.param) == ("invalid_value", "messages[3].content[0]")


def test_an_earlier_refusal_stays_in_the_history_as_text() -> None:
    """An assistant refusal part sent back in the history is what the assistant said:
    Claude sees it as text."""
    refused = {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't."}]}
    request = to_messages({"model": "claude-sonnet-4", "messages": [HI, refused, HI]})
    assert request["messages"][1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "I can't."}],
    }


def test_automatic_caching_asked_in_a_chat_request_reaches_claude() -> None:
    """A top-level ``cache_control`` (Claude's automatic caching, which the cache_markers
    stage counts as one of the four breakpoints) is sent on as the client gave it."""
    hour = {"type": "ephemeral", "ttl": "1h"}
    body = {"model": "claude-sonnet-4", "messages": [HI], "cache_control": hour}
    request = to_messages(body)
    assert request["cache_control"] == hour
    assert "cache_control" not in to_messages({**body, "cache_control": None})


def test_claude_fields_sent_in_a_chat_request_reach_claude() -> None:
    """``top_k`` (an integer), ``safety_identifier`` and ``service_tier`` reach Claude in
    its own terms; a ``top_k`` that is not an integer is not sent."""
    body = {
        "model": "claude-sonnet-4",
        "messages": [HI],
        "top_k": 5,
        "safety_identifier": "user-7f3a",
        "service_tier": "default",
    }
    request = to_messages(body)
    assert (request["top_k"], request["metadata"], request["service_tier"]) == (
        5,
        {"user_id": "user-7f3a"},
        "standard_only",
    )
    assert_valid_params(request)
    for odd in ("5", True, 5.5):
        assert "top_k" not in to_messages({**body, "top_k": odd})
    assert to_messages({**body, "service_tier": "auto"})["service_tier"] == "auto"
    assert "service_tier" not in to_messages({**body, "service_tier": "flex"})


def test_a_json_schema_response_format_is_claudes_structured_output() -> None:
    """A JSON Schema answer format becomes Claude's ``output_config.format`` (valid for
    the anthropic SDK's types), so the answer is held to the schema; plain text asks
    for nothing."""
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    }
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "place", "strict": True, "schema": schema},
    }
    body = {"model": "claude-sonnet-4", "messages": [HI], "response_format": response_format}
    request = to_messages(body)
    assert request["output_config"] == {"format": {"type": "json_schema", "schema": schema}}
    assert_valid_params(request)
    assert "output_config" not in to_messages({**body, "response_format": {"type": "text"}})


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": {"type": "json_object"}}, "response_format"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format.json_schema.schema",
        ),
        ({"functions": [{"name": "f", "parameters": {}}]}, "functions"),
        ({"function_call": "auto"}, "function_call"),
        ({"modalities": ["text", "audio"], "audio": {"voice": "alloy"}}, "audio"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"web_search_options": {}}, "web_search_options"),
        ({"n": 2}, "n"),
    ],
)
def test_what_claude_cannot_honour_is_a_400_not_a_silent_drop(
    fields: dict[str, Any], param: str
) -> None:
    """A request field the client relies on and Claude cannot honour (JSON without a
    schema, legacy functions, audio output, OpenAI's web search) is refused naming it."""
    with pytest.raises(InvalidRequest) as caught:
        to_messages({"model": "claude-sonnet-4", "messages": [HI], **fields})
    assert (caught.value.code, caught.value.param) == ("unsupported_parameter", param)


def test_an_openai_client_gets_the_pdf_to_claude_and_a_400_for_audio(
    anthropic_gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """Through the gateway, the OpenAI SDK's PDF file part reaches Anthropic as a
    document; an audio part is a 400 naming the part and nothing goes upstream."""
    upstream.push(JSONReply(ANSWER))
    audio: Any = {"type": "input_audio", "input_audio": {"data": "UklG", "format": "wav"}}
    pdf: Any = {k: v for k, v in PDF_PART.items() if k != "cache_control"}
    with openai.OpenAI(
        base_url=anthropic_gateway.base_url, api_key="sk-ant-mine", max_retries=0
    ) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(
                model="claude-sonnet-4", messages=[{"role": "user", "content": [audio]}]
            )
        assert upstream.received == []
        error = caught.value.body
        assert isinstance(error, dict)
        assert (error["code"], error["param"]) == ("unsupported_content", "messages[0].content[0]")
        answer = client.chat.completions.create(
            model="claude-sonnet-4",
            messages=[{"role": "user", "content": [pdf, {"type": "text", "text": "Sum up."}]}],
        )
    assert answer.choices[0].message.content == "Sunny."
    sent = upstream.received[0].json()["messages"][0]["content"]
    assert sent[0] == {k: v for k, v in PDF_BLOCK.items() if k != "cache_control"}
