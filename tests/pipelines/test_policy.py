"""The policy: defaults, wire names, validation that names the key."""

from __future__ import annotations

import pytest

from pipelines.errors import PolicyError
from pipelines.policy import Policy


def test_defaults_are_the_documented_ones() -> None:
    """The built-in policy is DESIGN's: summarize, 0.70/0.45, tail 0.20, 2 images, ..."""
    policy = Policy()
    assert policy.as_wire() == {
        "mode": "summarize",
        "max-input": None,
        "trigger": 0.70,
        "target": 0.45,
        "tail-ratio": 0.20,
        "keep-images": 2,
        "filter-tokens": 5_000,
        "soft-ratio": None,
        "hard-ratio": None,
        "block-tokens": 120_000,
        "summary-model": None,
        "summary-timeout": 20.0,
        "offload-ttl": 86_400,
    }


def test_from_mapping_applies_wire_names_on_a_base() -> None:
    """Wire-named keys are applied on top of a base policy, coerced to their types."""
    base = Policy(keep_images=4)
    policy = Policy.from_mapping({"mode": "truncate", "trigger": 0.6, "max-input": 50_000.0}, base)
    assert (policy.mode, policy.trigger, policy.max_input, policy.keep_images) == (
        "truncate",
        0.6,
        50_000,
        4,
    )


@pytest.mark.parametrize(
    ("values", "key", "fragment"),
    [
        ({"colour": "blue"}, "colour", "unknown key"),
        ({"mode": "shred"}, "mode", "must be one of"),
        ({"trigger": 1.5}, "trigger", "between"),
        ({"keep-images": -1}, "keep-images", "between"),
        ({"keep-images": 1.5}, "keep-images", "whole number"),
        ({"filter-tokens": "many"}, "filter-tokens", "must be a number"),
        ({"trigger": True}, "trigger", "must be a number"),
        ({"target": 0.8}, "target", "below trigger"),
        ({"summary-model": 3}, "summary-model", "string"),
        ({"max_input": 9000}, "max_input", "unknown key"),
        ({"max-input": 1000}, "max-input", "between 4000"),
        ({"trigger": 0.4}, "trigger", "above target"),
    ],
)
def test_bad_values_name_the_key(values: dict[str, object], key: str, fragment: str) -> None:
    """Unknown keys, wrong types and out-of-bounds values raise PolicyError naming the key."""
    with pytest.raises(PolicyError, match=fragment) as caught:
        Policy.from_mapping(values)
    assert caught.value.key == key
