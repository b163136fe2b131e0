"""The upstream summarizer against the mock upstream playing the summary model: valid,
invalid, incomplete and forgetful answers, errors, a provider without structured output,
and a model too slow for the deadline."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.config import UpstreamSettings
from gateway.providers.openai import Upstream
from gateway.summaries.model import chat_post
from gateway.summaries.summarizer import SummaryFailed, UpstreamSummarizer
from pipelines.summary import FIELDS, LIST_FIELDS
from tests.mock_upstream import JSONReply, MockUpstream, chat_completion

HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "Cambia la reserva 8JE9YY al vuelo HAT170 del 2024-05-24."},
    {
        "role": "assistant",
        "content": "Hecho: la reserva 8JE9YY ahora va en HAT170 (2024-05-24), asiento 12A,"
        " tarifa 1240 EUR.",
    },
]
EMPTY = {name: ([] if name in LIST_FIELDS else "") for name in FIELDS}
GOOD = EMPTY | {
    "user_goal": "Cambiar la reserva 8JE9YY al vuelo HAT170 del 2024-05-24.",
    "completed_actions": ["Reserva 8JE9YY movida a HAT170 (2024-05-24), asiento 12A, 1240 EUR."],
}


def answering(summary: Any) -> JSONReply:
    text = summary if isinstance(summary, str) else orjson.dumps(summary).decode()
    return JSONReply(chat_completion(text))


async def run(upstream: MockUpstream, **options: Any) -> Any:
    client = Upstream(UpstreamSettings(base_url=upstream.base_url))
    try:
        post = chat_post(client, {"authorization": "Bearer sk-x"}, lambda model: 4_096)
        summarizer = UpstreamSummarizer(post, **options)
        return await summarizer.summarize(HISTORY, model="gpt-4o-mini")
    finally:
        await client.aclose()


async def test_a_valid_answer_in_structured_output_mode(upstream: MockUpstream) -> None:
    upstream.push(answering(GOOD))
    summary = await run(upstream)
    assert summary.fields == GOOD
    assert summary.attempts == 1
    assert summary.retention == 1.0
    sent = upstream.received[0].json()
    assert sent["model"] == "gpt-4o-mini"
    assert sent["response_format"]["json_schema"]["strict"] is True
    assert "8JE9YY" in sent["messages"][1]["content"]


async def test_invalid_then_forgetful_then_good_takes_three_attempts(
    upstream: MockUpstream,
) -> None:
    forgetful = EMPTY | {"user_goal": "Cambiar una reserva."}
    upstream.push(answering("not json at all"), answering(forgetful), answering(GOOD))
    summary = await run(upstream)
    assert summary.attempts == 3
    assert summary.fields == GOOD


async def test_the_best_attempt_is_kept_when_none_keeps_enough(upstream: MockUpstream) -> None:
    poor = EMPTY | {"user_goal": "Cambiar una reserva."}
    better = EMPTY | {"user_goal": "Reserva 8JE9YY."}
    upstream.push(answering(poor), answering(better), answering({"user_goal": "missing fields"}))
    summary = await run(upstream)
    assert summary.fields == better
    assert 0 < summary.retention < 0.3


async def test_no_valid_answer_fails(upstream: MockUpstream) -> None:
    upstream.push(*(answering({"only": "wrong"}) for _ in range(3)))
    with pytest.raises(SummaryFailed, match="fields missing"):
        await run(upstream)


async def test_an_error_status_fails(upstream: MockUpstream) -> None:
    upstream.push(JSONReply({"error": {"message": "overloaded"}}, status=503))
    with pytest.raises(SummaryFailed, match="503"):
        await run(upstream)


async def test_a_provider_without_structured_output_is_asked_plainly(
    upstream: MockUpstream,
) -> None:
    refusal = {
        "error": {"message": "Unknown parameter: response_format", "type": "invalid_request_error"}
    }
    upstream.push(JSONReply(refusal, status=400), answering(GOOD))
    summary = await run(upstream)
    assert summary.fields == GOOD
    assert "response_format" in upstream.received[0].json()
    assert "response_format" not in upstream.received[1].json()


async def test_a_refusal_in_other_words_is_also_asked_plainly(upstream: MockUpstream) -> None:
    """A provider that refuses structured output in its own terms (Anthropic's
    ``output_config``, for a Claude model without it) still gets its summary asked for."""
    refusal = {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "output_config.format: this model does not support structured outputs",
        },
    }
    upstream.push(JSONReply(refusal, status=400), answering(GOOD))
    summary = await run(upstream)
    assert summary.fields == GOOD
    assert "response_format" not in upstream.received[1].json()


async def test_a_slow_model_is_cut_off_at_the_deadline(upstream: MockUpstream) -> None:
    upstream.push(JSONReply(chat_completion(orjson.dumps(GOOD).decode()), delay=2.0))
    with pytest.raises(SummaryFailed, match=r"within 0\.3 s"):
        await run(upstream, timeout=0.3)


async def test_repeated_failures_pause_summaries(upstream: MockUpstream) -> None:
    """After 3 failed summaries in a row the next is refused at once, without asking the
    model; after the cool-down one is let through again."""
    from gateway.breaker import CircuitBreaker

    now = [0.0]
    breaker = CircuitBreaker(3, 30.0, clock=lambda: now[0])
    upstream.push(*(JSONReply({"error": {"message": "down"}}, status=503) for _ in range(3)))
    for _ in range(3):
        with pytest.raises(SummaryFailed, match="503"):
            await run(upstream, breaker=breaker)
    asked = len(upstream.received)
    with pytest.raises(SummaryFailed, match="paused"):
        await run(upstream, breaker=breaker)
    assert len(upstream.received) == asked
    now[0] = 31.0
    upstream.push(answering(GOOD))
    assert (await run(upstream, breaker=breaker)).fields == GOOD
    assert breaker.state == "closed"


async def test_the_callers_own_refusals_do_not_pause_summaries(upstream: MockUpstream) -> None:
    """401, 403, 404 and 429 say the caller's key, model or quota is the problem: any
    number of them leaves summaries running for everyone else."""
    from gateway.breaker import CircuitBreaker

    breaker = CircuitBreaker(3, 30.0)
    for status in (401, 403, 404, 429, 401):
        upstream.push(JSONReply({"error": {"message": "no"}}, status=status))
        with pytest.raises(SummaryFailed, match=str(status)):
            await run(upstream, breaker=breaker)
    assert breaker.state == "closed"
    upstream.push(answering(GOOD))
    assert (await run(upstream, breaker=breaker)).fields == GOOD


async def test_a_probe_ended_by_an_overflow_or_by_its_caller_does_not_jam_the_breaker(
    upstream: MockUpstream,
) -> None:
    """Half-open, the one probe let through may end in a context overflow (the input's
    fault) or be cancelled by the request's own deadline: another probe is allowed after
    either, and a cancelled one counts as a failure (a model too slow for its callers)."""
    import asyncio

    from gateway.breaker import CircuitBreaker
    from pipelines.summary import SummaryOverflow

    now = [0.0]
    breaker = CircuitBreaker(3, 30.0, clock=lambda: now[0])
    for _ in range(3):
        breaker.failure()
    now[0] = 31.0
    overflow = {"error": {"message": "maximum context length exceeded", "code": None}}
    upstream.push(JSONReply(overflow, status=400))
    with pytest.raises(SummaryOverflow):
        await run(upstream, breaker=breaker)
    assert breaker.allow()  # a new probe
    breaker.release()
    upstream.push(JSONReply(chat_completion(orjson.dumps(GOOD).decode()), delay=2.0))
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.3):
            await run(upstream, breaker=breaker)
    assert breaker.state == "open"  # counted: the probe failed
    now[0] = 62.0
    upstream.push(answering(GOOD))
    assert (await run(upstream, breaker=breaker)).fields == GOOD
