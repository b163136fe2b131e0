"""guard_outbound: a request that cannot be made to fit is refused, saying what would fit."""

from __future__ import annotations

import re
from typing import Any

import pytest

from pipelines import Pipeline, Policy, RequestRejected

WORDS = " ".join(f"rule{i} applies to every change in area{i % 97}." for i in range(2_000))


def agent_request(**fields: Any) -> dict[str, Any]:
    """An agent's request: a long system prompt, many tools, a short history."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": f"Does step {i} of the work, carefully and in order. " * 12,
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            },
        }
        for i in range(40)
    ]
    messages = [
        {"role": "system", "content": WORDS},
        {"role": "user", "content": "Fix the failing test in src/app.py."},
    ]
    return {"model": "claude-sonnet-4-6", "messages": messages, "tools": tools, **fields}


async def test_the_refusal_names_the_fixed_part_and_a_max_input_that_works() -> None:
    """An agent whose tools and system prompt outgrow max-input gets a 400 naming each part
    with its tokens and the smallest max-input that works; with that max-input it fits."""
    with pytest.raises(RequestRejected) as refused:
        await Pipeline().compact(agent_request(), policy=Policy(max_input=8_000))
    message = str(refused.value)
    assert refused.value.code == "context_length_exceeded"
    assert re.search(r"the tools \([\d,]+ tokens\)", message)
    assert re.search(r"the system prompt \([\d,]+ tokens\)", message)
    assert re.search(r"the latest user message \([\d,]+ tokens\)", message)
    found = re.search(r"max-input=(\d+)", message)
    assert found is not None
    suggested = int(found[1])
    assert 8_000 < suggested <= 40_000
    result = await Pipeline().compact(agent_request(), policy=Policy(max_input=suggested))
    assert result.report.tokens_after <= suggested


async def test_a_request_over_the_window_is_told_so() -> None:
    """When no max-input can help (the window itself is too small once the reply is kept),
    the refusal says so instead of suggesting one."""
    request = agent_request(model="gpt-4", max_tokens=4_000)
    with pytest.raises(RequestRejected) as refused:
        await Pipeline().compact(request)
    message = str(refused.value)
    assert "window cannot hold it" in message
    assert "max-input=" not in message
