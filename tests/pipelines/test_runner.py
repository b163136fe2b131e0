"""The runner: order, timing, per-stage reports and spans, and fail-open handling."""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode, Tracer

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


class Store:
    """An offload store in a dict, with ``touch`` (as the gateway's stores have)."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.touched = 0

    async def put(self, namespace: str, content: bytes, *, ttl: int) -> str:
        ref = f"ctx_{len(self.objects):022d}"
        self.objects[ref] = content
        return ref

    async def get(self, namespace: str, ref: str) -> bytes | None:
        return self.objects.get(ref)

    async def touch(self, namespace: str, ref: str, ttl: int) -> bool:
        self.touched += 1
        return ref in self.objects


@dataclass(frozen=True)
class OffloadTwo:
    """Stores two objects and checks it can still ask the store cheaply."""

    name: str = "offload"

    async def __call__(self, conversation: Conversation, ctx: StageContext) -> Conversation:
        assert ctx.store is not None
        for content in (b"one", b"two"):
            await ctx.store.put(ctx.namespace, content, ttl=60)
        assert await ctx.confirmed("ctx_" + "0" * 22)
        return conversation


@pytest.fixture
def exported() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracer(exported: InMemorySpanExporter) -> Tracer:
    """A tracer of a provider of its own (the process's global one stays unset)."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    return provider.get_tracer("test")


def spans_by_name(exported: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {span.name: span for span in exported.get_finished_spans()}


async def test_each_stage_gets_a_span_under_the_pipelines(
    tracer: Tracer, exported: InMemorySpanExporter
) -> None:
    """One span per stage, children of one pipeline span, with the tokens before and
    after each stage and whether it changed the request."""
    pipeline = Pipeline(stages=[PassThrough("a"), ShortenLast()], tracer=tracer)
    result = await pipeline.compact(copy.deepcopy(REQUEST))
    spans = spans_by_name(exported)
    top, a, shorten = (
        spans[n]
        for n in ("contextgate.pipeline", "contextgate.stage.a", "contextgate.stage.shorten")
    )
    assert top.parent is None
    for stage in (a, shorten):
        assert stage.parent is not None
        assert stage.parent.span_id == top.context.span_id
    report = result.report
    assert shorten.attributes is not None
    assert dict(shorten.attributes) == {
        "contextgate.stage.name": "shorten",
        "contextgate.tokens.before": report.tokens_before,
        "contextgate.tokens.after": report.tokens_after,
        "contextgate.stage.changed": True,
        "contextgate.stage.refs": 0,
    }
    assert top.attributes is not None
    assert top.attributes["contextgate.tokens.after"] == report.tokens_after
    assert top.attributes["contextgate.tokens.budget"] == report.budget
    assert list(top.attributes["contextgate.actions"]) == ["shorten"]  # type: ignore[arg-type]


async def test_a_failing_stage_span_is_an_error_without_its_message(
    tracer: Tracer, exported: InMemorySpanExporter
) -> None:
    """A stage that raised has status ERROR and the exception's type; its message, which
    may quote the conversation, stays out of the span; the stages after it still run."""
    pipeline = Pipeline(stages=[Explode(), ShortenLast()], tracer=tracer)
    await pipeline.compact(copy.deepcopy(REQUEST))
    spans = spans_by_name(exported)
    failed = spans["contextgate.stage.explode"]
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes is not None
    assert failed.attributes["error.type"] == "RuntimeError"
    assert "stage bug" not in str(failed.attributes) + str(failed.status.description)
    assert not failed.events
    assert spans["contextgate.stage.shorten"].status.status_code is StatusCode.UNSET
    assert spans["contextgate.pipeline"].status.status_code is StatusCode.UNSET


async def test_a_stage_span_counts_the_refs_it_offloaded(
    tracer: Tracer, exported: InMemorySpanExporter
) -> None:
    """``contextgate.stage.refs`` is the number of objects the stage put in the store,
    and the stage sees the store as it is (its ``touch`` too)."""
    store = Store()
    pipeline = Pipeline(stages=[OffloadTwo(), PassThrough("after")], store=store, tracer=tracer)
    result = await pipeline.compact(copy.deepcopy(REQUEST))
    assert result.report.failures == []
    spans = spans_by_name(exported)
    offload = spans["contextgate.stage.offload"].attributes
    assert offload is not None
    assert offload["contextgate.stage.refs"] == 2
    after = spans["contextgate.stage.after"].attributes
    assert after is not None
    assert after["contextgate.stage.refs"] == 0
    assert len(store.objects) == 2
    assert store.touched == 1


async def test_a_rejection_is_named_not_an_error(
    tracer: Tracer, exported: InMemorySpanExporter
) -> None:
    """A stage rejecting the request on purpose marks its span and the pipeline's with the
    reason; it is the client's request, not a failure of the gateway."""
    with pytest.raises(RequestRejected):
        await Pipeline(stages=[Reject()], tracer=tracer).compact(REQUEST)
    for span in exported.get_finished_spans():
        assert span.attributes is not None
        assert span.attributes["contextgate.rejected"] == "payload_too_large"
        assert span.status.status_code is StatusCode.UNSET
