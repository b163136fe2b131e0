"""A Responses request checked, split for the pipeline and made again."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.codecs.responses.request import parse_request, to_request
from gateway.errors import InvalidRequest
from tests.gateway.codecs.responses.samples import every_kind


def _codex_like() -> dict[str, Any]:
    return {
        "model": "gpt-5.3-codex",
        "instructions": "You are Codex.",
        "input": every_kind(),
        "tools": [
            {"type": "function", "name": "shell", "parameters": {"type": "object"}},
            {"type": "custom", "name": "apply_patch", "format": {"type": "text"}},
            {"type": "web_search"},
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "thread-1",
        "client_metadata": {"x": "y"},
        "max_output_tokens": 4096,
    }


def test_a_request_the_pipeline_left_alone_is_made_again_byte_for_byte() -> None:
    body = _codex_like()
    inbound = parse_request(orjson.dumps(body))
    assert orjson.dumps(to_request(inbound.chat, inbound.native)) == orjson.dumps(body)


def test_the_pipeline_reads_model_budget_tools_and_cache_key() -> None:
    inbound = parse_request(orjson.dumps(_codex_like()))
    chat = inbound.chat
    assert chat["model"] == "gpt-5.3-codex"
    assert chat["max_completion_tokens"] == 4096
    assert chat["tools"] == _codex_like()["tools"]
    assert chat["prompt_cache_key"] == "thread-1"
    assert chat["messages"][0] == {
        "role": "system",
        "content": "You are Codex.",
        "response_instructions": True,
    }
    assert inbound.stream
    # Its history names a stored item (an item_reference): it continues state the
    # upstream keeps; without that reference it would carry its whole history.
    assert inbound.stateful
    body = _codex_like()
    body["input"] = [item for item in body["input"] if item.get("type") != "item_reference"]
    assert not parse_request(orjson.dumps(body)).stateful


def test_a_string_input_stays_a_string() -> None:
    body = {"model": "gpt-4o", "input": "Hello"}
    inbound = parse_request(orjson.dumps(body))
    assert inbound.chat["messages"][0]["content"] == "Hello"
    assert to_request(inbound.chat, inbound.native) == body


def test_what_the_pipeline_set_goes_up() -> None:
    inbound = parse_request(orjson.dumps({"model": "gpt-4o", "input": "Hi"}))
    outgoing = {**inbound.chat, "prompt_cache_key": "cg-abc"}
    messages = [*outgoing["messages"], {"role": "user", "content": "more"}]
    sent = to_request({**outgoing, "messages": messages}, inbound.native)
    assert sent["prompt_cache_key"] == "cg-abc"
    assert sent["input"][-1] == {"type": "message", "role": "user", "content": "more"}


@pytest.mark.parametrize("field", ["previous_response_id", "conversation"])
def test_a_request_continuing_server_state_is_stateful(field: str) -> None:
    inbound = parse_request(orjson.dumps({"model": "gpt-4o", "input": "Hi", field: "x_1"}))
    assert inbound.stateful


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"input": "Hi"}, "model", "missing_required_parameter"),
        ({"model": "gpt-4o", "input": 5}, "input", "invalid_type"),
        ({"model": "gpt-4o", "input": ["Hi"]}, "input[0]", "invalid_type"),
        ({"model": "gpt-4o", "input": [{"role": "robot", "content": "x"}]}, "input[0].role", None),
        ({"model": "gpt-4o", "input": [{"role": "user"}]}, "input[0].content", None),
        (
            {"model": "gpt-4o", "input": [{"role": "user", "content": [1]}]},
            "input[0].content[0]",
            None,
        ),
        ({"model": "gpt-4o", "input": "x", "tools": {}}, "tools", "invalid_type"),
        ({"model": "gpt-4o", "input": "x", "stream": "yes"}, "stream", "invalid_type"),
        ({"model": "gpt-4o", "input": "x", "instructions": 3}, "instructions", "invalid_type"),
    ],
)
def test_a_malformed_request_is_refused_naming_the_field(
    body: dict[str, Any], param: str, code: str | None
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_request(orjson.dumps(body))
    assert caught.value.param == param
    assert caught.value.status == 400
    if code is not None:
        assert caught.value.code == code
