"""JSON Schemas of what the gateway's POST routes accept, for its OpenAPI document.

They are compact, and no looser than the codecs (``gateway/codecs/``: ``openai.py``,
``messages/checks.py``): a body they call valid is not refused for its shape. Fields the
codecs do not read are forwarded, so the objects stay open (``additionalProperties``), and
the fields with which other gateways let a request choose its upstream are absent by
schema as they are refused by the gateway.
"""

from __future__ import annotations

from typing import Any, Final

from gateway.codecs.chat_anthropic import OPENAI_PARTS
from gateway.codecs.messages import ROLES, THINKING_KINDS, TURN_BLOCKS
from gateway.context.compaction import UPSTREAM_CHOICES

__all__ = ["SCHEMAS"]

_STRING: Final = {"type": "string"}
_OBJECT: Final = {"type": "object", "additionalProperties": True}
_NO_UPSTREAM_CHOICE: Final = {field: False for field in sorted(UPSTREAM_CHOICES)}


def _open(required: list[str], properties: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """An object with ``properties`` that lets any other property through."""
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return {**schema, **extra, "additionalProperties": True}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


_ROLES: Final = ["system", "developer", "user", "assistant", "tool", "function"]

_CHAT_PART = {
    "anyOf": [
        _open(["type", "text"], {"type": {"const": "text"}, "text": _STRING}),
        _open(
            ["type", "image_url"],
            {"type": {"const": "image_url"}, "image_url": _open(["url"], {"url": _STRING})},
        ),
        _open(["type"], {"type": {"type": "string", "not": {"enum": ["text", "image_url"]}}}),
    ],
    "description": "A content part: text, an image, or any other part with a string `type`.",
}

_CHAT_MESSAGE = _open(
    ["role"],
    {
        "role": {"enum": _ROLES},
        "content": {"anyOf": [_STRING, {"type": "null"}, {"type": "array", "items": _CHAT_PART}]},
        "name": _STRING,
        "tool_call_id": _STRING,
        "reasoning_content": _STRING,
        "tool_calls": {
            "type": "array",
            "items": _open(
                [],
                {
                    "id": _STRING,
                    "type": _STRING,
                    "function": _open([], {"name": _STRING, "arguments": _STRING}),
                },
            ),
        },
    },
)

_CHAT_TOOL = _open(
    ["type", "function"],
    {
        "type": {"const": "function"},
        "function": _open(
            ["name"], {"name": _STRING, "description": _STRING, "parameters": _OBJECT}
        ),
    },
)

_CHAT_REQUEST = _open(
    ["model", "messages"],
    {
        "model": {"type": "string", "minLength": 1},
        "messages": {"type": "array", "minItems": 1, "items": _ref("ChatMessage")},
        "stream": {"type": "boolean"},
        "stream_options": _open([], {"include_usage": {"type": "boolean"}}),
        "tools": {"type": "array", "items": _CHAT_TOOL},
        "tool_choice": {"anyOf": [{"enum": ["none", "auto", "required"]}, _OBJECT]},
        "parallel_tool_calls": {"type": "boolean"},
        "max_tokens": {"type": "integer", "minimum": 1},
        "max_completion_tokens": {"type": "integer", "minimum": 1},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "minimum": 0, "maximum": 1},
        "stop": {"anyOf": [_STRING, {"type": "array", "items": _STRING, "maxItems": 4}]},
        "reasoning_effort": {"enum": ["low", "medium", "high"]},
        "response_format": _OBJECT,
        "user": _STRING,
        **_NO_UPSTREAM_CHOICE,
    },
    description="An OpenAI chat completion request; unknown fields are forwarded as sent.",
)

_KNOWN_BLOCKS: Final = ["text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking"]

_IMAGE_SOURCE = {
    "anyOf": [
        _open(
            ["type", "media_type", "data"],
            {"type": {"const": "base64"}, "media_type": _STRING, "data": _STRING},
        ),
        _open(["type", "url"], {"type": {"const": "url"}, "url": _STRING}),
    ]
}

_TEXT_BLOCK = _open(["type", "text"], {"type": {"const": "text"}, "text": _STRING})

_BLOCK = {
    "anyOf": [
        _TEXT_BLOCK,
        _open(["type", "source"], {"type": {"const": "image"}, "source": _IMAGE_SOURCE}),
        _open(
            ["type", "id", "name", "input"],
            {"type": {"const": "tool_use"}, "id": _STRING, "name": _STRING, "input": _OBJECT},
        ),
        _open(
            ["type", "tool_use_id"],
            {
                "type": {"const": "tool_result"},
                "tool_use_id": _STRING,
                "content": {
                    "anyOf": [
                        _STRING,
                        {"type": "null"},
                        {"type": "array", "items": _ref("MessagesBlock")},
                    ]
                },
                "is_error": {"type": ["boolean", "null"]},
            },
        ),
        _open(
            ["type", "thinking", "signature"],
            {"type": {"const": "thinking"}, "thinking": _STRING, "signature": _STRING},
        ),
        _open(["type", "data"], {"type": {"const": "redacted_thinking"}, "data": _STRING}),
        _open(
            ["type"],
            {
                "type": {
                    "type": "string",
                    "not": {"enum": sorted({*_KNOWN_BLOCKS, *OPENAI_PARTS})},
                }
            },
        ),
    ],
    "description": "A Messages content block (OpenAI part types such as `image_url` are not).",
}

