"""cache_markers: the prediction of cache breaks, and the record kept for the next request."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from pipelines import (
    ConversationState,
    Pipeline,
    Policy,
)
from pipelines.cache_break import without_markers
from pipelines.stages.cache_markers import CacheMarkers
from tests.pipelines.stages.cache_markers.samples import (
    CLAUDE,
    MARK,
    POLICY,
    REPLAYED,
    breaks_of,
    details,
    grow,
    history,
    tool,
)
from tests.pipelines.stages.cache_replay import replay as replay_traces
from tests.pipelines.stages.cache_replay import trajectories


async def test_cache_breaks_are_predicted_with_their_cause() -> None:
    """A changed model, system prompt or tool (changed, or only reordered) is named as the
    break's cause; a request that only grows is no break; markers the client moves are."""
    tools = [tool("a"), tool("b")]
    first = {"model": CLAUDE, "messages": history(), "tools": tools}
    steady = grow(first)
    steady["messages"][0] = {**steady["messages"][0], "cache_control": MARK}
    model = grow(steady, model="claude-opus-4-1")
    system = grow(model)
    system["messages"][0] = {"role": "system", "content": POLICY + " Be brief."}
    reordered = grow(system, tools=[tools[1], tools[0]])
    changed = grow(reordered, tools=[tools[1], tool("a", words=3)])
    both = grow(changed, model=CLAUDE, tools=tools)
    requests = [first, steady, model, system, reordered, changed, both]
    assert await breaks_of(requests) == [None, None, "model", "system", "tools", "tools", "model"]


async def test_tool_changes_say_how_the_tools_changed() -> None:
    """The report tells a reordered tools array from a changed, added or removed tool."""
    tools = [tool("a"), tool("b")]
    first = {"model": CLAUDE, "messages": history(), "tools": tools}
    for new, how in (
        ([tools[1], tools[0]], "order"),
        ([tools[0], tool("b", words=2)], "changed"),
        ([*tools, tool("c")], "added"),
        ([tools[0]], "removed"),
    ):
        pipeline = Pipeline(stages=[CacheMarkers()])
        sent = await pipeline.compact(first, now=1_000.0)
        result = await pipeline.compact(
            grow(first, tools=new), state=sent.state.answered(at=1_000.0), now=1_005.0
        )
        assert result.report.cache_break == "tools"
        assert details(result)["cache_break_tools"] == how


async def test_an_idle_conversation_breaks_on_the_ttl_and_compaction_outranks_it() -> None:
    """Back after the family's cache TTL (5 minutes for Claude) the break is ``ttl``;
    within it, none; a compaction event in the same request is named instead of the TTL."""
    first = {"model": CLAUDE, "messages": history()}
    second, third = grow(first), grow(grow(first))
    assert await breaks_of([first, second, third], gaps=[5.0, 301.0, 200.0]) == [None, "ttl", None]


async def test_a_compaction_event_is_a_break() -> None:
    """A request whose messages do not start with those the previous one sent records a
    ``compaction`` break (compress cutting the history for the first time); one whose
    rewrites all come after them (the cache-TTL prune archiving outputs the previous
    request did not have) leaves that prefix alone: only the expired TTL breaks it."""
    from gateway.store import MemoryStore

    policy = Policy(max_input=4_000)
    request = {"model": CLAUDE, "messages": history(turns=2)}
    more = history(turns=10, system=None, output=60)
    longer = {
        "model": CLAUDE,
        "messages": [*request["messages"], {"role": "assistant", "content": "Let me see."}, *more],
    }
    for now, cache in ((1_005.0, "hot"), (2_000.0, "expired")):
        pipeline = Pipeline(store=MemoryStore())
        sent = await pipeline.compact(request, policy=policy, now=1_000.0)
        assert sent.report.cache_break is None
        state = sent.state.answered(at=1_000.0)
        later = await pipeline.compact(longer, policy=policy, state=state, now=now)
        assert later.report.cache == cache
        assert later.report.is_event_after(sent.report)
        acted = "compress" if cache == "hot" else "ttl_prune"
        assert acted in later.report.actions
        went_up = [without_markers(m) for m in sent.request["messages"]]
        now_up = [without_markers(m) for m in later.request["messages"]]
        extends = now_up[: len(went_up)] == went_up
        assert extends is (cache == "expired")
        assert later.report.cache_break == ("ttl" if extends else "compaction")


