"""A Messages client's request split into the chat request the pipeline works on and made
again is the request the client sent (a request with every kind of block, every
tau-bench history, generated requests), valid by the anthropic SDK's own types, each
tool with its keys in the client's order."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from bench.compaction import requests_of
from gateway.codecs.chat_anthropic import to_messages
from gateway.codecs.messages import from_request, parse_request, to_request
from gateway.codecs.messages_openai import openai_request
from tests.gateway.codecs.anthropic_params import assert_valid_params
from tests.gateway.codecs.messages.generated import CUSTOM_TOOL, SERVER_TOOL, messages_requests
from tests.gateway.codecs.messages.samples import (
    CLAUDE_CODE_TOOLS,
    EPHEMERAL,
    REQUEST,
    THOUGHT,
    canonical,
    round_trip,
)

ROOT = Path(__file__).resolve().parents[4]
TRACES = ROOT / "bench" / "data" / "tau-bench-gpt-4o-airline.json"


def test_a_request_with_every_kind_of_block_comes_back_as_it_was() -> None:
    """Blocks, their keys and markers, server tools and fields the codec does not know
    reach an Anthropic upstream exactly as the client sent them."""
    assert_valid_params(REQUEST)
    assert round_trip(REQUEST) == REQUEST
    assert to_request(**_split(parse_request(orjson.dumps(REQUEST))), default_max_tokens=1) == (
        REQUEST
    )


def _split(split: Any) -> dict[str, Any]:
    return {"chat": split.chat, "native": split.native}


def test_shorthands_come_back_in_their_canonical_form() -> None:
    """A string content or system is one text block, consecutive turns of a role one
    turn, an answer's tool calls follow its text, and a custom tool's type is implied."""
    call = {"type": "tool_use", "id": "toolu_1", "name": "now", "input": {}}
    request = {
        "model": "claude-haiku-4-5",
        "max_tokens": 100,
        "system": "Be brief.",
        "messages": [
            {"role": "user", "content": "Hi."},
            {"role": "user", "content": "Anyone there?"},
            {"role": "assistant", "content": [call, {"type": "text", "text": "Checking."}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1"}]},
        ],
        "tools": [{"type": "custom", "name": "now", "input_schema": {"type": "object"}}],
    }
    split = from_request(request)
    assert split.chat["messages"][1] == {"role": "user", "content": "Hi."}
    assert split.chat["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "toolu_1",
        "content": None,
    }
    assert round_trip(request) == {
        "model": "claude-haiku-4-5",
        "max_tokens": 100,
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Hi."},
                    {"type": "text", "text": "Anyone there?"},
                ],
            },
            {"role": "assistant", "content": [{"type": "text", "text": "Checking."}, call]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1"}]},
        ],
        "tools": [{"name": "now", "input_schema": {"type": "object"}}],
    }
    assert canonical(request) == round_trip(request)


def test_markers_the_pipeline_adds_land_on_the_last_block_of_their_message() -> None:
    """A message-level cache_control added to the chat form (the cache_markers stage's
    breakpoints) marks the last block each message became, nothing else, and leaves a
    request the SDK's types accept."""
    bare = {
        **REQUEST,
        "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Policy."}],
        "messages": [
            {"role": "user", "content": "Refund?"},
            {
                "role": "assistant",
                "content": [THOUGHT, {"type": "tool_use", "id": "t1", "name": "f", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "cancelled"},
                    {"type": "text", "text": "Well?"},
                    {"type": "text", "text": "Hurry."},
                ],
            },
        ],
    }
    split = from_request(bare)
    for message in split.chat["messages"]:
        message["cache_control"] = EPHEMERAL
    sent = to_request(split.chat, split.native, default_max_tokens=1)
    assert_valid_params(sent)
    marked = {
        **bare,
        "system": [bare["system"][0], {**bare["system"][1], "cache_control": EPHEMERAL}],
    }
    answer, results = (turn["content"] for turn in bare["messages"][1:])
    marked["messages"] = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Refund?", "cache_control": EPHEMERAL}],
        },
        {"role": "assistant", "content": [THOUGHT, {**answer[1], "cache_control": EPHEMERAL}]},
        {
            "role": "user",
            "content": [
                {**results[0], "cache_control": EPHEMERAL},
                results[1],
                {**results[2], "cache_control": EPHEMERAL},
            ],
        },
    ]
    assert sent == marked


def test_every_tau_bench_history_sent_as_a_messages_request_comes_back_as_it_was() -> None:
    """A long agent conversation (tool calls and results, system prompt) written by the
    Anthropic SDK survives the split and the way back unchanged."""
    for trajectory in json.loads(TRACES.read_text()):
        history = requests_of(trajectory["traj"])[-1]
        request = to_messages({"model": "claude-sonnet-4-5", "messages": history})
        split = parse_request(orjson.dumps(request))
        assert to_request(split.chat, split.native, default_max_tokens=1) == request
        assert sum(m["role"] == "tool" for m in split.chat["messages"]) == sum(
            m["role"] == "tool" for m in history
        )
    assert_valid_params(request)


