"""The policy: defaults, wire names, validation that names the key."""

from __future__ import annotations

import pytest

from pipelines.errors import PolicyError
from pipelines.policy import Policy


def test_defaults_are_the_documented_ones() -> None:
    """The built-in policy is the documented one (docs/POLICY.md): summarize, thresholds
    0.40/0.50/0.70/0.90, target 0.45, tail 0.20, 2 images, ..."""
    policy = Policy()
    assert policy.as_wire() == {
        "mode": "summarize",
        "max-input": None,
        "prepare": 0.40,
        "light": 0.50,
        "trigger": 0.70,
        "emergency": 0.90,
        "target": 0.45,
        "tail-ratio": 0.20,
        "keep-images": 2,
        "filter-tokens": 5_000,
        "compact-json": True,
        "soft-ratio": None,
        "hard-ratio": None,
        "block-tokens": 120_000,
        "summary-model": None,
        "summary-timeout": 20.0,
        "offload-ttl": 86_400,
        "cache-markers": True,
        "native": "honour",
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
    assert not Policy.from_mapping({"cache-markers": False}).cache_markers
    assert not Policy.from_mapping({"compact-json": False}).compact_json


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
        ({"cache-markers": 0}, "cache-markers", "boolean"),
        ({"cache-markers": "no"}, "cache-markers", "boolean"),
        ({"compact-json": 1}, "compact-json", "boolean"),
    ],
)
def test_bad_values_name_the_key(values: dict[str, object], key: str, fragment: str) -> None:
    """Unknown keys, wrong types and out-of-bounds values raise PolicyError naming the key."""
    with pytest.raises(PolicyError, match=fragment) as caught:
        Policy.from_mapping(values)
    assert caught.value.key == key


async def test_the_light_threshold_is_tunable() -> None:
    """Deduplication starts at ``light``: a conversation at 60% of its budget is left
    alone with light=0.65 and deduplicated with the default 0.50."""
    from gateway.store import MemoryStore
    from pipelines import Pipeline
    from pipelines.stages.compress import Compress

    output = "the same long listing of flights " * 20
    messages: list[dict[str, object]] = [{"role": "user", "content": "List flights twice."}]
    for n in range(2):
        call = {"id": f"c{n}", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{n}", "content": output},
        ]
    pipeline = Pipeline(stages=[Compress()], store=MemoryStore())
    request = {"model": "gpt-4o", "messages": messages}
    tokens = (await pipeline.compact(request, policy=Policy(mode="off"))).report.tokens_before
    budget = max(4_000, int(tokens / 0.6))
    messages[0]["content"] = "List flights twice. " + "Please. " * int((0.6 * budget - tokens) / 2)
    default = await pipeline.compact(request, policy=Policy(max_input=budget))
    later = await pipeline.compact(request, policy=Policy(max_input=budget, light=0.65))
    assert 0.5 < default.report.tokens_before / budget < 0.65
    assert default.report.stages[0].details.get("duplicates") == 1
    assert not later.changed
