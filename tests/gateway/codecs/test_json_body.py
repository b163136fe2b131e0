"""Reading a JSON body and naming what is wrong in it, as both inbound APIs do."""

from __future__ import annotations

import pytest

from gateway.codecs.json_body import json_object, shown, type_error
from gateway.errors import InvalidRequest


@pytest.mark.parametrize(
    ("raw", "code", "fragment"),
    [
        (b"  ", "invalid_json", "empty"),
        (b"{oops", "invalid_json", "not valid JSON"),
        (b"null", "invalid_body", "got null"),
        (b"[1]", "invalid_body", "got an array"),
        (b'"x"', "invalid_body", "got a string"),
    ],
)
def test_a_body_that_is_not_an_object_is_named(raw: bytes, code: str, fragment: str) -> None:
    with pytest.raises(InvalidRequest, match=fragment) as caught:
        json_object(raw)
    assert caught.value.code == code


def test_type_errors_say_missing_or_what_came() -> None:
    """An absent field is missing_required_parameter; a wrong one says what it was."""
    assert type_error("model", "a string", None).code == "missing_required_parameter"
    wrong = type_error("stream", "a boolean", 1)
    assert (wrong.code, wrong.param) == ("invalid_type", "stream")
    assert "got a number" in wrong.message
    assert shown("x" * 100).endswith("...")
    assert len(shown("x" * 100)) == 40


def test_a_value_too_deep_to_write_out_is_named_by_its_kind() -> None:
    """The parser takes 1,024 levels, the writer 254: an error message quoting a deeper
    value (a role that is 300 nested arrays) names its kind instead of failing."""
    deep: list[object] = []
    for _ in range(300):
        deep = [deep]
    assert shown(deep) == "an array"
    assert shown({"a": deep}) == "an object"
