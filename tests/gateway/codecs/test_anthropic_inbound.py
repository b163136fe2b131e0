"""The inbound Anthropic codec's request side: a Messages request split into the chat
request the pipeline works on and made again is the request the client sent (a request
with every kind of block, every tau-bench history, generated requests), valid by the
anthropic SDK's own types; the chat request made for an OpenAI-compatible upstream is one
the OpenAI spec accepts, with nothing in it that only Anthropic understands."""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from bench.compaction import requests_of
from gateway.codecs.anthropic import OPENAI_PARTS, to_messages
from gateway.codecs.anthropic_inbound import (
    from_request,
    openai_request,
    parse_request,
    to_request,
)
from pipelines.cache_break import without_markers
from tests.gateway.codecs.anthropic_params import assert_valid_params
from tests.openai_schema import assert_valid_request

ROOT = Path(__file__).resolve().parents[3]
TRACES = ROOT / "bench" / "data" / "tau-bench-gpt-4o-airline.json"
EPHEMERAL = {"type": "ephemeral"}


def round_trip(request: dict[str, Any]) -> dict[str, Any]:
    """``request`` split for the pipeline and made again for an Anthropic upstream."""
    split = from_request(request)
    return to_request(split.chat, split.native, default_max_tokens=1)


def canonical(request: dict[str, Any]) -> dict[str, Any]:
    """``request`` in the canonical form the codec gives back: string content and system
    as one text block (a mid-conversation system message as it came), consecutive turns
    of a role joined, an assistant turn's tool_use
    blocks last, a tool's default ``"type": "custom"`` left out; and, as the API takes no
    marker inside a tool result's content, the last one there marks the tool result
    (unless it has its own)."""
    out = dict(request)
    if isinstance(out.get("system"), str) and out["system"]:
        out["system"] = [{"type": "text", "text": out["system"]}]
    turns: list[dict[str, Any]] = []
    for turn in request["messages"]:
        if turn["role"] == "system":  # a mid-conversation system message, as it came
            turns.append(turn)
            continue
        content = turn["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if turn["role"] == "assistant":
            blocks = [b for b in blocks if b["type"] != "tool_use"] + [
                b for b in blocks if b["type"] == "tool_use"
            ]
        blocks = [_hoisted(b) if b["type"] == "tool_result" else b for b in blocks]
        if turns and turns[-1]["role"] == turn["role"]:
            turns[-1]["content"] = turns[-1]["content"] + blocks
        else:
            turns.append({"role": turn["role"], "content": blocks})
    out["messages"] = turns
    if "tools" in out:
        out["tools"] = [
            {k: v for k, v in tool.items() if (k, v) != ("type", "custom")} for tool in out["tools"]
        ]
    return out


def _hoisted(result: dict[str, Any]) -> dict[str, Any]:
    content = result.get("content")
    nested = [m for b in content for m in _markers(b)] if isinstance(content, list) else []
    if not nested:
        return result
    return {"cache_control": nested[-1], **result, "content": without_markers(content)}


def _markers(block: Any) -> list[Any]:
    """The markers in ``block`` in prompt order: its own after its nested blocks'."""
    if isinstance(block, list):
        return [m for item in block for m in _markers(item)]
    if not isinstance(block, dict):
        return []
    found = [m for key, item in block.items() if key != "cache_control" for m in _markers(item)]
    return found + ([block["cache_control"]] if block.get("cache_control") else [])


PNG = "iVBORw0KGgo="
THOUGHT = {
    "type": "thinking",
    "thinking": "The user wants a refund.",
    "signature": "EqQBCkYIBRgCKkBzaWc=",
}
REDACTED = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4="}
DOCUMENT = {
    "type": "document",
    "source": {"type": "text", "media_type": "text/plain", "data": "Fares are final."},
    "title": "Policy",
    "citations": {"enabled": True},
    "cache_control": EPHEMERAL,
}
UNMARKED_DOCUMENT = {k: v for k, v in DOCUMENT.items() if k != "cache_control"}
"""As a tool result's content carries it: the API takes no marker there."""
REQUEST: dict[str, Any] = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 2048,
    "system": [
        {"type": "text", "text": "You are an airline agent."},
        {"type": "text", "text": "The policy follows.", "cache_control": EPHEMERAL},
    ],
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Refund? Photo attached.", "cache_control": EPHEMERAL},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": PNG},
                    "cache_control": EPHEMERAL,
                },
                {"type": "image", "source": {"type": "url", "url": "https://example.com/t.jpg"}},
                {"type": "image", "source": {"type": "file", "file_id": "file_011"}},
                DOCUMENT,
                {
                    "type": "document",
                    "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"},
                },
                {
                    "type": "search_result",
                    "source": "https://example.com/fares",
                    "title": "Fares",
                    "content": [{"type": "text", "text": "Refunds within 24 h."}],
                    "citations": {"enabled": True},
                },
                {"type": "container_upload", "file_id": "file_012"},
            ],
        },
        {
            "role": "assistant",
            "content": [
                THOUGHT,
                REDACTED,
                {"type": "text", "text": "Let me look that up."},
                {
                    "type": "server_tool_use",
                    "id": "srvtoolu_01",
                    "name": "web_search",
                    "input": {"query": "refund policy"},
                },
                {
                    "type": "web_search_tool_result",
                    "tool_use_id": "srvtoolu_01",
                    "content": [
                        {
                            "type": "web_search_result",
                            "url": "https://example.com/fares",
                            "title": "Fares",
                            "encrypted_content": "Eo8B",
                        }
                    ],
                },
                {
                    "type": "text",
                    "text": "Found it.",
                    "citations": [
                        {
                            "type": "char_location",
                            "cited_text": "Fares are final.",
                            "document_index": 0,
                            "document_title": "Policy",
                            "start_char_index": 0,
                            "end_char_index": 16,
                        }
                    ],
                },
                {
                    "type": "tool_use",
                    "id": "toolu_01",
                    "name": "get_reservation",
                    "input": {"id": "ABC123", "legs": [1, 2.5, None]},
                },
                {
                    "type": "tool_use",
                    "id": "toolu_02",
                    "name": "get_user",
                    "input": {},
                    "cache_control": EPHEMERAL,
                    "caller": {"type": "direct"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01",
                    "content": '{"status": "cancelled"}',
                    "cache_control": EPHEMERAL,
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_02",
                    "content": [
                        {"type": "text", "text": "No such user."},
                        {
                            "type": "image",
                            "source": {
                                "type": "base64",
                                "media_type": "image/jpeg",
                                "data": "/9j/",
                            },
                        },
                        UNMARKED_DOCUMENT,
                    ],
                    "is_error": True,
                },
                {"type": "text", "text": "Well?"},
            ],
        },
    ],
    "tools": [
        {
            "name": "get_reservation",
            "description": "Look a reservation up.",
            "input_schema": {
                "type": "object",
                "properties": {"id": {"type": "string"}},
                "required": ["id"],
            },
            "cache_control": EPHEMERAL,
            "strict": True,
            "input_examples": [{"id": "ABC123"}],
        },
        {"name": "get_user", "input_schema": {"type": "object", "properties": {}}},
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
        {"type": "bash_20250124", "name": "bash"},
        {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
    ],
    "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "metadata": {"user_id": "u-42"},
    "stop_sequences": ["\n\nHuman:"],
    "temperature": 1,
    "top_k": 40,
    "service_tier": "auto",
    "container": "container_01",
    "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
    "x_future_field": {"any": ["thing"]},
    "stream": True,
}


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


