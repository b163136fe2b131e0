"""What every restore loop shares: usage totals over the rounds."""

from __future__ import annotations

from gateway.context.restore import add_usage


def test_usage_adds_up_field_by_field() -> None:
    one = {
        "prompt_tokens": 10,
        "completion_tokens": 2,
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    two = {
        "prompt_tokens": 30,
        "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 20},
    }
    total = add_usage(add_usage(None, one), two)
    assert total == {
        "prompt_tokens": 40,
        "completion_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 24},
    }
    assert one["prompt_tokens"] == 10  # inputs untouched