async def test_a_diverged_history_is_not_a_break_and_old_records_still_load() -> None:
    """A history that does not continue the record's previous request is another
    conversation (no break is named); a record written before fingerprints were kept loads,
    and a request against it names no false break."""
    first = {"model": CLAUDE, "messages": history()}
    pipeline = Pipeline(stages=[CacheMarkers()])
    sent = await pipeline.compact(first, now=1_000.0)
    other = {"model": "claude-opus-4-1", "messages": history(turns=1, system="Other prompt " * 400)}
    diverged = await pipeline.compact(other, state=sent.state.answered(at=1_000.0), now=1_005.0)
    assert diverged.report.cache == "diverged"
    assert diverged.report.cache_break is None
    old = ConversationState.from_json(b'{"last_seen": 1000.0, "calls": 1, "seen": 0}')
    assert old.tool_hashes is None
    assert old.model_hash == ""
    assert (await pipeline.compact(grow(first), state=old, now=1_005.0)).report.cache_break is None


def test_fingerprints_survive_the_records_wire_form() -> None:
    """The fingerprints a request leaves in the record read back equal from JSON."""
    state = ConversationState(
        model_hash="m", system_hash="s", tool_hashes=("a", "b"), sent_messages=4, sent_last="x"
    )
    assert ConversationState.from_json(state.to_json()) == state


async def test_a_break_is_named_exactly_when_the_prompt_that_went_up_is_not_extended() -> None:
    """Replayed sessions under compaction (the cache warm between turns): a request names a
    cache break when, and only when, the prompt the previous request sent (as the
    provider's cache reads it, markers aside) is not the start of its own, whatever the
    stages did (compress keeping its cut sends the same prefix again)."""
    bill = await replay_traces(trajectories(REPLAYED), Policy(max_input=8_000), markers="stage")
    named = kept = 0
    for reports, prompts in zip(bill.reports, bill.prompts, strict=True):
        for index in range(1, len(reports)):
            before, after = prompts[index - 1], prompts[index]
            extends = len(after) >= len(before) and after[len(before) - 1] == before[-1]
            cause = reports[index].cache_break
            assert cause == (None if extends else "compaction"), (index, cause, extends)
            named += cause is not None
            kept += "compress" in reports[index].actions and extends
    assert named >= 5
    assert kept >= 20  # compress acted on many requests that broke nothing


async def test_crossing_the_light_level_without_rewriting_anything_is_no_break() -> None:
    """A growing conversation that reaches compress's light level (deduplication) with no
    duplicate to replace goes out with the previous request's prefix: no break is named,
    as no compaction event is seen."""
    from gateway.store import MemoryStore

    pipeline, policy = Pipeline(store=MemoryStore()), Policy(max_input=4_000)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent. " * 60}]
    state, reports = None, []
    for n in range(18):
        messages.append({"role": "user", "content": f"Weather in city {n}? " * 8})
        result = await pipeline.compact(
            {"model": CLAUDE, "messages": messages}, policy=policy, state=state, now=1_000.0 + n
        )
        reports.append(result.report)
        state = result.state.answered(at=1_000.0 + n)
        messages.append({"role": "assistant", "content": f"Sunny in city {n}. " * 8})
    levels = [r.stage("compress").details.get("level") for r in reports]
    assert levels[0] is None
    assert levels[-1] == "light"
    assert all(not r.stage("compress").changed for r in reports)
    assert [r.cache_break for r in reports] == [None] * len(reports)
    assert not any(now.is_event_after(before) for before, now in pairwise(reports))


async def test_a_developer_message_appended_breaks_only_where_system_is_hoisted() -> None:
    """A developer message added later in the conversation stays in place for gpt-4o
    (the cached prefix is intact: no break), while Claude's API moves it into the system
    prompt, before the cached history (a ``system`` break); a changed leading system
    prompt is a break for both."""
    for model, expected in (("gpt-4o", None), (CLAUDE, "system")):
        first = {"model": model, "messages": history()}
        reminder = grow(first)
        reminder["messages"].insert(-1, {"role": "developer", "content": "Be brief."})
        edited = grow(reminder)
        edited["messages"][0] = {"role": "system", "content": POLICY + " Be brief."}
        assert await breaks_of([first, reminder, edited]) == [None, expected, "system"]