def schema(*required: str, **properties: Any) -> dict[str, Any]:
    """A JSON schema as Claude Code writes one (zod's output: ``$schema`` last)."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
        "$schema": "http://json-schema.org/draft-07/schema#",
    }


STRING = {"type": "string"}
CLAUDE_CODE_TOOLS: list[dict[str, Any]] = [
    {
        "name": "Task",
        "description": "Launch a new agent to handle complex, multi-step tasks autonomously.",
        "input_schema": schema("description", "prompt", description=STRING, prompt=STRING),
    },
    {
        "name": "Bash",
        "description": "Executes a given bash command in a persistent shell session.",
        "input_schema": schema("command", command=STRING, timeout={"type": "number"}),
        "strict": True,
    },
    {
        "name": "Read",
        "input_schema": schema("file_path", file_path=STRING, offset={"type": "number"}),
        "description": "Reads a file from the local filesystem.",
    },
    {
        "name": "Edit",
        "description": "Performs exact string replacements in files.",
        "input_examples": [{"file_path": "/src/app.py", "old_string": "a", "new_string": "b"}],
        "input_schema": schema("file_path", file_path=STRING, old_string=STRING, new_string=STRING),
    },
    {
        "defer_loading": True,
        "name": "mcp__github__search_issues",
        "description": "Search issues and pull requests across GitHub repositories.",
        "input_schema": schema("query", query=STRING),
    },
    {
        "name": "mcp__linear__create_issue",
        "strict": False,
        "input_schema": schema("title", title=STRING, team=STRING),
        "defer_loading": True,
        "description": "Create a Linear issue.",
    },
    {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
    {
        "name": "TodoWrite",
        "cache_control": EPHEMERAL,
        "description": "Create and manage a structured task list for the session.",
        "input_schema": schema("todos", todos={"type": "array", "items": STRING}),
        "input_examples": [{"todos": ["Run the tests"]}],
    },
]
"""Tools as a Claude-Code-like agent sends them: its own, MCP ones deferred for the tool
search, a server tool, the last one marked; their keys in the order each was made with."""


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


# -- generated requests --------------------------------------------------------------------

TEXT = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=12)
NAME = st.from_regex(r"[a-z_]{1,12}", fullmatch=True)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6,
)
OBJECTS = st.dictionaries(TEXT, JSON, max_size=3)
CACHE = st.sampled_from([EPHEMERAL, {"type": "ephemeral", "ttl": "1h"}])
URLS = st.sampled_from(["https://example.com/a.png", "https://example.org/b?c=d"])
CITATION = TEXT.map(
    lambda text: {
        "type": "char_location",
        "cited_text": text,
        "document_index": 0,
        "document_title": None,
        "start_char_index": 0,
        "end_char_index": len(text),
    }
)
PLAIN_TEXT = st.fixed_dictionaries({"type": st.just("text"), "text": TEXT})
TEXT_BLOCK = st.fixed_dictionaries(
    {"type": st.just("text"), "text": TEXT},
    optional={"cache_control": CACHE, "citations": st.lists(CITATION, max_size=1)},
)
IMAGE = st.fixed_dictionaries(
    {
        "type": st.just("image"),
        "source": st.one_of(
            st.fixed_dictionaries(
                {
                    "type": st.just("base64"),
                    "media_type": st.sampled_from(["image/png", "image/jpeg", "image/webp"]),
                    "data": st.text(string.ascii_letters + string.digits + "+/=", min_size=1),
                }
            ),
            st.fixed_dictionaries({"type": st.just("url"), "url": URLS}),
            st.fixed_dictionaries({"type": st.just("file"), "file_id": st.just("file_01")}),
        ),
    },
    optional={
        "cache_control": CACHE,
        "transformations": st.just({"oversized_image": "downsize"}),
    },
)
DOCUMENT_BLOCK = st.fixed_dictionaries(
    {
        "type": st.just("document"),
        "source": st.one_of(
            st.fixed_dictionaries(
                {"type": st.just("text"), "media_type": st.just("text/plain"), "data": TEXT}
            ),
            st.fixed_dictionaries(
                {
                    "type": st.just("base64"),
                    "media_type": st.just("application/pdf"),
                    "data": st.just("JVBE"),
                }
            ),
        ),
    },
    optional={"title": TEXT, "cache_control": CACHE, "citations": st.just({"enabled": True})},
)
SEARCH_RESULT = st.fixed_dictionaries(
    {
        "type": st.just("search_result"),
        "source": URLS,
        "title": TEXT,
        "content": st.lists(PLAIN_TEXT, min_size=1, max_size=2),
    },
    optional={"cache_control": CACHE},
)
USER_BLOCK = st.one_of(TEXT_BLOCK, IMAGE, DOCUMENT_BLOCK, SEARCH_RESULT)
THINKING = st.one_of(
    st.fixed_dictionaries({"type": st.just("thinking"), "thinking": TEXT, "signature": TEXT}),
    st.fixed_dictionaries({"type": st.just("redacted_thinking"), "data": TEXT}),
)
SERVER_TOOL_TURN = TEXT.map(
    lambda query: [
        {
            "type": "server_tool_use",
            "id": "srvtoolu_1",
            "name": "web_search",
            "input": {"q": query},
        },
        {
            "type": "web_search_tool_result",
            "tool_use_id": "srvtoolu_1",
            "content": [
                {
                    "type": "web_search_result",
                    "url": "https://e.com",
                    "title": query,
                    "encrypted_content": "E",
                }
            ],
        },
    ]
)


def tool_use(call_id: str) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"type": st.just("tool_use"), "id": st.just(call_id), "name": NAME, "input": OBJECTS},
        optional={"cache_control": CACHE, "caller": st.just({"type": "direct"})},
    )


def tool_result(call_id: str) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"type": st.just("tool_result"), "tool_use_id": st.just(call_id)},
        optional={
            "content": st.one_of(st.text(max_size=12), st.lists(USER_BLOCK, max_size=3)),
            "is_error": st.booleans(),
            "cache_control": CACHE,
            "toolset_name": NAME,
        },
    )


CUSTOM_TOOL = st.fixed_dictionaries(
    {
        "name": NAME,
        "input_schema": st.builds(
            lambda names: {"type": "object", "properties": {n: {"type": "string"} for n in names}},
            st.lists(NAME, max_size=2),
        ),
    },
    optional={
        "type": st.just("custom"),
        "description": TEXT,
        "cache_control": CACHE,
        "strict": st.booleans(),
        "input_examples": st.lists(OBJECTS, max_size=1),
    },
)
SERVER_TOOL = st.sampled_from(
    [
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 2},
        {"type": "bash_20250124", "name": "bash"},
        {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
    ]
)
TOOL_CHOICE = st.one_of(
    st.just({"type": "none"}),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["auto", "any"])},
        optional={"disable_parallel_tool_use": st.booleans()},
    ),
    st.fixed_dictionaries(
        {"type": st.just("tool"), "name": NAME},
        optional={"disable_parallel_tool_use": st.booleans()},
    ),
)
OPTIONAL_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "system": st.one_of(TEXT, st.lists(TEXT_BLOCK, min_size=1, max_size=3)),
        "tools": st.lists(st.one_of(CUSTOM_TOOL, SERVER_TOOL), min_size=1, max_size=3),
        "tool_choice": TOOL_CHOICE,
        "thinking": st.one_of(
            st.just({"type": "disabled"}),
            st.integers(1024, 4096).map(lambda n: {"type": "enabled", "budget_tokens": n}),
        ),
        "metadata": st.fixed_dictionaries({"user_id": TEXT}),
        "temperature": st.floats(0, 1),
        "top_p": st.floats(0, 1),
        "top_k": st.integers(1, 500),
        "stop_sequences": st.lists(TEXT, max_size=4),
        "cache_control": CACHE,
        "stream": st.booleans(),
        "service_tier": st.sampled_from(["auto", "standard_only"]),
        "x_future_field": JSON,
    },
)


SYSTEM_TURN = st.fixed_dictionaries(
    {"role": st.just("system")},
    optional={
        "content": st.one_of(
            TEXT,
            st.lists(
                st.one_of(
                    TEXT_BLOCK,
                    NAME.map(
                        lambda name: {
                            "type": "tool_addition",
                            "tool": {"type": "tool_reference", "name": name},
                        }
                    ),
                ),
                min_size=1,
                max_size=2,
            ),
        ),
        "clear_at": st.sampled_from(["next_user_message", "never"]),
        "output_config": st.sampled_from([{}, {"effort": "medium"}]),
    },
).filter(lambda turn: "content" in turn or "output_config" in turn)
"""A mid-conversation system message (Claude Code's instructions after the user's turn)."""


@st.composite
def messages_requests(draw: st.DrawFn) -> dict[str, Any]:
    """Valid Messages requests: alternating turns, each answer's tool calls answered in
    the next user turn, every kind of block in the places the API takes it, and
    mid-conversation system messages after user turns."""
    turns: list[dict[str, Any]] = []
    calls: list[str] = []
    for number in range(draw(st.integers(1, 6))):
        if number % 2 == 0:
            blocks = [draw(tool_result(call)) for call in calls]
            blocks += draw(st.lists(USER_BLOCK, max_size=3))
            use_string = not calls and (not blocks or draw(st.booleans()))
            turns.append({"role": "user", "content": draw(TEXT) if use_string else blocks})
            turns += draw(st.lists(SYSTEM_TURN, max_size=2))
        else:
            blocks = draw(st.lists(THINKING, max_size=2))
            for piece in draw(
                st.lists(
                    st.one_of(
                        TEXT_BLOCK.map(lambda b: [b]), SERVER_TOOL_TURN, THINKING.map(lambda b: [b])
                    ),
                    max_size=3,
                )
            ):
                blocks += piece
            calls = [f"toolu_{number}_{k}" for k in range(draw(st.integers(0, 2)))]
            blocks += [draw(tool_use(call)) for call in calls]
            if draw(st.booleans()):
                blocks = draw(st.permutations(blocks))
            turns.append({"role": "assistant", "content": blocks or draw(TEXT)})
    request = {
        "model": draw(st.sampled_from(["claude-sonnet-4-5", "claude-opus-4-1"])),
        "max_tokens": draw(st.integers(1, 64_000)),
        "messages": turns,
    }
    return {**request, **draw(OPTIONAL_FIELDS)}


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


# -- the OpenAI side -----------------------------------------------------------------------

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


CLAUDE_CODE_TURNS: list[Any] = [
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "<system-reminder>\nAttribution...\n</system-reminder>\n"},
            {"type": "text", "text": "Fix the failing test."},
        ],
    },
    {"role": "system", "output_config": {"effort": "medium"}, "content": "# Environment\n..."},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "", "signature": "c2ln"},
            {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}},
        ],
    },
    {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a"}],
    },
    {
        "role": "system",
        "clear_at": "next_user_message",
        "content": [
            {"type": "text", "text": "Only for this turn."},
            {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "WebFetch"}},
        ],
    },
]
"""A history as Claude Code sends it on its default model: mid-conversation system
messages after user turns, one with a per-turn setting, one shown until the next user
turn that also makes a tool available."""


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


HI_TURN = {"role": "user", "content": "Hi"}


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
