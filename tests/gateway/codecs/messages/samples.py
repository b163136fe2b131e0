"""Messages requests for the codec tests, shared with the route tests: one with every kind
of block, Claude Code's tools and turns, and the canonical form the codec gives every
valid request back in."""

from __future__ import annotations

from typing import Any

from gateway.codecs.messages import from_request, to_request
from pipelines.cache_break import without_markers

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


HI_TURN = {"role": "user", "content": "Hi"}
