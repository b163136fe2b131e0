"""The runner: order, timing, per-stage reports, and fail-open handling."""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass

import pytest

from pipelines import Conversation, Pipeline, RequestRejected, StageContext
from pipelines.stages import PassThrough

REQUEST = {
    "model": "gpt-4o",
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Tell me everything about the project status. " * 20},
    ],
}


@dataclass(frozen=True)
class Explode:
    name: str = "explode"

    async def __call__(self, conversation: Conversation, ctx: StageContext) -> Conversation:
        raise RuntimeError("stage bug")


@dataclass(frozen=True)
class ShortenLast:
    """Replaces the last message's content with a short text and reports it."""

    name: str = "shorten"

    async def __call__(self, conversation: Conversation, ctx: StageContext) -> Conversation:
        *head, last = conversation.messages
        ctx.record(items=1)
        return conversation.with_messages([*head, {**last, "content": "short"}])


@dataclass(frozen=True)
class Reject:
    name: str = "reject"

    async def __call__(self, conversation: Conversation, ctx: StageContext) -> Conversation:
        raise RequestRejected("payload_too_large", "too big")


async def test_failing_stage_is_skipped_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    """A stage that raises leaves the request as it was, is reported as failed and logged,
    and the stages after it still run."""
    pipeline = Pipeline(stages=[PassThrough("a"), Explode(), ShortenLast()])
    with caplog.at_level(logging.WARNING, logger="contextgate.pipeline"):
        result = await pipeline.compact(copy.deepcopy(REQUEST))
    report = result.report
    assert report.failures == ["explode"]
    assert report.stages[1].error == "RuntimeError: stage bug"
    assert report.actions == ["shorten"]
    assert result.request["messages"][-1]["content"] == "short"
    assert "stage explode failed" in caplog.text


@dataclass(frozen=True)
class ReturnNothing:
    name: str = "nothing"

    async def __call__(self, conversation: Conversation, ctx: StageContext) -> Conversation:
        return None  # type: ignore[return-value]


@dataclass(frozen=True)
class AddBadMessage:
    name: str = "bad"

    async def __call__(self, conversation: Conversation, ctx: StageContext) -> Conversation:
        return conversation.with_messages([*conversation.messages, "not a message"])  # type: ignore[list-item]


async def test_stage_returning_garbage_is_a_failure_not_a_crash() -> None:
    """A stage that returns something other than a conversation, or one the counter cannot
    read, is treated like one that raised: skipped, counted, request unchanged."""
    result = await Pipeline(stages=[ReturnNothing(), AddBadMessage()]).compact(REQUEST)
    assert result.report.failures == ["nothing", "bad"]
    assert not result.changed
    assert result.request == REQUEST


async def test_reports_tokens_and_time_per_stage() -> None:
    """Each stage's report carries its time and the tokens before and after it; totals
    match the first and last stage."""
    pipeline = Pipeline(stages=[PassThrough("a"), ShortenLast(), PassThrough("b")])
    result = await pipeline.compact(copy.deepcopy(REQUEST))
    a, shorten, b = result.report.stages
    assert a.tokens_before == a.tokens_after == result.report.tokens_before
    assert shorten.tokens_after < shorten.tokens_before
    assert shorten.details == {"items": 1}
    assert b.tokens_before == b.tokens_after == result.report.tokens_after
    assert all(stage.ms >= 0 for stage in result.report.stages)
    assert result.report.ms >= sum(stage.ms for stage in result.report.stages)
    assert result.changed


async def test_rejection_propagates() -> None:
    """RequestRejected is not swallowed: the request must not be sent."""
    with pytest.raises(RequestRejected) as caught:
        await Pipeline(stages=[Reject()]).compact(REQUEST)
    assert caught.value.code == "payload_too_large"


async def test_callers_request_is_not_mutated() -> None:
    """Compacting never changes the caller's request object."""
    original = copy.deepcopy(REQUEST)
    request = copy.deepcopy(REQUEST)
    await Pipeline(stages=[ShortenLast()]).compact(request)
    assert request == original


async def test_unchanged_request_reports_unchanged() -> None:
    """When no stage acts (a short request that already names its prompt_cache_key), the
    result says so and equals the input."""
    request = {**REQUEST, "prompt_cache_key": "the-clients-own"}
    result = await Pipeline().compact(request)
    assert not result.changed
    assert result.request == request
    assert result.report.actions == []
    assert result.report.tokens_before == result.report.tokens_after
