"""Checking an inbound Messages request: what the Messages API would refuse as malformed
is a 400 with a stable code naming the field by its dotted path; no JSON at all, however
odd, gets anything but that or a request both upstreams can be sent."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.codecs.messages import parse_request, to_request
from gateway.codecs.messages_openai import openai_request
from gateway.errors import InvalidRequest

HI = {"role": "user", "content": "Hi"}
BASE: dict[str, Any] = {"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": [HI]}


def with_turns(*turns: Any) -> dict[str, Any]:
    """The base request with ``turns`` after its first user turn."""
    return {**BASE, "messages": [HI, *turns]}


def deep(levels: int) -> Any:
    value: Any = {}
    for _ in range(levels):
        value = {"a": value}
    return value


USE = {"type": "tool_use", "id": "toolu_1", "name": "now", "input": {}}
CASES: list[tuple[Any, str, str | None]] = [
    (b"", "invalid_json", None),
    (b"{", "invalid_json", None),
    (b"[1]", "invalid_body", None),
    ({k: v for k, v in BASE.items() if k != "model"}, "missing_required_parameter", "model"),
    ({**BASE, "model": ""}, "invalid_type", "model"),
    (
        {k: v for k, v in BASE.items() if k != "max_tokens"},
        "missing_required_parameter",
        "max_tokens",
    ),
    ({**BASE, "max_tokens": "100"}, "invalid_type", "max_tokens"),
    ({**BASE, "max_tokens": True}, "invalid_type", "max_tokens"),
    ({**BASE, "max_tokens": 0}, "invalid_value", "max_tokens"),
    ({**BASE, "messages": None}, "missing_required_parameter", "messages"),
    ({**BASE, "messages": {}}, "invalid_type", "messages"),
    ({**BASE, "messages": []}, "invalid_value", "messages"),
    (with_turns("Hello"), "invalid_type", "messages.1"),
    (with_turns({"content": "Hi"}), "missing_required_parameter", "messages.1.role"),
    (with_turns({"role": "developer", "content": "Hi"}), "invalid_value", "messages.1.role"),
    (with_turns({"role": "system", "content": 5}), "invalid_type", "messages.1.content"),
    (
        with_turns({"role": "system", "content": [{"type": "image", "source": {}}]}),
        "invalid_value",
        "messages.1.content.0.type",
    ),
    (
        with_turns({"role": "system", "content": [{"type": "text"}]}),
        "missing_required_parameter",
        "messages.1.content.0.text",
    ),
    (
        with_turns({"role": "system", "content": [{"type": "tool_removal"}]}),
        "missing_required_parameter",
        "messages.1.content.0.tool",
    ),
    (with_turns({"role": "assistant"}), "missing_required_parameter", "messages.1.content"),
    (with_turns({"role": "assistant", "content": 5}), "invalid_type", "messages.1.content"),
    (with_turns({"role": "assistant", "content": ["Hi"]}), "invalid_type", "messages.1.content.0"),
    (
        with_turns({"role": "assistant", "content": [{"text": "Hi"}]}),
        "missing_required_parameter",
        "messages.1.content.0.type",
    ),
    (
        with_turns({"role": "assistant", "content": [{"type": "text"}]}),
        "missing_required_parameter",
        "messages.1.content.0.text",
    ),
    (
        with_turns({"role": "assistant", "content": [{**USE, "input": [1]}]}),
        "invalid_type",
        "messages.1.content.0.input",
    ),
    (
        with_turns({"role": "assistant", "content": [{"type": "thinking", "thinking": "Hm."}]}),
        "missing_required_parameter",
        "messages.1.content.0.signature",
    ),
    (
        with_turns(
            {"role": "assistant", "content": [USE]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": 5}],
            },
        ),
        "invalid_type",
        "messages.2.content.0.content",
    ),
    (
        with_turns(
            {"role": "assistant", "content": [USE]},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [{"type": "text", "text": "ok"}, {"text": "no type"}],
                    }
                ],
            },
        ),
        "missing_required_parameter",
        "messages.2.content.0.content.1.type",
    ),
    (
        with_turns(
            {"role": "assistant", "content": [USE]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "is_error": "yes"}],
            },
        ),
        "invalid_type",
        "messages.2.content.0.is_error",
    ),
    (
        {**BASE, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
        "missing_required_parameter",
        "messages.0.content.0.source",
    ),
    (
        {
            **BASE,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image", "source": {"type": "url", "url": 5}}],
                }
            ],
        },
        "invalid_type",
        "messages.0.content.0.source.url",
    ),
    (
        {
            **BASE,
            "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": {}}}]}],
        },
        "invalid_type",
        "messages.0.content.0.source.type",
    ),
    (
        {
            **BASE,
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": 5}}]}
            ],
        },
        "invalid_value",
        "messages.0.content.0.type",
    ),
    ({**BASE, "system": 5}, "invalid_type", "system"),
    ({**BASE, "system": [{"type": "text"}]}, "missing_required_parameter", "system.0.text"),
    ({**BASE, "system": [{"type": "image", "source": {}}]}, "invalid_value", "system.0.type"),
    ({**BASE, "tools": {}}, "invalid_type", "tools"),
    ({**BASE, "tools": ["now"]}, "invalid_type", "tools.0"),
    ({**BASE, "tools": [{"name": "now"}]}, "missing_required_parameter", "tools.0.input_schema"),
    ({**BASE, "stream": "yes"}, "invalid_type", "stream"),
    ({**BASE, "temperature": "hot"}, "invalid_type", "temperature"),
    ({**BASE, "stop_sequences": "END"}, "invalid_type", "stop_sequences"),
    ({**BASE, "tool_choice": "auto"}, "invalid_type", "tool_choice"),
    ({**BASE, "tool_choice": {}}, "missing_required_parameter", "tool_choice.type"),
    ({**BASE, "tool_choice": {"type": "tool", "name": []}}, "invalid_type", "tool_choice.name"),
    ({**BASE, "metadata": deep(300)}, "nesting_too_deep", "metadata"),
    (
        with_turns({"role": "assistant", "content": [{**USE, "input": deep(300)}]}),
        "nesting_too_deep",
        "messages.1",
    ),
]


@pytest.mark.parametrize(("body", "code", "param"), CASES)
def test_a_malformed_request_is_refused_naming_the_field(
    body: Any, code: str, param: str | None
) -> None:
    """The client is told what is wrong and where, in the API's own path notation."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(InvalidRequest) as refused:
        parse_request(raw)
    assert (refused.value.code, refused.value.param) == (code, param)
    assert refused.value.status == 400
    if param is not None:
        assert f"'{param}'" in refused.value.message or code == "nesting_too_deep"


