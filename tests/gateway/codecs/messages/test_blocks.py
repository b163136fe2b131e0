"""A Messages request's system prompt, turns and blocks as the pipeline sees them: in
OpenAI form where a stage looks for them, what has no exact OpenAI form as it is, and
mid-conversation system messages in their place."""

from __future__ import annotations

import orjson

from gateway.codecs.messages import from_request, parse_request, to_request
from tests.gateway.codecs.anthropic_params import assert_valid_params
from tests.gateway.codecs.messages.samples import (
    CLAUDE_CODE_TURNS,
    EPHEMERAL,
    PNG,
    REDACTED,
    REQUEST,
    THOUGHT,
    canonical,
    round_trip,
)


def test_the_pipeline_sees_the_conversation_in_openai_form() -> None:
    """Tool results are tool messages, images image_url parts, reasoning and tool calls
    where an OpenAI-format stage looks for them; the rest is carried alongside."""
    split = from_request(REQUEST)
    chat = split.chat
    roles = [m["role"] for m in chat["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "tool", "user"]
    system, user, assistant, found, failed, after = chat["messages"]
    assert system["content"] == REQUEST["system"]
    assert [p["type"] for p in user["content"]] == [
        "text",
        "image_url",
        "image_url",
        "image",
        "document",
        "document",
        "search_result",
        "container_upload",
    ]
    assert user["content"][1] == {
        "type": "image_url",
        "image_url": {"url": f"data:image/png;base64,{PNG}"},
        "cache_control": EPHEMERAL,
    }
    assert user["content"][2]["image_url"] == {"url": "https://example.com/t.jpg"}
    assert assistant["thinking_blocks"] == [THOUGHT, REDACTED]
    assert assistant["reasoning_content"] == THOUGHT["thinking"]
    assert [p["type"] for p in assistant["content"]] == [
        "text",
        "server_tool_use",
        "web_search_tool_result",
        "text",
    ]
    first, second = assistant["tool_calls"]
    assert first["function"] == {
        "name": "get_reservation",
        "arguments": '{"id":"ABC123","legs":[1,2.5,null]}',
    }
    assert second["cache_control"] == EPHEMERAL
    assert found == {
        "role": "tool",
        "tool_call_id": "toolu_01",
        "content": '{"status": "cancelled"}',
        "cache_control": EPHEMERAL,
    }
    assert failed["is_error"] is True
    assert [p["type"] for p in failed["content"]] == ["text", "image_url", "document"]
    assert after == {"role": "user", "content": [{"type": "text", "text": "Well?"}]}
    assert chat["tools"][0] == {
        "type": "function",
        "function": {
            "name": "get_reservation",
            "description": "Look a reservation up.",
            "parameters": REQUEST["tools"][0]["input_schema"],
        },
        "cache_control": EPHEMERAL,
        "strict": True,
        "input_examples": [{"id": "ABC123"}],
    }
    assert chat["tools"][2:] == REQUEST["tools"][2:]
    assert (chat["tool_choice"], chat["parallel_tool_calls"]) == ("auto", False)
    assert chat["stop"] == ["\n\nHuman:"]
    assert {k: chat[k] for k in ("max_tokens", "temperature", "stream")} == {
        "max_tokens": 2048,
        "temperature": 1,
        "stream": True,
    }
    assert set(split.native) == {
        "tools",
        "tool_choice",
        "thinking",
        "metadata",
        "stop_sequences",
        "top_k",
        "service_tier",
        "container",
        "context_management",
        "x_future_field",
    }


def test_what_has_no_exact_openai_form_is_carried_as_it_is() -> None:
    """An image with a key an image_url part cannot hold, a URL that would read back as
    inline data, a tool whose schema would not come back: each goes through untouched."""
    resized = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": PNG},
        "transformations": {"oversized_image": "downsize"},
    }
    lookalike = {"type": "image", "source": {"type": "url", "url": f"data:image/png;base64,{PNG}"}}
    schemaless = {"name": "ping", "input_schema": {}}
    request = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": [resized, lookalike]}],
        "tools": [schemaless],
    }
    chat = from_request(request).chat
    assert chat["messages"][0]["content"] == [resized, lookalike]
    assert chat["tools"] == [schemaless]
    assert round_trip(request) == request


def test_mid_conversation_system_messages_keep_their_place() -> None:
    """Claude Code's system messages inside ``messages`` reach the pipeline as system
    messages in their place, marked as turns of the history (not the system prompt), and
    an Anthropic upstream gets them back exactly where and as they were."""
    request = {**REQUEST, "messages": CLAUDE_CODE_TURNS}
    split = parse_request(orjson.dumps(request))
    chat = split.chat["messages"]
    assert [m["role"] for m in chat] == ["system", "user", "system", "assistant", "tool", "system"]
    assert [m.get("system_turn") for m in chat] == [None, None, True, None, None, True]
    assert chat[2]["output_config"] == {"effort": "medium"}
    again = to_request(split.chat, split.native, default_max_tokens=1)
    assert again["messages"] == [*canonical(request)["messages"]]
    assert again["messages"][1] == CLAUDE_CODE_TURNS[1]
    assert again["system"] == canonical(REQUEST)["system"]
    assert_valid_params(again)
