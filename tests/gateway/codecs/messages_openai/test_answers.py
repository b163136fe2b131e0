"""An OpenAI-compatible upstream's completion is a Messages answer the anthropic SDK
accepts; its errors reach an Anthropic client in its own shape, and its SDK raises them."""

from __future__ import annotations

import anthropic
import orjson
import pytest
from anthropic.types import Message

from gateway.codecs.messages_openai import error_from_openai, message_of
from tests.gateway.codecs.messages_openai.completions import completion_of
from tests.mock_upstream import JSONReply, MockUpstream


def test_a_completion_becomes_an_answer_the_anthropic_sdk_accepts() -> None:
    """Reasoning, text and tool calls become thinking, text and tool_use blocks; the
    cached part of the prompt is reported as a cache read."""
    answer = message_of(
        completion_of(
            {
                "role": "assistant",
                "content": "Checking both.",
                "reasoning_content": "Two cities.",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                    },
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "now", "arguments": ""},
                    },
                    {
                        "id": "call_3",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '["Rome"]'},
                    },
                ],
            },
            "tool_calls",
            {
                "prompt_tokens": 1_200,
                "completion_tokens": 40,
                "total_tokens": 1_240,
                "prompt_tokens_details": {"cached_tokens": 1_000},
            },
        )
    )
    Message.model_validate(answer)
    assert answer["content"] == [
        {"type": "thinking", "thinking": "Two cities.", "signature": ""},
        {"type": "text", "text": "Checking both."},
        {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "call_2", "name": "now", "input": {}},
        {"type": "tool_use", "id": "call_3", "name": "weather", "input": {}},
    ]
    assert (answer["type"], answer["role"], answer["model"]) == (
        "message",
        "assistant",
        "qwen3-coder",
    )
    assert (answer["stop_reason"], answer["stop_sequence"]) == ("tool_use", None)
    assert answer["usage"] == {
        "input_tokens": 200,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 1_000,
        "output_tokens": 40,
    }


@pytest.mark.parametrize(
    ("finish", "stop"),
    [
        ("stop", "end_turn"),
        ("length", "max_tokens"),
        ("tool_calls", "tool_use"),
        ("function_call", "tool_use"),
        ("content_filter", "refusal"),
        (None, "end_turn"),
    ],
)
def test_finish_reasons_become_stop_reasons(finish: str | None, stop: str) -> None:
    """An agent loop keyed on stop_reason (tool_use: run the tools; max_tokens: carry
    on) sees the reason the upstream gave."""
    answer = message_of(completion_of({"role": "assistant", "content": "Hi"}, finish, {}))  # type: ignore[arg-type]
    assert answer["stop_reason"] == stop
    Message.model_validate(answer)


def test_signed_thinking_blocks_refusals_and_cut_off_calls_come_through() -> None:
    """Thinking blocks with their signatures are kept whole (the next request needs
    them); a refusal is said as text; a call cut off by the token limit keeps what can
    be read of its arguments, as the SDK reads a stream's."""
    blocks = [
        {"type": "thinking", "thinking": "Hm.", "signature": "c2ln"},
        {"type": "redacted_thinking", "data": "EmwK"},
        {"type": "thinking", "thinking": "Unsigned."},
    ]
    answer = message_of(
        completion_of(
            {
                "role": "assistant",
                "content": None,
                "refusal": "I can't help with that.",
                "reasoning_content": "Hm.",
                "thinking_blocks": blocks,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {
                            "name": "save",
                            "arguments": '{"path": "a.txt", "text": "Dear',
                        },
                    }
                ],
            },
            "length",
            {},
        )
    )
    Message.model_validate(answer)
    assert answer["content"] == [
        *blocks[:2],
        {"type": "thinking", "thinking": "Unsigned.", "signature": ""},
        {"type": "text", "text": "I can't help with that."},
        {"type": "tool_use", "id": "call_1", "name": "save", "input": {"path": "a.txt"}},
    ]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            b'{"error": {"message": "Rate limit reached for gpt-4o", "type": "tokens",'
            b' "param": null, "code": "rate_limit_exceeded"}}',
            "Rate limit reached for gpt-4o",
        ),
        (b'{"error": "model not loaded"}', "model not loaded"),
        (b'{"detail": "Not Found"}', '{"detail": "Not Found"}'),
        (b"<html>Bad Gateway</html>", "<html>Bad Gateway</html>"),
        (b"\xff\xfe", "\ufffd\ufffd"),
        (b"", "The upstream answered with status 429."),
    ],
)
def test_an_openai_upstream_error_keeps_its_message(body: bytes, message: str) -> None:
    """Whatever the upstream wrote, the client reads its message in the Anthropic shape."""
    assert orjson.loads(error_from_openai(429, body)) == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": message},
    }


@pytest.mark.parametrize(
    ("status", "raised"),
    [
        (400, anthropic.BadRequestError),
        (401, anthropic.AuthenticationError),
        (429, anthropic.RateLimitError),
        (529, anthropic.APIStatusError),
    ],
)
def test_the_sdk_raises_a_rewritten_error_as_its_own(
    upstream: MockUpstream, status: int, raised: type[Exception]
) -> None:
    """An Anthropic client catches the upstream's error as it would Anthropic's."""
    body = b'{"error": {"message": "Upstream says no.", "type": "x", "param": null, "code": null}}'
    upstream.push(JSONReply(error_from_openai(status, body), status=status))
    with (
        anthropic.Anthropic(
            base_url=upstream.base_url.removesuffix("/v1"), api_key="sk-ant-test", max_retries=0
        ) as client,
        pytest.raises(raised, match=r"Upstream says no\.") as caught,
    ):
        client.messages.create(
            model="claude-sonnet-4", max_tokens=10, messages=[{"role": "user", "content": "Hi"}]
        )
    assert isinstance(caught.value, anthropic.APIStatusError)
    assert caught.value.body == orjson.loads(error_from_openai(status, body))