def test_nesting_that_fits_is_accepted() -> None:
    """Deep tool input that orjson can still write out (with a level to spare for the
    chat form) is accepted."""
    body = with_turns({"role": "assistant", "content": [{**USE, "input": deep(240)}]})
    assert parse_request(orjson.dumps(body)).chat["messages"][-1]["tool_calls"]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@given(st.one_of(JSON, JSON.map(lambda value: {**BASE, "messages": value})))
def test_any_json_is_accepted_or_refused_with_a_400(value: Any) -> None:
    """No JSON document makes the check fail any other way."""
    with contextlib.suppress(InvalidRequest):
        parse_request(json.dumps(value).encode())


@given(st.binary(max_size=64))
def test_any_bytes_are_accepted_or_refused_with_a_400(raw: bytes) -> None:
    """Not even bytes that are not JSON."""
    with contextlib.suppress(InvalidRequest):
        parse_request(raw)


TYPES = [
    "text",
    "image",
    "document",
    "tool_use",
    "tool_result",
    "thinking",
    "redacted_thinking",
    "image_url",
    "x",
]
FIELDS = ["text", "source", "id", "name", "input", "tool_use_id", "content", "is_error"]
FIELDS += ["thinking", "signature", "data", "cache_control", "citations", "caller"]
SHORT = st.text(max_size=4)
SOURCE = st.one_of(
    st.builds(
        lambda kind, fields: {**fields, "type": kind},
        st.sampled_from(["base64", "url", "file"]),
        st.dictionaries(st.sampled_from(["media_type", "data", "url"]), JSON, max_size=3),
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("base64"),
            "media_type": st.sampled_from(["image/png", "x"]),
            "data": SHORT,
        }
    ),
    st.fixed_dictionaries({"type": st.just("url"), "url": SHORT}),
)
READ: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    "text": {"text": SHORT},
    "image": {"source": SOURCE},
    "tool_use": {"id": SHORT, "name": SHORT, "input": st.dictionaries(SHORT, JSON, max_size=2)},
    "tool_result": {"tool_use_id": SHORT},
    "thinking": {"thinking": SHORT, "signature": SHORT},
    "redacted_thinking": {"data": SHORT},
}
"""The fields the codec reads from each kind of block, well typed."""


def block_of(kind: str) -> st.SearchStrategy[dict[str, Any]]:
    """Blocks of ``kind`` whose other fields are anything (but a tool result's content
    and error flag, which the check reads when they are there)."""
    read = READ.get(kind, {})
    anything = st.one_of(JSON, SOURCE, st.lists(BLOCK, max_size=2))
    others = {field: anything for field in FIELDS if field not in read}
    if kind == "tool_result":
        others["content"] = st.one_of(SHORT, st.lists(BLOCK, max_size=2))
        others["is_error"] = st.booleans()
    return st.fixed_dictionaries({"type": st.just(kind), **read}, optional=others)


BLOCK: st.SearchStrategy[dict[str, Any]] = st.deferred(
    lambda: st.sampled_from(TYPES).flatmap(block_of)
)
TURN = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "assistant"]),
        "content": st.one_of(st.text(max_size=5), st.lists(BLOCK, max_size=4)),
    }
)
TOOL = st.one_of(
    st.builds(
        lambda fields: {**fields},
        st.dictionaries(
            st.sampled_from(["name", "input_schema", "description", "type"]), JSON, max_size=4
        ),
    ),
    st.fixed_dictionaries(
        {
            "name": st.text(max_size=5),
            "input_schema": st.dictionaries(st.text(max_size=3), JSON, max_size=2),
        },
        optional={"description": JSON, "type": st.sampled_from(["custom", "bash_20250124", None])},
    ),
)


@given(
    st.lists(TURN, min_size=1, max_size=4),
    st.fixed_dictionaries(
        {},
        optional={
            "system": st.one_of(JSON, st.lists(BLOCK, max_size=2)),
            "tools": st.lists(TOOL, max_size=3),
            "tool_choice": st.one_of(
                JSON,
                st.fixed_dictionaries(
                    {"type": st.sampled_from(["auto", "any", "tool", "none"])},
                    optional={"name": JSON, "disable_parallel_tool_use": JSON},
                ),
            ),
            "stop_sequences": JSON,
            "stream": JSON,
        },
    ),
)
def test_an_accepted_request_can_be_sent_to_either_upstream(
    turns: list[dict[str, Any]], fields: dict[str, Any]
) -> None:
    """Odd but well-typed blocks the check lets through never break the way to an
    Anthropic or an OpenAI-compatible upstream."""
    try:
        split = parse_request(json.dumps({**BASE, **fields, "messages": turns}).encode())
    except InvalidRequest:
        return
    to_request(split.chat, split.native, default_max_tokens=100)
    openai_request(split.chat)
