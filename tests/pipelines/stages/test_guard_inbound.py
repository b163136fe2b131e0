"""guard_inbound: a new user turn over block-tokens is refused before anything is sent."""

from __future__ import annotations

import pytest

from pipelines import RequestRejected
from pipelines.stages.guard_inbound import GuardInbound
from tests.pipelines.stages.conftest import run_stage

BIG = "word " * 3000  # about 3,000 tokens


async def test_large_new_turn_is_refused_with_numbers() -> None:
    """A new user turn over the limit raises payload_too_large naming the count and limit."""
    with pytest.raises(RequestRejected) as caught:
        await run_stage(GuardInbound(), [{"role": "user", "content": BIG}], block_tokens=1_000)
    assert caught.value.code == "payload_too_large"
    assert "1,000" in str(caught.value)
    assert caught.value.param == "messages[0]"


async def test_consecutive_user_messages_count_together() -> None:
    """The trailing user messages form the turn; their tokens add up."""
    half = "word " * 700
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": half},
        {"role": "user", "content": half},
    ]
    with pytest.raises(RequestRejected) as caught:
        await run_stage(GuardInbound(), messages, block_tokens=1_000)
    assert caught.value.param == "messages[2]"


async def test_history_and_tool_outputs_are_not_the_new_turn() -> None:
    """A large old user message, or a large tool output at the end, passes the guard."""
    history = [
        {"role": "user", "content": BIG},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "short"},
    ]
    assert not (await run_stage(GuardInbound(), history, block_tokens=1_000)).changed
    tool_loop = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": BIG},
    ]
    assert not (await run_stage(GuardInbound(), tool_loop, block_tokens=1_000)).changed
