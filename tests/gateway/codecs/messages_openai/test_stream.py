"""An OpenAI-compatible upstream's stream, translated chunk by chunk, is read by the
official anthropic SDK as the answer of the whole completion (every recorded OpenAI
stream, and the recorded Anthropic streams as the gateway's Anthropic provider turns them
into chunks); an error mid-stream is one error event the SDK raises."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import orjson
import pytest
from anthropic.types import Message
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from gateway.codecs.chat_anthropic import ChunkTranslator
from gateway.codecs.messages_openai import EventTranslator, message_of
from tests.gateway.codecs.chat_anthropic.samples import REDACTED, THOUGHT, thinking_events
from tests.gateway.codecs.messages_openai.completions import chunk, completion_of, usage_chunk
from tests.mock_upstream import MockUpstream, SSEReply, recorded_stream, recorded_streams

ANTHROPIC_STREAMS = Path(__file__).resolve().parents[4] / "tests" / "fixtures" / "anthropic-sse"


def events_of(chunks: list[dict[str, Any]]) -> list[bytes]:
    translator = EventTranslator()
    events = [event for c in chunks for event in translator.add(c)]
    return events + translator.close()


def sdk_answer(upstream: MockUpstream, events: list[bytes]) -> Message:
    """The answer the official SDK makes of ``events``, read from the mock over HTTP."""
    upstream.push(SSEReply(events))
    with (
        anthropic.Anthropic(
            base_url=upstream.base_url.removesuffix("/v1"), api_key="sk-ant-test", max_retries=0
        ) as client,
        client.messages.stream(
            model="claude-sonnet-4", max_tokens=100, messages=[{"role": "user", "content": "Hi"}]
        ) as stream,
    ):
        return stream.get_final_message()


def openai_answer(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """The completion the OpenAI SDK's own accumulator makes of ``chunks``."""
    state: ChatCompletionStreamState[None] = ChatCompletionStreamState()
    for piece in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(piece))
    return state.current_completion_snapshot.model_dump(mode="json", exclude_none=True)


def assert_same_answer(final: Message, expected: dict[str, Any]) -> None:
    got = final.model_dump(mode="json", exclude_none=True)
    assert got["content"] == expected["content"]
    assert got["stop_reason"] == expected["stop_reason"]
    assert got["usage"] == expected["usage"]
    assert (got["id"], got["model"]) == (expected["id"], expected["model"])


def recorded_chunks(name: str) -> list[dict[str, Any]]:
    data = [e.removeprefix(b"data: ").strip() for e in recorded_stream(name)]
    return [orjson.loads(d) for d in data if d != b"[DONE]"]


def anthropic_chunks(name: str) -> Iterator[dict[str, Any]]:
    """A recorded Messages stream as the gateway's Anthropic provider relays it."""
    translator = ChunkTranslator(include_usage=True)
    for line in (ANTHROPIC_STREAMS / name).read_text().splitlines():
        if line.startswith("data: "):
            yield from translator.add(orjson.loads(line[6:]))


@pytest.mark.parametrize("name", recorded_streams())
def test_a_recorded_openai_stream_reads_in_the_sdk_as_the_whole_answer(
    upstream: MockUpstream, name: str
) -> None:
    """Text, refusals, tool calls (several, with arguments in pieces), finish reason and
    usage add up, in the official anthropic SDK, to the answer of the whole completion."""
    chunks = recorded_chunks(name)
    assert_same_answer(sdk_answer(upstream, events_of(chunks)), message_of(openai_answer(chunks)))


@pytest.mark.parametrize("name", sorted(p.name for p in ANTHROPIC_STREAMS.glob("*.txt")))
def test_an_anthropic_stream_relayed_as_chunks_reads_as_the_whole_answer(
    upstream: MockUpstream, name: str
) -> None:
    """Claude's own recorded answers, through the provider's chunks and back, read the
    same in the SDK as the completion they add up to (a cut-off call included)."""
    chunks = list(anthropic_chunks(name))
    assert_same_answer(sdk_answer(upstream, events_of(chunks)), message_of(openai_answer(chunks)))


