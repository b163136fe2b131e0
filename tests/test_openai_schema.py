"""The spec check the invariant tests rely on does reject what the API would."""

from __future__ import annotations

import pytest

from tests.openai_schema import spec_errors

OK = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}


def test_a_plain_request_and_provider_extensions_validate() -> None:
    assert spec_errors(OK) is None
    assert spec_errors({**OK, "reasoning_effort": "low", "vendor_extension": {"x": 1}}) is None


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages/0"),
        ({"messages": [OK["messages"][0], {"role": "tool", "content": "x"}]}, "messages/1"),
        ({"temperature": "hot"}, "temperature"),
        ({"messages": []}, "messages"),
    ],
)
def test_what_the_api_refuses_is_refused(change: dict[str, object], where: str) -> None:
    problem = spec_errors({**OK, **change})
    assert problem is not None
    assert problem.startswith(where)
