"""The chat request made for an OpenAI-compatible upstream from a Messages client's is one
the OpenAI spec accepts, with nothing in it that only Anthropic understands."""

from __future__ import annotations

from typing import Any

from hypothesis import given

from gateway.codecs.chat_anthropic import OPENAI_PARTS
from gateway.codecs.messages import from_request
from gateway.codecs.messages_openai import openai_request
from tests.gateway.codecs.messages.generated import messages_requests
from tests.gateway.codecs.messages.samples import CLAUDE_CODE_TURNS, HI_TURN, REQUEST, round_trip
from tests.openai_schema import assert_valid_request

ANTHROPIC_ONLY = {
    "cache_control",
    "citations",
    "is_error",
    "thinking_blocks",
    "caller",
    "toolset_name",
}


def anthropic_leftovers(request: dict[str, Any]) -> list[str]:
    """What in a chat request only Anthropic would understand, by where it is."""
    found = [f"request.{key}" for key in request if key in ANTHROPIC_ONLY]
    for number, message in enumerate(request["messages"]):
        found += [f"{number}.{key}" for key in message if key in ANTHROPIC_ONLY]
        content = message.get("content")
        for part in content if isinstance(content, list) else ():
            if part["type"] not in OPENAI_PARTS:
                found.append(f"{number}: part {part['type']}")
            found += [f"{number}: part.{key}" for key in part if key in ANTHROPIC_ONLY]
        for call in message.get("tool_calls") or ():
            found += [f"{number}: call.{key}" for key in call if key in ANTHROPIC_ONLY]
    for tool in request.get("tools", ()):
        if set(tool) != {"type", "function"} or tool["type"] != "function":
            found.append(f"tool {tool}")
    return found


def test_an_openai_upstream_gets_a_request_the_openai_spec_accepts() -> None:
    """Markers, error flags, thinking blocks, documents and server tools stay behind;
    images in tool results move to a user message; a stream asks for its usage."""
    request = openai_request(from_request(REQUEST).chat)
    assert_valid_request(request)
    assert anthropic_leftovers(request) == []
    roles = [m["role"] for m in request["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "tool", "user", "user"]
    failed, moved = request["messages"][4:6]
    assert failed["content"] == [{"type": "text", "text": "No such user."}]
    assert moved["content"] == [
        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/"}}
    ]
    assert request["messages"][2]["content"] == [
        {"type": "text", "text": "Let me look that up."},
        {"type": "text", "text": "Found it."},
    ]
    assert [t["function"]["name"] for t in request["tools"]] == ["get_reservation", "get_user"]
    assert request["stream_options"] == {"include_usage": True}
    assert (request["tool_choice"], request["parallel_tool_calls"]) == ("auto", False)


def test_a_tool_choice_an_openai_upstream_could_not_honour_is_left_out() -> None:
    """Naming a server tool, or any tool when only server tools are left, would be an
    error there: the upstream chooses instead."""
    named = {"type": "tool", "name": "web_search"}
    request = {**REQUEST, "tool_choice": named}
    assert "tool_choice" not in openai_request(from_request(request).chat)
    only_server = {**REQUEST, "tools": REQUEST["tools"][2:], "tool_choice": {"type": "any"}}
    sent = openai_request(from_request(only_server).chat)
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & set(sent)


@given(messages_requests())
def test_any_request_becomes_one_the_openai_spec_accepts(request: dict[str, Any]) -> None:
    """Whatever an Anthropic client sends, an OpenAI-compatible upstream gets a valid
    chat request with nothing only Anthropic understands."""
    sent = openai_request(from_request(request).chat)
    assert anthropic_leftovers(sent) == []
    assert_valid_request(sent)


def test_automatic_caching_reaches_the_pipeline_and_only_an_anthropic_upstream() -> None:
    """A top-level ``cache_control`` is in the chat request, where the cache_markers stage
    counts it; an Anthropic upstream gets it as sent, an OpenAI-compatible one none."""
    request = {**REQUEST, "cache_control": {"type": "ephemeral", "ttl": "1h"}}
    split = from_request(request)
    assert split.chat["cache_control"] == request["cache_control"]
    assert round_trip(request) == request
    sent = openai_request(split.chat)
    assert "cache_control" not in sent
    assert_valid_request(sent)


def test_mid_conversation_system_messages_to_an_openai_upstream() -> None:
    """An OpenAI-compatible upstream gets each system message in its place as text, a
    line for a tool it makes available, and not one shown only until a user turn that
    has since come; nothing only Anthropic understands."""
    turns = [*CLAUDE_CODE_TURNS, {"role": "user", "content": "And now?"}]
    sent = openai_request(from_request({**REQUEST, "messages": turns}).chat)
    roles = [m["role"] for m in sent["messages"]]
    assert roles == ["system", "user", "system", "assistant", "tool", "user"]
    assert sent["messages"][2] == {"role": "system", "content": "# Environment\n..."}
    assert anthropic_leftovers(sent) == []
    assert_valid_request(sent)
    current = openai_request(from_request({**REQUEST, "messages": CLAUDE_CODE_TURNS}).chat)
    assert current["messages"][-1] == {
        "role": "system",
        "content": "Only for this turn.\n\n[The tool WebFetch is available from here on.]",
    }


def test_a_tool_change_of_any_shape_becomes_a_line_of_text() -> None:
    """A tool change whose reference is not of a shape the codec knows (a definition that
    is a string, no name at all) still becomes a line for an OpenAI-compatible upstream."""
    for tool in ({"type": "tool_definition", "definition": "assistant"}, {"type": "x"}, "a"):
        turn = {"role": "system", "content": [{"type": "tool_removal", "tool": tool}]}
        sent = openai_request(from_request({**REQUEST, "messages": [HI_TURN, turn]}).chat)
        assert sent["messages"][-1] == {
            "role": "system",
            "content": "[A tool is no longer available from here on.]",
        }
