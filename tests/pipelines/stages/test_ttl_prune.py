"""ttl_prune: old tool results trimmed or archived only while the provider's cache is cold
(or under pressure), the last three assistant turns and the anchor untouched, every
original restorable, and the same rewrites re-applied on the next request."""

from __future__ import annotations

import re
from typing import Any

import orjson

from gateway.store import MemoryStore
from pipelines import CompactResult, ConversationState, Pipeline, Policy
from pipelines.stages.ttl_prune import TtlPrune
from tests.openai_schema import assert_valid_request
from tests.pipelines.stages.conftest import FailingStore

REF = re.compile(r"ctx_[A-Za-z0-9_-]{22,}")
NOW = 50_000.0
HOT = ConversationState(last_seen=NOW - 30, calls=5)


def log_output(n: int, lines: int = 300) -> str:
    return "\n".join(f"step {n}.{i}: compiled module_{i}.py in {i % 97} ms" for i in range(lines))


def session(turns: int, output: Any = log_output) -> list[dict[str, Any]]:
    """An agent loop: one user request, then ``turns`` tool calls with large outputs."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a build agent."},
        {"role": "user", "content": "Build the project and fix what fails."},
    ]
    for n in range(turns):
        call = {
            "id": f"call_{n}",
            "type": "function",
            "function": {"name": "run", "arguments": orjson.dumps({"step": n}).decode()},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{n}", "content": output(n)})
    return messages


async def prune(
    messages: list[dict[str, Any]],
    store: Any,
    state: ConversationState | None = None,
    **policy: Any,
) -> CompactResult:
    result = await Pipeline(stages=[TtlPrune()], store=store).compact(
        {"model": "gpt-4o", "messages": messages},
        policy=Policy(**policy),
        state=state,
        now=NOW,
    )
    assert_valid_request(result.request)
    return result


def details(result: CompactResult) -> dict[str, Any]:
    return result.report.stages[0].details


async def test_cold_cache_over_hard_ratio_archives_old_outputs_and_keeps_the_recent() -> None:
    messages = session(8)
    store = MemoryStore()
    result = await prune(messages, store, max_input=40_000)
    out = result.request["messages"]
    assert result.report.cache == "new"
    tools = [i for i, m in enumerate(messages) if m["role"] == "tool"]
    # the anchor's result (the first call answers the first user message) and the last
    # three assistant turns' results are untouched; the rest are archived
    untouched = {tools[0], *tools[-3:]}
    for index in tools:
        if index in untouched:
            assert out[index] == messages[index]
            continue
        assert out[index]["content"].startswith("[Archived output of run")
        assert out[index]["tool_call_id"] == messages[index]["tool_call_id"]
        ref = REF.search(out[index]["content"]).group()  # type: ignore[union-attr]
        assert await store.get("", ref) == messages[index]["content"].encode()
    assert details(result)["archived"] == 4
    assert result.state.archive_cut == tools[-3] - 1
    assert result.report.tokens_after < 0.55 * result.report.tokens_before


async def test_between_the_ratios_outputs_are_trimmed_not_archived() -> None:
    """JSON is cut by structure and stays valid JSON; text keeps its head and tail."""

    def big_json(n: int) -> str:
        rows = [{"id": f"row-{n}-{i}", "note": "x" * 50} for i in range(400)]
        return orjson.dumps({"rows": rows, "total": 400}).decode()

    for output, check in (
        (
            log_output,
            lambda text: "characters cut" in text and "step 1.299" in text and "step 1.0:" in text,
        ),
        (big_json, lambda text: orjson.loads(text)["total"] == 400),
    ):
        messages = session(6, output)
        store = MemoryStore()
        tokens = (await prune(messages, store, mode="off")).report.tokens_before
        # utilisation 0.4: over soft (0.30), under hard (0.50)
        result = await prune(messages, store, max_input=int(tokens / 0.4))
        trimmed = result.request["messages"][5]["content"]
        note, body = trimmed.split("\n", 1)
        assert note.startswith("[Trimmed to save space")
        assert check(body)
        assert await store.get("", REF.search(note).group()) == messages[5]["content"].encode()  # type: ignore[union-attr]
        assert details(result)["soft_trimmed"] == 2
        assert details(result)["archived"] == 0


async def test_a_warm_cache_leaves_everything_below_pressure() -> None:
    messages = session(8)
    result = await prune(messages, MemoryStore(), state=HOT, max_input=60_000)
    assert not result.changed
    assert result.report.cache == "hot"
    assert result.state.archive_cut == 0


async def test_pressure_with_a_warm_cache_is_left_to_compress() -> None:
    """Over 0.90 with a warm cache nothing new is pruned: compress deals with pressure
    with cuts that stay put; moving these too would break the warm prefix."""
    messages = session(8)
    tokens = (await prune(messages, MemoryStore(), mode="off")).report.tokens_before
    result = await prune(messages, MemoryStore(), state=HOT, max_input=int(tokens / 0.95))
    assert not result.changed
    assert result.state.archive_cut == 0


async def test_an_expired_cache_or_a_non_caching_provider_is_cold() -> None:
    messages = session(8)
    idle = ConversationState(last_seen=NOW - 601, calls=5)  # gpt-4o's cache TTL is 600 s
    result = await prune(messages, MemoryStore(), state=idle, max_input=40_000)
    assert result.report.cache == "expired"
    assert details(result)["archived"] == 4
    missing = ConversationState(last_seen=NOW - 30, calls=5, prompt_tokens=30_000, cached_tokens=0)
    result = await prune(messages, MemoryStore(), state=missing, max_input=40_000)
    assert result.report.cache == "low hit rate"
    assert details(result)["archived"] == 4


async def test_the_next_request_gets_the_same_rewrites_while_the_cache_is_warm() -> None:
    """After a cold pass, a longer history with a warm cache starts with exactly the
    previous outgoing messages; the cut does not move."""
    store = MemoryStore()
    messages = session(12)
    first = await prune(messages[:-4], store, max_input=70_000)
    assert details(first)["archived"] == 6  # 10 calls: the anchor's and the last 3 stay
    state = first.state.answered(at=NOW - 5)
    second = await prune(messages, store, state=state, max_input=70_000)
    sent = first.request["messages"]
    assert second.request["messages"][: len(sent)] == sent
    assert second.state.archive_cut == first.state.archive_cut
    assert details(second)["moved"] is False


async def test_work_per_pass_is_bounded_and_resumes_on_the_next_cold_pass() -> None:
    store = MemoryStore()
    messages = session(20)
    first = await prune(messages, store, max_input=60_000)
    assert details(first)["archived"] == 8
    idle = first.state.answered(at=NOW - 3_600)
    second = await prune(messages, store, state=idle, max_input=60_000)
    assert details(second)["archived"] == 16  # 8 re-applied, 8 new
    assert second.state.archive_cut > first.state.archive_cut


async def test_nothing_changes_when_the_store_refuses() -> None:
    messages = session(8)
    result = await prune(messages, FailingStore(), max_input=40_000)
    assert not result.changed
    # the cut stops before the first output it could not store (index 5; 3 is the anchor's)
    assert result.state.archive_cut == result.state.soft_cut == 5


async def test_an_output_cheaper_than_its_stub_stays_and_later_ones_are_archived() -> None:
    """Blank lines or a repeated character over the 400-character minimum tokenize to
    fewer tokens than the stub that would replace them: such an output is left as sent,
    and archiving goes on past it."""
    dense = {2: " " * 600, 3: "\n" * 450, 4: "=" * 500}

    def output(n: int) -> str:
        return dense.get(n) or log_output(n)

    messages = session(9, output)
    store = MemoryStore()
    result = await prune(messages, store, max_input=40_000)
    out = result.request["messages"]
    tools = [i for i, m in enumerate(messages) if m["role"] == "tool"]
    for n in dense:
        assert out[tools[n]] == messages[tools[n]]
    archived = [n for n, i in enumerate(tools) if out[i]["content"].startswith("[Archived")]
    assert archived == [1, 5]  # 0 is the anchor's, 6-8 the last three turns'
    assert result.report.tokens_after < result.report.tokens_before


async def test_an_output_whose_cut_part_is_cheaper_than_the_note_is_not_trimmed() -> None:
    """Trimming keeps 1,500 characters at each end and adds a note with the ref: when
    what it would cut is blank, the trimmed output costs more than the whole, so it stays
    as sent and the outputs after it are trimmed."""
    head = log_output(1, 100)[:1_500]

    def output(n: int) -> str:
        return head + " " * 600 + head if n == 1 else log_output(n)

    messages = session(6, output)
    store = MemoryStore()
    tokens = (await prune(messages, store, mode="off")).report.tokens_before
    result = await prune(messages, store, max_input=int(tokens / 0.4))  # between the ratios
    out = result.request["messages"]
    assert out[5] == messages[5]
    assert out[7]["content"].startswith("[Trimmed to save space")
    assert details(result)["soft_trimmed"] == 1


async def test_the_choice_to_leave_a_dense_output_holds_when_counts_are_estimates() -> None:
    """A long history the process has not seen is counted by estimate when it is far below
    every threshold (a 1M-token window here), and an estimate of blank lines is far above
    their real cost. Whether a stub saves tokens is still decided on exact counts, so the
    next request (warm cache, exact counts) sends the same history, byte for byte."""

    def output(n: int) -> str:
        return "\n" * 450 if n == 2 else log_output(n, 60)

    messages = session(100, output)
    pipeline = Pipeline(stages=[TtlPrune()], store=MemoryStore())
    policy = Policy(soft_ratio=0.05, hard_ratio=0.05)
    body = {"model": "gpt-4.1", "messages": messages}
    first = await pipeline.compact(body, policy=policy, now=NOW)
    assert not first.report.exact
    await pipeline.settled()
    warm = first.state.answered(at=NOW - 5)
    second = await pipeline.compact(body, policy=policy, state=warm, now=NOW)
    assert second.report.cache == "hot"
    assert details(first)["archived"] > 0
    assert first.request["messages"][7] == messages[7]  # the blank output, as sent
    assert second.request["messages"] == first.request["messages"]
