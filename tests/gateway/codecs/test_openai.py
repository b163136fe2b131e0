"""Parsing inbound chat bodies: anything that is not a usable request is InvalidRequest."""

from __future__ import annotations

import contextlib
import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.codecs.openai import parse_chat_request
from gateway.errors import InvalidRequest

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", "x", 3])},
    optional={"content": json_values, "tool_calls": json_values, "name": json_values},
)
bodies = st.fixed_dictionaries(
    {},
    optional={
        "model": st.one_of(st.text(max_size=10), json_values),
        "messages": st.one_of(st.lists(message, max_size=3), json_values),
        "stream": json_values,
        "tools": json_values,
    },
)


@given(st.one_of(bodies, json_values))
def test_any_json_is_accepted_or_invalid_request(body: object) -> None:
    """Any JSON value either parses into a dict with a string model and a list of messages,
    or raises InvalidRequest: never another exception."""
    try:
        parsed = parse_chat_request(orjson.dumps(body))
    except InvalidRequest as exc:
        error = exc
    else:
        assert isinstance(parsed["model"], str)
        assert isinstance(parsed["messages"], list)
        return
    assert error.status == 400
    assert error.code


@given(st.binary(max_size=200))
def test_any_bytes_are_accepted_or_invalid_request(raw: bytes) -> None:
    """Arbitrary bytes never raise anything but InvalidRequest."""
    with contextlib.suppress(InvalidRequest):
        parse_chat_request(raw)


def test_valid_request_comes_back_whole() -> None:
    """A valid body is returned with every field, known or not."""
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "extra": {"a": [1]}}
    assert parse_chat_request(orjson.dumps(body)) == body


def test_a_tool_call_function_must_be_an_object() -> None:
    body = {
        "model": "gpt-4o",
        "messages": [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "a", "type": "function", "function": "run"}],
            }
        ],
    }
    with pytest.raises(InvalidRequest) as caught:
        parse_chat_request(orjson.dumps(body))
    assert caught.value.param == "messages[0].tool_calls[0].function"


@pytest.mark.parametrize("role", [["user"], {"user": 1}])
def test_a_role_that_is_a_container_is_invalid_value(role: object) -> None:
    """A role given as an array or object is ``invalid_value`` (it once failed with a 500)."""
    body = {"model": "gpt-4o", "messages": [{"role": role, "content": "hi"}]}
    with pytest.raises(InvalidRequest) as caught:
        parse_chat_request(orjson.dumps(body))
    assert caught.value.code == "invalid_value"
    assert caught.value.param == "messages[0].role"


def _deep(levels: int) -> object:
    value: object = "x"
    for _ in range(levels):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": [{"type": "text", "text": "x", "extra": _deep(300)}]},
        {"role": "user", "content": "x", "metadata": _deep(300)},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": _deep(300)}}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f"}, "x": [[]]}],
            "audio": [_deep(300)],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                {"id": "b", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                {"id": "c", "function": {"name": "f", "arguments": "{}", "x": _deep(300)}},
            ],
        },
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "a", "function": {"name": "f", "arguments": "{}"}, "x": _deep(300)}
            ],
        },
        {
            "role": "assistant",
            "tool_calls": [{"id": _deep(300), "function": {"name": "f", "arguments": "{}"}}],
        },
        {
            "role": "assistant",
            "tool_calls": [{"type": _deep(300), "function": {"name": "f", "arguments": "{}"}}],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{}"}}],
            "audio": _deep(300),
        },
    ],
)
def test_a_message_nested_too_deeply_anywhere_is_refused(message: dict[str, object]) -> None:
    """A message too deep to serialise again is ``nesting_too_deep``, naming the message,
    wherever the depth is (a content part, an extra field, a tool call's sibling)."""
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}, message]}
    with pytest.raises(InvalidRequest) as caught:
        parse_chat_request(json.dumps(body).encode())  # orjson cannot write it
    assert caught.value.code == "nesting_too_deep"
    assert caught.value.param == "messages[1]"


def test_messages_as_deep_as_the_limit_allows_are_accepted() -> None:
    """Depth under the limit is accepted, in a content part as in an extra field: the quick
    shape check does not refuse what serialises."""
    body = {
        "model": "gpt-4o",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "x", "extra": _deep(200)}]},
            {"role": "user", "content": "x", "metadata": _deep(200)},
        ],
    }
    assert parse_chat_request(orjson.dumps(body)) == body


# Mostly the usual shape, so that the shortcut is taken often; now and then not.
text_or_not = st.one_of(
    *[st.text(max_size=4)] * 6, st.none(), st.integers(), st.lists(st.text(), max_size=1)
)
extra = st.one_of(json_values, st.just(_deep(300)))
"""A field the usual shape has not: anything, or something nested deeper than JSON can be
written back out."""
tool_call = st.one_of(
    st.fixed_dictionaries(
        {"id": st.one_of(text_or_not, extra), "type": st.one_of(text_or_not, extra)},
        optional={
            "function": st.one_of(
                *[st.fixed_dictionaries({"name": text_or_not, "arguments": text_or_not})] * 4,
                st.fixed_dictionaries(
                    {"name": text_or_not}, optional={"arguments": text_or_not, "x": extra}
                ),
                json_values,
            ),
            "more": extra,
        },
    ),
    json_values,
)
tool_call_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["assistant", "tool", "x"]), "tool_calls": st.lists(tool_call)},
    optional={
        "content": st.one_of(text_or_not, json_values),
        "name": text_or_not,
        "reasoning_content": text_or_not,
        "tool_call_id": text_or_not,
        "audio": extra,
    },
)


@settings(max_examples=400)
@given(tool_call_message)
def test_the_shortcut_for_tool_calls_passes_only_what_the_full_check_passes(
    message: dict[str, object],
) -> None:
    """Assistant tool-call messages skip most checks when they have the usual shape; any
    message the shortcut lets through passes every check too, so the shortcut changes
    nothing but the time taken."""
    from gateway.codecs.openai import _check_fully, _plain_tool_calls

    if message["role"] in ("assistant", "tool") and _plain_tool_calls(message):
        _check_fully(0, message)
