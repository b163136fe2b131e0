"""thinking: reasoning cleanup per family, from the model catalog."""

from __future__ import annotations

from typing import Any

from pipelines import Pipeline, Policy
from pipelines.stages.thinking import REASONING_PLACEHOLDER, Thinking
from tests.pipelines.stages.conftest import run_stage

CALL = [{"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}}]
THINK = {"type": "thinking", "thinking": "let me think", "signature": "sig-abc"}
REDACTED = {"type": "redacted_thinking", "data": "opaque"}


def conversation() -> list[dict[str, Any]]:
    """Two turns; each assistant message carries reasoning both ways."""
    return [
        {"role": "system", "content": "Be helpful."},
        {"role": "user", "content": "First question"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": CALL,
            "reasoning_content": "old call reasoning",
        },
        {"role": "tool", "tool_call_id": "c1", "content": "result"},
        {
            "role": "assistant",
            "content": [THINK, {"type": "text", "text": "Old answer"}],
            "reasoning_content": "old answer reasoning",
        },
        {"role": "user", "content": "Second question"},
        {
            "role": "assistant",
            "content": [REDACTED, THINK, {"type": "text", "text": "Checking"}],
            "tool_calls": CALL,
            "reasoning_content": "new reasoning",
        },
        {"role": "tool", "tool_call_id": "c1", "content": "result 2"},
    ]


async def test_anthropic_keeps_current_turn_blocks_only() -> None:
    """Claude that drops earlier turns' thinking: reasoning_content goes everywhere (no
    Anthropic wire carries it); thinking blocks stay, signatures intact, only on the
    current turn's assistant messages."""
    out = (await run_stage(Thinking(), conversation(), model="claude-sonnet-4-5")).request
    messages = out["messages"]
    assert all("reasoning_content" not in m for m in messages)
    assert messages[4]["content"] == [{"type": "text", "text": "Old answer"}]
    assert messages[6]["content"] == [REDACTED, THINK, {"type": "text", "text": "Checking"}]


async def test_a_model_that_keeps_earlier_thinking_is_sent_all_of_it() -> None:
    """Claude Opus 4.5 and later keep earlier turns' thinking by default: every block goes
    up as the client sent it and the stage reports no action."""
    for model in ("claude-opus-4-6", "claude-sonnet-4-6", "claude-opus-5-5"):
        result = await run_stage(Thinking(), codec_conversation(), model=model)
        assert not result.changed
        assert result.request["messages"] == codec_conversation()


async def test_a_clients_clear_thinking_edit_is_left_to_the_api() -> None:
    """A request that asks the API to clear thinking itself (Claude Code sends
    ``clear_thinking_20251015`` with ``keep: "all"``) keeps every block, whatever the
    model's default: the API applies the edit."""
    management = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}
    request = {
        "model": "claude-sonnet-4-5",
        "messages": codec_conversation(),
        "context_management": management,
    }
    result = await Pipeline(stages=[Thinking()]).compact(request, policy=Policy())
    assert not result.changed
    assert [m.get("thinking_blocks") for m in result.request["messages"]][1] == [THINK]


async def test_reasoning_content_beside_blocks_is_no_action_for_claude() -> None:
    """An assistant turn as the Messages codec carries it (blocks plus their text as
    reasoning_content), all on the current turn: its reasoning_content is dropped so that
    it is not counted, but nothing changes on Claude's wire, so no action is reported."""
    messages = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": CALL,
            "thinking_blocks": [THINK],
            "reasoning_content": "let me think",
        },
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
    ]
    result = await run_stage(Thinking(), messages, model="claude-sonnet-4-5")
    assert result.report.actions == []
    assert result.request["messages"][1]["thinking_blocks"] == [THINK]
    assert "reasoning_content" not in result.request["messages"][1]


async def test_deepseek_keeps_tool_call_reasoning() -> None:
    """DeepSeek: a historical tool-call turn keeps its reasoning_content (the API needs it);
    a historical plain answer loses it; the current turn keeps it; blocks are dropped."""
    out = (await run_stage(Thinking(), conversation(), model="deepseek-reasoner")).request
    messages = out["messages"]
    assert messages[2]["reasoning_content"] == "old call reasoning"
    assert "reasoning_content" not in messages[4]
    assert messages[4]["content"] == [{"type": "text", "text": "Old answer"}]
    assert messages[6]["reasoning_content"] == "new reasoning"
    assert messages[6]["content"] == [{"type": "text", "text": "Checking"}]


