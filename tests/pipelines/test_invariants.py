"""Pipeline invariants over generated conversations (all default stages, small budgets)."""

from __future__ import annotations

import re
from typing import Any

import orjson
from hypothesis import event, given
from hypothesis import strategies as st

from bench.compaction import Session, requests_of
from gateway.store import MemoryStore
from pipelines import Pipeline, Policy, RequestRejected
from pipelines.stages import DEFAULT_STAGES, PassThrough
from tests.openai_schema import assert_valid_request
from tests.pipelines.stages.test_normalize import assert_valid

REF = re.compile(r"ctx_[A-Za-z0-9_-]{22,}")
words = st.text("abcdefgh ijklmnop0123456789{}[]:,\n", min_size=1, max_size=1_500)
long_words = st.builds(
    lambda text, seed, times: (
        f"{text} #{seed} " + "flight HAT170 on 2024-05-16, seat 12A. " * times
    ),
    words,
    st.integers(0, 10**6),
    st.integers(0, 300),
)


def call(call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "lookup", "arguments": "{}"}}


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A system prompt, then user turns, each answered by text or by tool-call rounds."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."}]
    counter = 0
    for _ in range(draw(st.integers(1, 14))):
        messages.append({"role": "user", "content": draw(words)})
        for _ in range(draw(st.integers(0, 3))):
            ids = [f"call_{counter + i}" for i in range(draw(st.integers(1, 2)))]
            counter += len(ids)
            messages.append(
                {"role": "assistant", "content": None, "tool_calls": [call(i) for i in ids]}
            )
            messages.extend(
                {"role": "tool", "tool_call_id": i, "content": draw(long_words)} for i in ids
            )
        messages.append({"role": "assistant", "content": draw(long_words)})
    messages.append({"role": "user", "content": draw(words)})
    return messages


@given(conversations(), st.sampled_from([4_000, 6_000, 12_000]))
async def test_invariants(messages: list[dict[str, Any]], max_input: int) -> None:
    """Whatever the conversation: the output fits or the request is refused as too large;
    tool pairs are valid; the request is a valid CreateChatCompletionRequest; system prompt
    and latest user message are unchanged; tokens never grow; every ref restores; the same
    request gives the same bytes."""
    store = MemoryStore()
    pipeline = Pipeline(store=store)
    request = {"model": "gpt-4o", "messages": messages}
    policy = Policy(max_input=max_input, filter_tokens=3_000)
    try:
        result = await pipeline.compact(request, policy=policy)
    except RequestRejected as exc:
        rejected = exc.code
    else:
        rejected = None
    event(f"rejected: {rejected}")
    if rejected is not None:
        assert rejected in ("context_length_exceeded", "payload_too_large")
        return
    event(f"compress: {'compress' in result.report.actions}")
    out = result.request["messages"]
    assert result.report.tokens_after <= result.report.budget
    assert result.report.tokens_after <= result.report.tokens_before
    assert_valid(out)
    assert_valid_request(result.request)
    assert out[0] == messages[0]
    assert out[-1] == messages[-1]
    for ref in REF.findall(orjson.dumps(out).decode()):
        assert await store.get("", ref) is not None
    again = await pipeline.compact(request, policy=policy)
    assert orjson.dumps(again.request) == orjson.dumps(result.request)


@given(
    conversations(),
    st.sampled_from([4_000, 8_000]),
    st.lists(st.sampled_from([5.0, 5.0, 5.0, 900.0]), min_size=40, max_size=40),
)
async def test_prefix_stable_between_events(
    messages: list[dict[str, Any]], max_input: int, gaps: list[float]
) -> None:
    """Replayed turn by turn as a client sends it (the record carried, sometimes idle past
    the cache TTL): each outgoing request starts with the previous one unless its report
    records a compaction event, every request fits and stays valid, and what the pipeline
    sends (re-applying its last cut where it can) is what a fresh pipeline computes."""
    store = MemoryStore()
    pipeline = Pipeline(store=store)
    policy = Policy(max_input=max_input, filter_tokens=3_000)
    session = Session(pipeline, policy)
    previous = None
    events = 0
    for turn, history in enumerate(requests_of(messages)):
        state = session.state
        try:
            result = await session.send(history, after=gaps[turn % len(gaps)])
        except RequestRejected:
            previous = None
            continue
        fresh = Pipeline(
            stages=[s if isinstance(s, PassThrough) else type(s)() for s in DEFAULT_STAGES],
            store=store,
        )
        fresh._counters = pipeline._counters  # the same token caches, not the same memory
        computed = await fresh.compact(
            {"model": "gpt-4o", "messages": history}, policy=policy, state=state, now=session.now
        )
        assert orjson.dumps(computed.request) == orjson.dumps(result.request)
        out = result.request["messages"]
        assert result.report.tokens_after <= result.report.budget
        assert_valid(out)
        if previous is not None:
            before_out, before_report = previous
            if result.report.is_event_after(before_report):
                events += 1
            else:
                assert out[: len(before_out)] == before_out
        previous = (out, result.report)
    event(f"events: {min(events, 3)}")