def test_each_tool_comes_back_with_the_clients_key_order() -> None:
    """Claude Code's tools go through the chat form and back with every key in the order
    the client sent it, so in the client's bytes (the provider's prompt cache and the
    thinking prefix check compare them), while the pipeline still sees function tools."""
    request = {
        "model": "claude-sonnet-4-6",
        "max_tokens": 32_000,
        "messages": [{"role": "user", "content": "Fix the failing test."}],
        "tools": CLAUDE_CODE_TOOLS,
    }
    split = parse_request(orjson.dumps(request))
    sent = to_request(split.chat, split.native, default_max_tokens=1)["tools"]
    assert [list(tool.items()) for tool in sent] == [
        list(tool.items()) for tool in CLAUDE_CODE_TOOLS
    ]
    assert orjson.dumps(sent) == orjson.dumps(CLAUDE_CODE_TOOLS)
    assert [tool["type"] for tool in split.chat["tools"]] == ["function"] * 6 + [
        "web_search_20250305",
        "function",
    ]
    assert [tool["function"]["name"] for tool in openai_request(split.chat)["tools"]] == [
        tool["name"] for tool in CLAUDE_CODE_TOOLS if "type" not in tool
    ]


def test_a_tool_the_gateway_changed_keeps_the_clients_key_order() -> None:
    """A marker the pipeline puts on a client's tool comes after that tool's own keys,
    which keep the client's order; a tool the gateway adds is as the codec makes it."""
    from gateway.context.restore import RESTORE_TOOL_NAME, with_restore_tool

    task = CLAUDE_CODE_TOOLS[0]
    request = {**REQUEST, "messages": REQUEST["messages"][:1], "tools": [task]}
    split = from_request(request)
    tooled = with_restore_tool(split.chat)
    assert tooled is not None
    marked = {**tooled, "tools": [{**tooled["tools"][0], "cache_control": EPHEMERAL}]}
    marked["tools"] += tooled["tools"][1:]
    sent = to_request(marked, split.native, default_max_tokens=1)["tools"]
    assert list(sent[0].items()) == [*task.items(), ("cache_control", EPHEMERAL)]
    assert [tool["name"] for tool in sent] == ["Task", RESTORE_TOOL_NAME]
    assert_valid_params({**request, "tools": sent})


@given(messages_requests())
def test_any_valid_request_comes_back_in_canonical_form(request: dict[str, Any]) -> None:
    """Whatever a client sends, an Anthropic upstream gets it again, modulo the API's own
    equivalences, and the request is one the SDK's types accept."""
    split = parse_request(orjson.dumps(request))
    again = to_request(split.chat, split.native, default_max_tokens=1)
    assert again == canonical(request)
    assert_valid_params(again)


@st.composite
def reordered_tools(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Custom and server tools, each with its keys in any order."""
    tools = draw(
        st.lists(st.one_of(CUSTOM_TOOL, SERVER_TOOL), min_size=1, max_size=4, unique_by=_name)
    )
    return [dict(draw(st.permutations(list(tool.items())))) for tool in tools]


def _name(tool: dict[str, Any]) -> Any:
    return tool["name"]


@given(reordered_tools())
def test_any_tools_come_back_with_their_key_order(tools: list[dict[str, Any]]) -> None:
    """Whatever order a client writes a tool's keys in, an Anthropic upstream gets them
    in that order (a custom tool's default type left out)."""
    messages = [{"role": "user", "content": "Hi"}]
    request = {"model": "claude-sonnet-4-5", "max_tokens": 10, "messages": messages, "tools": tools}
    split = parse_request(orjson.dumps(request))
    sent = to_request(split.chat, split.native, default_max_tokens=1)["tools"]
    assert [list(tool.items()) for tool in sent] == [
        list(tool.items()) for tool in canonical(request)["tools"]
    ]


def test_tools_the_gateway_adds_survive_an_empty_tools_field() -> None:
    """A client that sends ``tools: []`` (or an empty system) still gets the tools the
    gateway adds after the pipeline (the restore tool), while a request left as it came
    goes back with its empty fields."""
    from gateway.context.restore import RESTORE_TOOL_NAME, with_restore_tool

    request = {**REQUEST, "system": [], "tools": [], "messages": REQUEST["messages"][:1]}
    split = from_request(request)
    assert round_trip(request) == request
    tooled = with_restore_tool(split.chat)
    assert tooled is not None
    sent = to_request(tooled, split.native, default_max_tokens=1)
    assert [tool["name"] for tool in sent["tools"]] == [RESTORE_TOOL_NAME]
    assert sent["system"] == []
    assert_valid_params(sent)