def test_streamed_reasoning_becomes_signed_thinking_blocks(upstream: MockUpstream) -> None:
    """Reasoning deltas stream into a thinking block that the signed block closes; a
    redacted block comes whole; then the text and the tool call."""
    thought = {"type": "thinking", "thinking": "Paris in May.", "signature": "c2ln"}
    redacted = {"type": "redacted_thinking", "data": "EmwK"}
    call = {"index": 0, "id": "call_1", "type": "function"}
    chunks = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning_content": "Paris "}),
        chunk({"reasoning_content": "in May."}),
        chunk({"thinking_blocks": [thought]}),
        chunk({"thinking_blocks": [redacted]}),
        chunk({"content": "Mild."}),
        chunk({"tool_calls": [{**call, "function": {"name": "weather", "arguments": ""}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
        chunk({}, "tool_calls"),
        usage_chunk(50, 12, cached=30),
    ]
    events = events_of(chunks)
    kinds = [e.split(b"\n", 1)[0].removeprefix(b"event: ").decode() for e in events]
    assert kinds == [
        "message_start",
        *["content_block_start", "content_block_delta", "content_block_delta"],
        *["content_block_delta", "content_block_stop"],
        *["content_block_start", "content_block_stop"],
        *["content_block_start", "content_block_delta", "content_block_stop"],
        *["content_block_start", "content_block_delta", "content_block_delta"],
        *["content_block_stop", "message_delta", "message_stop"],
    ]
    # The OpenAI SDK cannot add up two thinking_blocks deltas (entries without an
    # index), so the whole completion is written out.
    whole = completion_of(
        {
            "role": "assistant",
            "content": "Mild.",
            "reasoning_content": "Paris in May.",
            "thinking_blocks": [thought, redacted],
            "tool_calls": [
                {**call, "function": {"name": "weather", "arguments": '{"city":"Paris"}'}}
            ],
        },
        "tool_calls",
        usage_chunk(50, 12, cached=30)["usage"],
    )
    assert_same_answer(sdk_answer(upstream, events), message_of(whole))


def test_claude_thinking_relayed_as_chunks_comes_back_as_claude_wrote_it(
    upstream: MockUpstream,
) -> None:
    """Claude's thinking and redacted thinking blocks, through the provider's chunks
    (which number them for the OpenAI SDK) and back to Messages events, read in the SDK
    as the very blocks Claude wrote, as does the completion the chunks add up to."""
    events = thinking_events({"type": "text", "text": ""}, {"type": "text_delta", "text": "Mild."})
    translator = ChunkTranslator(include_usage=True)
    chunks = [chunk for event in events for chunk in translator.add(event)]
    whole = message_of(openai_answer(chunks))
    assert whole["content"] == [THOUGHT, REDACTED, {"type": "text", "text": "Mild."}]
    assert_same_answer(sdk_answer(upstream, events_of(chunks)), whole)


def test_parallel_calls_whose_pieces_interleave_land_in_their_own_blocks(
    upstream: MockUpstream,
) -> None:
    """Some servers stream several calls' arguments interleaved: each piece still goes
    to its own call."""

    def piece(index: int, arguments: str, name: str | None = None) -> dict[str, Any]:
        call: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
        if name is not None:
            call.update(id=f"call_{index}", type="function")
            call["function"]["name"] = name
        return chunk({"tool_calls": [call]})

    chunks = [
        piece(0, "", "weather"),
        piece(1, '{"city":', "weather"),
        piece(0, '{"city":'),
        piece(1, ' "Rome"}'),
        piece(0, ' "Paris"}'),
        chunk({}, "tool_calls"),
    ]
    final = sdk_answer(upstream, events_of(chunks))
    assert [(b.id, b.input) for b in final.content if b.type == "tool_use"] == [
        ("call_0", {"city": "Paris"}),
        ("call_1", {"city": "Rome"}),
    ]
    assert_same_answer(final, message_of(openai_answer(chunks)))


def test_usage_on_the_last_choice_chunk_and_no_usage_at_all_still_end_well(
    upstream: MockUpstream,
) -> None:
    """Servers that put the usage on the finishing chunk, or send none, still give a
    complete answer; an empty stream is an empty answer."""
    finishing = {**chunk({}, "stop"), "usage": usage_chunk(9, 2)["usage"]}
    final = sdk_answer(upstream, events_of([chunk({"content": "Hi."}), finishing]))
    assert (final.usage.input_tokens, final.usage.output_tokens) == (9, 2)
    final = sdk_answer(upstream, events_of([chunk({"content": "Hi."})]))
    assert (final.stop_reason, final.usage.output_tokens) == ("end_turn", 0)
    final = sdk_answer(upstream, events_of([]))
    assert (final.content, final.stop_reason) == ([], "end_turn")


def test_an_error_mid_stream_is_one_error_event_the_sdk_raises(upstream: MockUpstream) -> None:
    """The client's SDK raises it as an API error with the upstream's message, and
    nothing follows it."""
    translator = EventTranslator()
    events = translator.add(chunk({"content": "Partial"}))
    events += translator.add({"error": {"message": "Overloaded", "type": "overloaded_error"}})
    assert translator.add(chunk({"content": " more"})) == translator.close() == []
    error = events[-1]
    assert error.startswith(b"event: error\ndata: ")
    assert orjson.loads(error.split(b"data: ", 1)[1]) == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded"},
    }
    assert sum(e.startswith(b"event: error") for e in events) == 1
    with pytest.raises(anthropic.APIError, match="Overloaded"):
        sdk_answer(upstream, events)


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (
            {"message": "slow", "type": "upstream_error", "code": "upstream_timeout"},
            "timeout_error",
        ),
        (
            {"message": "broke", "type": "upstream_error", "code": "upstream_stream_error"},
            "api_error",
        ),
        ({"message": "calm", "type": "tokens", "code": "rate_limit_exceeded"}, "rate_limit_error"),
        ("plain text", "api_error"),
        ({"type": ["odd"], "message": 5}, "api_error"),
    ],
)
def test_error_chunks_of_other_shapes_get_an_anthropic_type(error: Any, kind: str) -> None:
    """The gateway's own terminal errors and OpenAI's become the nearest Anthropic type."""
    (event,) = EventTranslator().add({"error": error})
    assert orjson.loads(event.split(b"data: ", 1)[1])["error"]["type"] == kind
