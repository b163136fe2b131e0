"""Counting a request: exact near decisions, estimated (then measured) far from them."""

from __future__ import annotations

from typing import Any

from pipelines import Pipeline, Policy, TokenCounter
from pipelines.conversation import Conversation
from pipelines.counting import THREADED_MEASURE_CHARS, ConversationTokens


def long_history(tag: str, turns: int = 60) -> list[dict[str, Any]]:
    return [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "content": f"{tag} turn {i}: " + "the reservation HAT170 departs at 10:00 and " * 40,
        }
        for i in range(turns)
    ]


async def test_cold_history_far_from_thresholds_is_estimated_then_measured() -> None:
    """A long history the process has never seen, far below every threshold, is estimated
    on the request path; the exact counts are measured in the background, so resending the
    conversation is counted exactly."""
    pipeline = Pipeline()
    messages = long_history("far")
    request = {"model": "gpt-4.1", "messages": messages}
    first = await pipeline.compact(request)
    assert not first.report.exact
    assert first.report.as_dict()["exact"] is False
    await pipeline.settled()
    exact = pipeline.counter("o200k_base").count_messages(messages)
    assert first.report.tokens_before >= exact
    second = await pipeline.compact(
        {"model": "gpt-4.1", "messages": [*messages, {"role": "user", "content": "and?"}]}
    )
    assert second.report.exact
    assert second.report.tokens_before == exact + pipeline.counter("o200k_base").count_message(
        {"role": "user", "content": "and?"}
    )


async def test_cold_history_near_a_threshold_is_counted_exactly() -> None:
    """When the estimate could reach a threshold, the request waits for the exact count."""
    pipeline = Pipeline()
    messages = long_history("near")
    result = await pipeline.compact(
        {"model": "gpt-4o", "messages": messages}, policy=Policy(max_input=40_000)
    )
    assert result.report.exact
    assert result.report.tokens_before == pipeline.counter("o200k_base").count_messages(messages)


async def test_small_uncached_request_is_always_exact() -> None:
    """A short request is simply counted: estimating it would save nothing."""
    pipeline = Pipeline()
    messages = [{"role": "user", "content": "hello " * 100}]
    result = await pipeline.compact({"model": "gpt-4.1", "messages": messages})
    assert sum(len(m["content"]) for m in messages) < THREADED_MEASURE_CHARS
    assert result.report.exact
    assert result.report.tokens_before == pipeline.counter("o200k_base").count_messages(messages)


async def test_lower_trigger_lowers_the_estimate_ceiling() -> None:
    """A policy trigger below the default makes exactness matter sooner."""
    pipeline = Pipeline()
    messages = long_history("trigger", turns=40)
    request = {"model": "gpt-4.1", "messages": messages}
    loose = await pipeline.compact(request, policy=Policy(max_input=200_000))
    strict = await Pipeline().compact(
        request, policy=Policy(max_input=200_000, trigger=0.1, target=0.05)
    )
    assert not loose.report.exact
    assert strict.report.exact
    await pipeline.settled()


async def test_a_conversation_with_other_fields_set_keeps_its_total_and_other_tools_do_not() -> (
    None
):
    """A stage that sets a field (a cache key) leaves the total as it was; one that changes
    the tools gets the tools' tokens counted again."""
    counter = TokenCounter()
    tokens = ConversationTokens(counter)
    messages = [{"role": "user", "content": "Find flights to SFO"}]
    received = Conversation.from_request({"model": "gpt-4o", "messages": messages})
    before = await tokens.first(received, threshold=100_000)
    assert tokens(received.with_fields(prompt_cache_key="k")) == before
    tool = {"type": "function", "function": {"name": "search", "parameters": {}}}
    tooled = received.with_fields(tools=[tool])
    assert tokens(tooled) == before + counter.count_tools([tool])
    assert tokens(tooled.with_fields(prompt_cache_key="k")) == tokens(tooled)
