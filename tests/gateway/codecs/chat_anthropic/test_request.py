"""The chat request -> Messages request codec: tau-bench histories become valid Messages
requests (every tool call answered in the next user turn); parameters, tools and tool
choice map across; what Claude cannot honour is a 400."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from bench.compaction import requests_of
from gateway.codecs.chat_anthropic import to_messages
from gateway.errors import InvalidRequest
from tests.gateway.codecs.anthropic_params import assert_valid_params
from tests.gateway.codecs.chat_anthropic.samples import HI, TRACES


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