async def test_echo_families_backfill_missing_reasoning_on_tool_calls() -> None:
    """Kimi/MiMo/DeepSeek: an assistant tool-call message without reasoning (or with an empty
    one) gets a non-empty placeholder; other messages get none."""
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": CALL},
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
        {"role": "assistant", "content": "done", "tool_calls": CALL, "reasoning_content": ""},
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
        {"role": "assistant", "content": "final"},
    ]
    for model in ("kimi-k2-thinking", "mimo-v2-flash", "deepseek-chat"):
        result = await run_stage(Thinking(), messages, model=model)
        out = result.request["messages"]
        assert out[1]["reasoning_content"] == REASONING_PLACEHOLDER
        assert out[3]["reasoning_content"] == REASONING_PLACEHOLDER
        assert "reasoning_content" not in out[5]
        assert result.report.stages[0].details["reasoning_backfilled"] == 2


async def test_other_families_drop_both() -> None:
    """OpenAI and unknown models: no reasoning_content and no thinking blocks go out; a
    message left with no content keeps a valid empty one."""
    messages = conversation()
    messages[4]["content"] = [THINK]
    for model in ("gpt-4o", "some-local-model"):
        out = (await run_stage(Thinking(), messages, model=model)).request["messages"]
        assert all("reasoning_content" not in m for m in out)
        assert out[4]["content"] == ""
        assert out[6]["content"] == [{"type": "text", "text": "Checking"}]


async def test_reasoning_echoed_to_claude_is_not_counted() -> None:
    """An OpenAI client echoing only reasoning_content to Claude (no blocks): it is not
    counted, since it never goes up, and no action is reported."""
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "done", "reasoning_content": "long thought " * 500},
        {"role": "user", "content": "and now?"},
    ]
    result = await run_stage(Thinking(), messages, model="claude-sonnet-4-6")
    assert result.report.actions == []
    assert result.report.tokens_after < result.report.tokens_before - 900


async def test_clean_conversation_passes_through_untouched() -> None:
    """With nothing to clean, the request is not changed."""
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert not (await run_stage(Thinking(), messages, model="claude-sonnet-4-5")).changed


async def test_same_request_gives_same_bytes() -> None:
    """Cleaning is deterministic: the same request twice gives identical output."""
    first = await run_stage(Thinking(), conversation(), model="deepseek-reasoner")
    second = await run_stage(Thinking(), conversation(), model="deepseek-reasoner")
    assert first.request == second.request


def codec_conversation() -> list[dict[str, Any]]:
    """Two turns as the gateway's Anthropic codec carries them: thinking blocks in an
    assistant message's ``thinking_blocks`` list, text as the content."""
    return [
        {"role": "user", "content": "First question"},
        {"role": "assistant", "content": "Old answer", "thinking_blocks": [THINK]},
        {"role": "user", "content": "Second question"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": CALL,
            "thinking_blocks": [REDACTED, THINK],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "result"},
    ]


async def test_anthropic_keeps_codec_thinking_blocks_on_the_current_turn_only() -> None:
    """Claude, blocks carried as ``thinking_blocks``: the current turn's tool-call message
    keeps them as they came; the older answer loses them and keeps its text."""
    result = await run_stage(Thinking(), codec_conversation(), model="claude-sonnet-4-5")
    messages = result.request["messages"]
    assert messages[1] == {"role": "assistant", "content": "Old answer"}
    assert messages[3]["thinking_blocks"] == [REDACTED, THINK]
    assert result.report.stages[0].details["thinking_blocks_dropped"] == 1


async def test_other_families_drop_codec_thinking_blocks_everywhere() -> None:
    """Any other family: no ``thinking_blocks`` key goes out, current turn included."""
    for model in ("gpt-4o", "deepseek-reasoner", "qwen-max"):
        out = (await run_stage(Thinking(), codec_conversation(), model=model)).request
        assert all("thinking_blocks" not in m for m in out["messages"])
        assert out["messages"][1]["content"] == "Old answer"


async def test_anthropic_a_user_message_after_tool_results_continues_the_turn() -> None:
    """Claude: text sent with tool results (a client's reminder beside them) joins their
    user turn on the wire, so the assistant message that made the calls is still the
    current turn's and keeps its thinking blocks (the API refuses a final tool-use answer
    without them); a user message of its own starts a new turn."""
    messages = [
        {"role": "user", "content": "Fix the bug"},
        {"role": "assistant", "content": None, "tool_calls": CALL, "thinking_blocks": [THINK]},
        {"role": "tool", "tool_call_id": "c1", "content": "print(1)"},
        {"role": "user", "content": "<system-reminder>No todos.</system-reminder>"},
    ]
    result = await run_stage(Thinking(), messages, model="claude-sonnet-4-5")
    assert result.request["messages"] == messages
    answered = [*messages, {"role": "assistant", "content": "Fixed."}]
    later = [*answered, {"role": "user", "content": "Thanks"}]
    out = (await run_stage(Thinking(), later, model="claude-sonnet-4-5")).request["messages"]
    assert "thinking_blocks" not in out[1]
