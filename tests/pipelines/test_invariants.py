"""Pipeline invariants over generated conversations (all default stages, small budgets)."""

from __future__ import annotations

import re
from typing import Any

import orjson
from hypothesis import event, given
from hypothesis import strategies as st

from bench.compaction import Session, requests_of
from gateway.store import MemoryStore
from pipelines import CompactResult, Pipeline, Policy, RequestRejected
from pipelines.cache_break import without_markers
from pipelines.report import Report
from pipelines.stages import DEFAULT_STAGES, PassThrough
from tests.openai_schema import assert_valid_request
from tests.pipelines.stages.test_normalize import assert_valid

REF = re.compile(r"ctx_[A-Za-z0-9_-]{22,}")
MODELS = st.sampled_from(["gpt-4o", "claude-sonnet-4-5", "qwen-max"])
"""The OpenAI family (a prompt_cache_key), Anthropic's (message-level cache_control)
and Qwen's (cache_control on content parts)."""
words = st.text("abcdefgh ijklmnop0123456789{}[]:,\n", min_size=1, max_size=1_500)
long_words = st.builds(
    lambda text, seed, times: (
        f"{text} #{seed} " + "flight HAT170 on 2024-05-16, seat 12A. " * times
    ),
    words,
    st.integers(0, 10**6),
    st.integers(0, 300),
)


def unmarked(value: Any) -> Any:
    """``value`` with the cache markers taken off: no ``cache_control`` keys, and a content
    the Qwen marker made one text part a string again (these conversations have only
    string contents)."""
    value = without_markers(value)
    if isinstance(value, list):
        return [unmarked(item) for item in value]
    if isinstance(value, dict):
        if "messages" in value:
            return {**value, "messages": unmarked(value["messages"])}
        content = value.get("content")
        if isinstance(content, list) and len(content) == 1 and content[0].get("type") == "text":
            return {**value, "content": content[0]["text"]}
    return value


def markers(request: dict[str, Any]) -> int:
    """The cache_control markers anywhere in ``request``."""
    return orjson.dumps(request).decode().count('"cache_control"')


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


async def compacted(
    pipeline: Pipeline, request: dict[str, Any], policy: Policy
) -> CompactResult | None:
    """The pipeline's result, or ``None`` when it refused the request as too large (the
    only refusals allowed)."""
    try:
        result = await pipeline.compact(request, policy=policy)
    except RequestRejected as exc:
        rejected: str | None = exc.code
    else:
        rejected = None
    event(f"rejected: {rejected}")
    if rejected is None:
        return result
    assert rejected in ("context_length_exceeded", "payload_too_large")
    return None


@given(conversations(), st.sampled_from([4_000, 6_000, 12_000]), MODELS)
async def test_invariants(messages: list[dict[str, Any]], max_input: int, model: str) -> None:
    """Whatever the conversation and the model family: the output fits or the request is
    refused as too large; tool pairs are valid; the request (its cache markers aside) is a
    valid CreateChatCompletionRequest; system prompt and latest user message are unchanged;
    tokens never grow; every ref restores; the same request gives the same bytes; no more
    than 4 cache breakpoints."""
    store = MemoryStore()
    pipeline = Pipeline(store=store)
    request = {"model": model, "messages": messages}
    policy = Policy(max_input=max_input, filter_tokens=3_000)
    result = await compacted(pipeline, request, policy)
    if result is None:
        return
    event(f"compress: {'compress' in result.report.actions}")
    assert markers(result.request) <= 4
    out = unmarked(result.request["messages"])
    assert result.report.tokens_after <= result.report.budget
    assert result.report.tokens_after <= result.report.tokens_before
    assert_valid(out)
    assert_valid_request(unmarked(result.request))
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
    MODELS,
)
async def test_prefix_stable_between_events(
    messages: list[dict[str, Any]], max_input: int, gaps: list[float], model: str
) -> None:
    """Replayed turn by turn as a client sends it (the record carried, sometimes idle past
    the cache TTL): each outgoing request, its cache markers aside (they are not content
    to the provider's cache), starts with the previous one unless its report records a
    compaction event; between events no breakpoint but the rolling one lands on a message
    that did not carry one in an earlier request, and the prefix breakpoint does not move;
    never more than 4; every request fits and stays valid, and what the pipeline sends
    (re-applying its last cut where it can) is what a fresh pipeline computes."""
    store = MemoryStore()
    pipeline = Pipeline(store=store)
    policy = Policy(max_input=max_input, filter_tokens=3_000)
    session = Session(pipeline, policy, model=model)
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
            {"model": model, "messages": history}, policy=policy, state=state, now=session.now
        )
        assert orjson.dumps(computed.request) == orjson.dumps(result.request)
        assert markers(result.request) <= 4
        out = unmarked(result.request["messages"])
        assert result.report.tokens_after <= result.report.budget
        assert_valid(out)
        placed = breakpoints(result.report)
        if previous is not None:
            before_out, before_report, carried = previous
            if result.report.is_event_after(before_report):
                events += 1
            else:
                assert out[: len(before_out)] == before_out
                for at, why in placed.items():
                    assert why == "rolling" or at in carried, (at, why, carried)
                prefix = [at for at, why in breakpoints(before_report).items() if why == "prefix"]
                assert [at for at, why in placed.items() if why == "prefix"] in ([], prefix)
                placed = {**carried, **placed}
        previous = (out, result.report, placed)
    event(f"events: {min(events, 3)}")


