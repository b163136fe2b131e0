"""The input budget: window minus output reserve, capped by max-input, floored at 4,000."""

from __future__ import annotations

from pipelines.budget import BUDGET_FLOOR, Budget
from pipelines.catalog import ModelCatalog
from pipelines.policy import Policy

GPT4O = ModelCatalog().lookup("gpt-4o")


def test_window_minus_catalog_reserve() -> None:
    """Without max_tokens the catalog's output reserve is kept free."""
    assert Budget.for_request(GPT4O, Policy(), {}).input_tokens == 128_000 - 16_384


def test_request_max_tokens_is_the_reserve() -> None:
    """The request's own max_completion_tokens (or max_tokens) sets the reserve."""
    assert (
        Budget.for_request(GPT4O, Policy(), {"max_completion_tokens": 1_000}).input_tokens
        == 127_000
    )
    assert Budget.for_request(GPT4O, Policy(), {"max_tokens": 2_000}).input_tokens == 126_000


def test_max_input_caps_the_budget() -> None:
    """The policy's max-input caps the budget below the window."""
    assert Budget.for_request(GPT4O, Policy(max_input=30_000), {}).input_tokens == 30_000


def test_floor() -> None:
    """A reserve that leaves almost nothing still leaves the 4,000-token floor."""
    assert (
        Budget.for_request(GPT4O, Policy(), {"max_tokens": 127_900}).input_tokens
        == BUDGET_FLOOR
        == 4_000
    )
    assert Budget(window=8_192, output_reserve=8_000).utilisation(2_000) == 0.5
    assert Budget(window=128_000, output_reserve=0, max_input=1_000).input_tokens == 4_000