_MESSAGES_TURN = {
    "anyOf": [
        _open(
            ["role", "content"],
            {
                "role": {"enum": sorted(ROLES - {"system"})},
                "content": {"anyOf": [_STRING, {"type": "array", "items": _ref("MessagesBlock")}]},
            },
        ),
        _open(
            ["role"],
            {
                "role": {"const": "system"},
                "content": {
                    "anyOf": [
                        _STRING,
                        {
                            "type": "array",
                            "items": _open(["type"], {"type": {"enum": sorted(TURN_BLOCKS)}}),
                        },
                    ]
                },
            },
            description="A mid-conversation system message.",
        ),
    ],
    "description": "A turn of the conversation.",
}

_MESSAGES_TOOL = {
    "anyOf": [
        _open(
            ["name", "input_schema"],
            {
                "type": {"const": "custom"},
                "name": _STRING,
                "description": _STRING,
                "input_schema": _OBJECT,
            },
        ),
        _open(["type"], {"type": {"type": "string", "not": {"const": "custom"}}}),
    ],
    "description": "A custom tool, or a server tool of another `type`.",
}


def _messages_request(*, counting: bool) -> dict[str, Any]:
    properties: dict[str, Any] = {
        "model": {"type": "string", "minLength": 1},
        "messages": {"type": "array", "minItems": 1, "items": _ref("MessagesTurn")},
        "system": {"anyOf": [_STRING, {"type": "array", "items": _TEXT_BLOCK}]},
        "tools": {"type": "array", "items": _MESSAGES_TOOL},
        "tool_choice": _open(
            ["type"],
            {"type": {"enum": ["auto", "any", "none", "tool"]}, "name": _STRING},
            **{"if": {"properties": {"type": {"const": "tool"}}}, "then": {"required": ["name"]}},
        ),
        "thinking": _open(
            ["type"],
            {"type": {"enum": sorted(THINKING_KINDS)}, "budget_tokens": {"type": "integer"}},
        ),
        **_NO_UPSTREAM_CHOICE,
    }
    required = ["model", "messages"]
    if not counting:
        properties |= {
            "max_tokens": {"type": "integer", "minimum": 1},
            "stream": {"type": "boolean"},
            "temperature": {"type": "number", "minimum": 0, "maximum": 1},
            "top_p": {"type": "number", "minimum": 0, "maximum": 1},
            "top_k": {"type": "integer", "minimum": 0},
            "stop_sequences": {"type": "array", "items": _STRING},
            "metadata": _OBJECT,
        }
        required.append("max_tokens")
    what = "a `count_tokens` request" if counting else "an Anthropic Messages request"
    return _open(required, properties, description=f"{what}; other fields are forwarded as sent.")


_RESPONSES_ROLES: Final = ["user", "assistant", "system", "developer"]

_RESPONSES_ITEM: Final = {
    "anyOf": [
        _open(
            ["role", "content"],
            {
                "type": {"const": "message"},
                "role": {"enum": _RESPONSES_ROLES},
                "content": {
                    "anyOf": [
                        _STRING,
                        {"type": "array", "items": _open(["type"], {"type": _STRING})},
                    ]
                },
            },
        ),
        _open(["type"], {"type": _STRING}),
    ]
}

_RESPONSES_REQUEST: Final = _open(
    ["model"],
    {
        "model": {"type": "string", "minLength": 1},
        "input": {"anyOf": [_STRING, {"type": "array", "items": _RESPONSES_ITEM}]},
        "instructions": _STRING,
        "tools": {"type": "array", "items": _OBJECT},
        "stream": {"type": "boolean"},
        "store": {"type": "boolean"},
        "previous_response_id": _STRING,
        "max_output_tokens": {"type": "integer", "minimum": 1},
        "prompt_cache_key": _STRING,
        **_NO_UPSTREAM_CHOICE,
    },
    description="An OpenAI Responses request; unknown fields and item types are forwarded as sent.",
)

SCHEMAS: Final[dict[str, Any]] = {
    "ChatRequest": _CHAT_REQUEST,
    "ResponsesRequest": _RESPONSES_REQUEST,
    "ChatMessage": _CHAT_MESSAGE,
    "MessagesRequest": _messages_request(counting=False),
    "CountTokensRequest": _messages_request(counting=True),
    "MessagesTurn": _MESSAGES_TURN,
    "MessagesBlock": _BLOCK,
}
"""The request body schemas, by the name the document's components give them."""