def breakpoints(report: Report) -> dict[Any, str]:
    """Where the cache_markers stage placed breakpoints (a message index or ``tools``),
    and why."""
    stage = report.stage("cache_markers")
    assert stage is not None
    assert stage.error is None
    return {m["at"]: m["why"] for m in stage.details.get("markers", ())}


IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "iVBORw0K" * 40}}
odd_text = st.one_of(
    words,
    st.text(max_size=200),
    st.sampled_from(["", "\x00", "\u202e\u200b", "ctx_" + "A" * 30, "[ctx:ctx_" + "B" * 26 + "]"]),
)
huge_outputs = st.builds(lambda line, times: line * times, words, st.integers(1_000, 6_000))


@st.composite
def fuzzed_conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Conversations a fuzzer would send: tool rounds with huge or odd outputs, images,
    reasoning fields, developer messages, stray tool results and unanswered calls."""
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append(
            {"role": draw(st.sampled_from(["system", "developer"])), "content": "Agent."}
        )
    counter = 0
    for _ in range(draw(st.integers(1, 8))):
        content: Any = draw(odd_text)
        if draw(st.integers(0, 3)) == 0:
            content = [{"type": "text", "text": draw(odd_text)}, IMAGE]
        messages.append({"role": "user", "content": content})
        for _ in range(draw(st.integers(0, 2))):
            ids = [f"call_{counter + i}" for i in range(draw(st.integers(1, 3)))]
            counter += len(ids)
            turn: dict[str, Any] = {
                "role": "assistant",
                "content": draw(st.one_of(st.none(), odd_text)),
                "tool_calls": [call(i) for i in ids],
            }
            if draw(st.booleans()):
                turn["reasoning_content"] = draw(odd_text)
            messages.append(turn)
            answered = draw(st.lists(st.sampled_from(ids), unique=True, max_size=len(ids)))
            for i in answered:
                output = draw(st.one_of(odd_text, huge_outputs, long_words))
                messages.append({"role": "tool", "tool_call_id": i, "content": output})
        if draw(st.integers(0, 5)) == 0:
            messages.append({"role": "tool", "tool_call_id": "call_stray", "content": "stray"})
        messages.append({"role": "assistant", "content": draw(odd_text)})
    messages.append({"role": "user", "content": draw(odd_text)})
    return messages


def texts_of(messages: list[dict[str, Any]]) -> str:
    return orjson.dumps(messages).decode()


@given(fuzzed_conversations(), st.sampled_from([4_000, 8_000, 32_000]), MODELS)
async def test_invariants_under_fuzzed_conversations(
    messages: list[dict[str, Any]], max_input: int, model: str
) -> None:
    """Fuzzed conversations: ``compact`` raises nothing but a refusal, leaves every tool call
    answered in the block after it (and no tool message orphaned), never adds tokens, and
    every ref it leaves (and every ref inside what those restore) restores from the
    in-memory store."""
    store = MemoryStore()
    request = {"model": model, "messages": messages}
    policy = Policy(max_input=max_input, filter_tokens=3_000)
    result = await compacted(Pipeline(store=store), request, policy)
    if result is None:
        return
    out = unmarked(result.request["messages"])
    assert_valid(out)
    # Pair repair (normalize) answers unanswered calls, which may add a few tokens.
    if "normalize" not in result.report.actions:
        assert result.report.tokens_after <= result.report.tokens_before
    original = texts_of(messages)
    pending = set(REF.findall(texts_of(out))) - set(REF.findall(original))
    seen: set[str] = set()
    while pending:  # a stub may itself be offloaded later: follow refs to the original
        ref = pending.pop()
        seen.add(ref)
        stored = await store.get("", ref)
        assert stored is not None, ref
        assert stored  # what the client sent, which may be whitespace (a blank output)
        pending |= set(REF.findall(stored.decode())) - set(REF.findall(original)) - seen
