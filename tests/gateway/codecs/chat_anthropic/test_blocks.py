"""Chat content -> Messages blocks: images and documents survive, what Claude cannot take
is a 400 naming the part, Anthropic's own blocks and keys pass through, and cache markers
land where the API takes them."""

from __future__ import annotations

import base64
from typing import Any

import openai
import orjson
import pytest

from gateway.codecs.chat_anthropic import to_messages
from gateway.errors import InvalidRequest
from tests.gateway.codecs.anthropic_params import assert_valid_params
from tests.gateway.codecs.chat_anthropic.samples import ANSWER, HI
from tests.harness import GatewayServer
from tests.mock_upstream import JSONReply, MockUpstream

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

READ_CALL = {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}


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
