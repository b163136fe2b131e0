"""cache_markers: Anthropic/Qwen breakpoints (at most 4 with the client's), the OpenAI
prompt_cache_key, and the prediction of cache breaks."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import orjson
import pytest

from bench.prompt_cache import PrefixCache
from pipelines import (
    Conversation,
    ConversationState,
    Pipeline,
    Policy,
    StageContext,
)
from pipelines.cache_break import without_markers
from pipelines.stages.cache_markers import CacheMarkers, cache_key
from tests.pipelines.stages.cache_replay import COUNTER, to_anthropic, trajectories
from tests.pipelines.stages.cache_replay import replay as replay_traces

MARK = {"type": "ephemeral"}
HOUR = {"type": "ephemeral", "ttl": "1h"}
POLICY = "You are the airline's agent. Follow the booking policy to the letter. " * 100
CLAUDE, QWEN = "claude-sonnet-4-5", "qwen-max"


def call(n: int) -> dict[str, Any]:
    return {"id": f"c{n}", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}


def tool(name: str, words: int = 20) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": name, "description": "Looks it up. " * words, "parameters": {}},
    }


def history(turns: int = 3, system: str | None = POLICY, output: int = 1) -> list[dict[str, Any]]:
    """A system prompt (about 1,300 tokens) and ``turns`` exchanges, each with a tool call
    whose output repeats its line ``output`` times (about 6 tokens a line)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for n in range(turns):
        messages.append({"role": "user", "content": f"Question {n}: what about flight {n}?"})
        messages.append({"role": "assistant", "content": None, "tool_calls": [call(n)]})
        content = f"flight {n}: on time\n" * output
        messages.append({"role": "tool", "tool_call_id": f"c{n}", "content": content})
        messages.append({"role": "assistant", "content": f"Flight {n} is on time."})
    messages.append({"role": "user", "content": "And the next one?"})
    return messages


async def run(
    messages: list[dict[str, Any]],
    model: str = CLAUDE,
    *,
    state: ConversationState | None = None,
    stages: list[Any] | None = None,
    now: float = 1_000.0,
    **fields: Any,
) -> Any:
    request = {"model": model, "messages": messages, **fields}
    pipeline = Pipeline(stages=stages or [CacheMarkers()])
    return await pipeline.compact(request, state=state, now=now)


def details(result: Any) -> dict[str, Any]:
    """What the stage reported for the request of ``result``."""
    return stage_details(result.report)


def stage_details(report: Any) -> dict[str, Any]:
    stage = report.stage("cache_markers")
    assert stage is not None
    assert stage.error is None
    return stage.details  # type: ignore[no-any-return]


def marked(messages: list[dict[str, Any]]) -> list[int]:
    return [i for i, m in enumerate(messages) if "cache_control" in orjson.dumps(m).decode()]


async def test_anthropic_marks_the_newest_message_and_the_system_prompt() -> None:
    """Claude: the last message and the system prompt get a message-level marker and are
    otherwise unchanged; the report says where and why."""
    messages = history()
    result = await run(messages)
    out = result.request["messages"]
    assert marked(out) == [0, len(out) - 1]
    for index in (0, len(out) - 1):
        assert out[index] == {**messages[index], "cache_control": MARK}
    assert details(result)["markers"] == [
        {"at": len(out) - 1, "why": "rolling"},
        {"at": 0, "why": "prefix"},
    ]
    assert result.report.tokens_after == result.report.tokens_before


async def test_a_system_turn_of_the_history_is_history_not_the_system_prompt() -> None:
    """Claude with a mid-conversation system message last (Claude Code's first request):
    it is the newest message, so it carries the rolling marker, and the system prompt the
    prefix one; a later request that appends turns after it breaks no cache, while one
    whose system prompt changed does."""
    turn = {"role": "system", "system_turn": True, "content": "Environment: Linux."}
    messages = [*history(), turn]
    result = await run(messages)
    assert details(result)["markers"] == [
        {"at": len(messages) - 1, "why": "rolling"},
        {"at": 0, "why": "prefix"},
    ]
    state = result.state.answered(at=1_000.0)
    longer = [*messages, {"role": "assistant", "content": "Done."}, *history()[-1:]]
    assert (await run(longer, state=state, now=1_005.0)).report.cache_break is None
    other = [{**longer[0], "content": "Another prompt. " * 300}, *longer[1:]]
    assert (await run(other, state=state, now=1_005.0)).report.cache_break == "system"


async def test_without_a_system_prompt_the_last_tool_carries_the_prefix_marker() -> None:
    """No system message: the tools are the stable prefix, marked on the last tool."""
    tools = [tool("first"), tool("second", words=400)]
    result = await run(history(system=None), tools=tools)
    assert result.request["tools"][0] == tools[0]
    assert result.request["tools"][1] == {**tools[1], "cache_control": MARK}
    assert {"at": "tools", "why": "prefix"} in details(result)["markers"]


async def test_short_prompts_get_no_markers() -> None:
    """Under 1,024 tokens nothing would be cached: no marker is placed."""
    result = await run(history(system="Be brief."))
    assert not result.changed
    assert {s["why"] for s in details(result)["skipped"]} == {"rolling", "prefix"}


async def test_client_markers_count_towards_the_four_and_stay_where_they_are() -> None:
    """With three client markers (a tool, a content part, a tool call) only the rolling
    marker is added; with four, none; the client's markers are untouched; a message the
    client marked is not marked again."""
    messages = history()
    messages[1] = {
        "role": "user",
        "content": [{"type": "text", "text": "Hi", "cache_control": MARK}],
    }
    messages[2] = {**messages[2], "tool_calls": [{**call(0), "cache_control": MARK}]}
    tools = [{**tool("a"), "cache_control": MARK}, tool("b")]
    result = await run(messages, tools=tools)
    out = result.request["messages"]
    assert details(result)["client_markers"] == 3
    assert details(result)["markers"] == [{"at": len(out) - 1, "why": "rolling"}]
    assert out[:-1] == messages[:-1]
    assert result.request["tools"] == tools
    messages[-1] = {**messages[-1], "cache_control": MARK}
    full = await run(messages, tools=tools)
    assert not full.changed
    assert details(full)["client_markers"] == 4
    messages[-1] = {k: v for k, v in messages[-1].items() if k != "cache_control"}
    messages[3] = {**messages[3], "cache_control": MARK}
    newest_marked = await run(messages[:4])
    assert {"why": "rolling", "at": 3, "skipped": "the client marked it"} in details(newest_marked)[
        "skipped"
    ]
    assert newest_marked.request["messages"][3] == messages[3]


async def test_no_marker_goes_before_a_clients_one_hour_marker() -> None:
    """The API wants 1-hour entries before 5-minute ones: with a client's 1-hour marker
    on a message, the system prompt is not marked, the newer message is."""
    messages = history()
    messages[5] = {**messages[5], "cache_control": HOUR}
    result = await run(messages)
    out = result.request["messages"]
    assert marked(out) == [5, len(out) - 1]
    assert out[5]["cache_control"] == HOUR
    assert {
        "why": "prefix",
        "at": 0,
        "skipped": "before a client's 1-hour breakpoint",
    } in details(result)["skipped"]


async def test_automatic_caching_counts_towards_the_four() -> None:
    """Claude, a top-level ``cache_control`` (automatic caching) and three client markers:
    the automatic one is the fourth breakpoint, so the stage adds none."""
    messages = history()
    for index in (0, 1, 5):
        messages[index] = {**messages[index], "cache_control": MARK}
    result = await run(messages, cache_control=MARK)
    assert not result.changed
    assert result.request["messages"] == messages
    assert details(result)["client_markers"] == 4
    assert {"why": "rolling", "at": len(messages) - 1, "skipped": "the client marked it"} in (
        details(result)["skipped"]
    )


async def test_no_marker_goes_before_or_on_a_one_hour_automatic_marker() -> None:
    """Claude, automatic caching for an hour: it sits on the newest message, so the stage
    adds no 5-minute breakpoint, neither on the system prompt nor on that message."""
    messages = history()
    result = await run(messages, cache_control=HOUR)
    assert not result.changed
    assert marked(result.request["messages"]) == []
    assert result.request["cache_control"] == HOUR
    assert details(result)["skipped"] == [
        {"why": "rolling", "at": len(messages) - 1, "skipped": "the client marked it"},
        {"why": "prefix", "at": 0, "skipped": "before a client's 1-hour breakpoint"},
    ]


async def test_a_five_minute_automatic_marker_takes_the_rolling_breakpoints_place() -> None:
    """Claude, automatic caching for 5 minutes: the newest message is not marked again,
    the system prompt still is (however short the conversation after it); Qwen, which has
    no automatic caching, gets its rolling marker as ever."""
    messages = history()
    result = await run(messages, cache_control=MARK)
    out = result.request["messages"]
    assert marked(out) == [0]
    assert out[0] == {**messages[0], "cache_control": MARK}
    assert details(result)["markers"] == [{"at": 0, "why": "prefix"}]
    qwen = await run(messages, QWEN, cache_control=MARK)
    assert marked(qwen.request["messages"]) == [0, len(messages) - 1]


async def test_qwen_markers_go_on_the_last_content_part() -> None:
    """Qwen/DashScope: the marker is on the message's last content part, a string content
    becoming one text part; a list keeps its other parts."""
    messages = history()
    messages[-1] = {
        "role": "user",
        "content": [{"type": "text", "text": "Look:"}, {"type": "text", "text": "this"}],
    }
    result = await run(messages, model=QWEN)
    out = result.request["messages"]
    assert out[0]["content"] == [{"type": "text", "text": POLICY, "cache_control": MARK}]
    assert out[-1]["content"] == [
        {"type": "text", "text": "Look:"},
        {"type": "text", "text": "this", "cache_control": MARK},
    ]
    assert "cache_control" not in out[0]
    assert "cache_control" not in out[-1]
    assert result.report.tokens_after == result.report.tokens_before


def previous_end(messages: list[dict[str, Any]], end: int) -> ConversationState:
    """The record a pipeline leaves after sending ``messages[:end]``."""
    from pipelines.cache_break import fingerprint

    return ConversationState(
        last_seen=990.0, calls=1, sent_messages=end, sent_last=fingerprint(messages[end - 1])
    )


async def test_a_long_tool_loop_marks_the_previous_requests_end() -> None:
    """When a request added more than 15 blocks since the previous one, the previous
    request's last message is marked again (its entry is out of the rolling marker's
    reach); with fewer, it is not."""
    messages = history(turns=2, output=200)
    end = len(messages)
    for n in range(10, 19):  # 9 calls and 9 results: 18 blocks
        messages.append({"role": "assistant", "content": None, "tool_calls": [call(n)]})
        messages.append({"role": "tool", "tool_call_id": f"c{n}", "content": "ok"})
    result = await run(messages, state=previous_end(messages, end))
    assert {"at": end - 1, "why": "protective"} in details(result)["markers"]
    assert marked(result.request["messages"]) == [0, end - 1, len(messages) - 1]
    near = await run(messages, state=previous_end(messages, len(messages) - 6))
    assert [m["why"] for m in details(near)["markers"]] == ["rolling", "prefix"]


async def test_without_a_record_a_long_history_gets_a_sliding_marker() -> None:
    """A long history with no record of the previous request: a marker about 15 blocks
    before the end widens the reach of the lookup."""
    messages = history(turns=8, output=200)
    result = await run(messages)
    protective = [m for m in details(result)["markers"] if m["why"] == "protective"]
    assert len(protective) == 1
    at = protective[0]["at"]
    assert len(messages) - 1 - at == 15  # one block per message here


@dataclass(frozen=True)
class Boundary:
    """Stands for compress/summarize: names message ``index`` the compaction boundary."""

    index: int
    name: str = "compress"

    async def __call__(self, conversation: Conversation, ctx: StageContext) -> Conversation:
        ctx.boundary = conversation.messages[self.index]
        return conversation


async def test_the_compaction_boundary_is_marked() -> None:
    """The last compacted message (found by identity) gets a marker when the prompt
    since the system prompt's marker holds 1,024 tokens."""
    messages = history(turns=3)
    messages[4] = {"role": "user", "content": "[Context note: earlier messages removed] " * 200}
    result = await run(messages, stages=[Boundary(4), CacheMarkers()])
    assert {"at": 4, "why": "compaction"} in details(result)["markers"]
    messages[4] = {"role": "user", "content": "[Context note: earlier messages removed]"}
    small = await run(messages, stages=[Boundary(4), CacheMarkers()])
    assert {"why": "compaction", "at": 4, "skipped": "segment under 1024 tokens"} in details(small)[
        "skipped"
    ]


async def test_openai_gets_a_stable_prompt_cache_key_per_conversation() -> None:
    """gpt-4o: a prompt_cache_key from the namespace and the conversation's identity, the
    same on every request of the conversation; another conversation or tenant gets
    another; the client's own key is kept; a prompt too short to be cached gets none."""
    messages = history()
    first = await run(messages, model="gpt-4o")
    later = await run([*messages, {"role": "assistant", "content": "Yes."}], model="gpt-4o")
    key = first.request["prompt_cache_key"]
    assert key == later.request["prompt_cache_key"] == cache_key("", first_id(messages))
    other = await run(
        [messages[0], {"role": "user", "content": "Other"}, *messages[2:]], model="gpt-4o"
    )
    assert other.request["prompt_cache_key"] != key
    named = await Pipeline(stages=[CacheMarkers()]).compact(
        {"model": "gpt-4o", "messages": messages}, namespace="t2", conversation="conv-1"
    )
    assert named.request["prompt_cache_key"] == cache_key("t2", "conv-1") != key
    own = await run(messages, model="gpt-4o", prompt_cache_key="mine")
    assert own.request["prompt_cache_key"] == "mine"
    assert not own.changed
    short = await run(history(system="Be brief."), model="gpt-4o")
    assert "prompt_cache_key" not in short.request
    assert "cache_control" not in orjson.dumps(first.request).decode()


def first_id(messages: list[dict[str, Any]]) -> str:
    from pipelines import conversation_id

    return conversation_id("", messages)


async def test_a_policy_without_cache_markers_adds_none_but_still_sees_breaks() -> None:
    """``cache-markers=?0``: no breakpoint for Claude and no prompt_cache_key for gpt-4o
    (a client that places its own), while a changed system prompt is still a break."""
    off = Policy(cache_markers=False)
    pipeline = Pipeline(stages=[CacheMarkers()])
    for model in (CLAUDE, "gpt-4o"):
        result = await pipeline.compact({"model": model, "messages": history()}, policy=off)
        assert not result.changed
    first = await pipeline.compact({"model": CLAUDE, "messages": history()}, policy=off)
    state = first.state.answered(at=1_000.0)
    edited = history()
    edited[0] = {"role": "system", "content": POLICY + " Be brief."}
    second = await pipeline.compact(
        {"model": CLAUDE, "messages": edited}, policy=off, state=state, now=1_005.0
    )
    assert second.report.cache_break == "system"
    assert not second.changed


async def test_families_without_cache_hints_are_left_alone() -> None:
    """DeepSeek and unknown models cache on their own: the request is not changed."""
    for model in ("deepseek-chat", "some-local-model"):
        assert not (await run(history(), model=model)).changed


async def breaks_of(
    requests: list[dict[str, Any]], gaps: list[float] | None = None
) -> list[str | None]:
    """The cache_break each request of a conversation records, sent in turn."""
    pipeline = Pipeline(stages=[CacheMarkers()])
    state, now, causes = None, 1_000.0, []
    for index, request in enumerate(requests):
        now += gaps[index] if gaps else 5.0
        result = await pipeline.compact(request, state=state, now=now)
        causes.append(result.report.cache_break)
        state = ConversationState.from_json(result.state.answered(at=now).to_json())
    return causes


def grow(request: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """The next request of the conversation: one exchange more, with ``changes``."""
    messages = [*request["messages"], {"role": "assistant", "content": "Done."}]
    messages.append({"role": "user", "content": "Thanks, one more thing."})
    return {**request, "messages": messages, **changes}


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


# What the stage is worth: tau-bench trajectories replayed through the pipeline to a model
# of Anthropic's prompt cache (bench.prompt_cache).

REPLAYED = 60


@pytest.mark.parametrize("max_input", [None, 8_000])
async def test_replayed_traces_read_most_of_their_prompt_from_the_cache(
    max_input: int | None,
) -> None:
    """Claude, tau-bench conversations: with the stage about nine tenths of the input is
    read from the cache, against none without markers and under half with one marker on
    the system prompt; the bill falls accordingly. Also when compaction (max-input 8,000)
    rewrites the history now and then."""
    traces = trajectories(REPLAYED)
    policy = Policy(max_input=max_input)
    bills = {
        name: await replay_traces(traces, policy, markers=name)
        for name in ("stage", "none", "system")
    }
    stage, none, system = bills["stage"], bills["none"], bills["system"]
    assert none.read == 0
    assert stage.read_share > 0.85
    assert stage.read_share > system.read_share + 0.3
    assert stage.per_session < 0.4 * system.per_session < none.per_session
    assert stage.markers <= 4


async def test_with_client_markers_no_request_carries_more_than_four() -> None:
    """A client that sets three markers of its own (a 1-hour one on the system prompt):
    the stage adds only the rolling one, so no converted request has more than 4 and the
    1-hour marker stays first (the cache model refuses anything else), and the cache
    still serves most of the input."""
    traces = trajectories(REPLAYED)
    for max_input in (None, 8_000):
        bill = await replay_traces(traces, Policy(max_input=max_input), markers="client")
        assert bill.markers == 4
        assert bill.read_share > 0.85


@pytest.mark.parametrize("markers", ["stage", "client"])
async def test_replayed_breakpoints_stay_on_their_messages_between_events(markers: str) -> None:
    """Turn after turn, a breakpoint other than the rolling one only sits on a message
    that carried one in an earlier request since the last compaction event, and the
    prefix breakpoint never moves."""
    bill = await replay_traces(trajectories(REPLAYED), Policy(max_input=8_000), markers=markers)
    events = 0
    for reports in bill.reports:
        carried: dict[Any, str] = {}
        for previous, report in zip([None, *reports], reports, strict=False):
            placed = breakpoints(report)
            if previous is None or report.is_event_after(previous):
                events += previous is not None
                carried = placed
                continue
            for at, why in placed.items():
                assert why == "rolling" or at in carried, (at, why, carried)
            prefix = [at for at, why in carried.items() if why == "prefix"]
            assert [at for at, why in placed.items() if why == "prefix"] in ([], prefix[-1:])
            carried = {**carried, **placed}
    assert (
        events >= 5
    )  # several compaction events were crossed (compress keeps its cut between them)


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


def breakpoints(report: Any) -> dict[Any, str]:
    return {m["at"]: m["why"] for m in stage_details(report).get("markers", ())}


async def test_a_long_parallel_tool_round_still_reads_the_previous_turn() -> None:
    """An agent turn that adds 24 blocks (12 parallel calls and their results) is past the
    rolling marker's 20-block lookback: with the protective marker the request still
    reads the whole previous prompt; without it only the system prompt."""
    first = history(turns=3, output=200)
    calls = [call(100 + n) for n in range(12)]
    second = [
        *first,
        {"role": "assistant", "content": None, "tool_calls": calls},
        *({"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in calls),
    ]
    reads = []
    for stage in (CacheMarkers(), CacheMarkers(protect_after=1_000)):
        pipeline = Pipeline(stages=[stage])
        cache = PrefixCache(COUNTER)
        sent = await pipeline.compact({"model": CLAUDE, "messages": first}, now=1_000.0)
        previous = to_anthropic(sent.request)
        cache.usage(previous, now=1_000.0)
        state = sent.state.answered(at=1_000.0)
        later = await pipeline.compact(
            {"model": CLAUDE, "messages": second}, state=state, now=1_010.0
        )
        reads.append(
            cache.usage(to_anthropic(later.request), now=1_010.0)["cache_read_input_tokens"]
        )
    whole = sum(
        p.tokens
        for p in PrefixCache(COUNTER).positions(to_anthropic({"model": CLAUDE, "messages": first}))
    )
    system = sum(
        p.tokens
        for p in PrefixCache(COUNTER).positions(
            to_anthropic({"model": CLAUDE, "messages": first[:1]})
        )
    )
    assert reads == [whole, system]


async def test_client_markers_nested_in_parts_count_towards_the_four() -> None:
    """Markers a client sets inside a part (a search result's text, a document's content
    blocks, as the Messages API takes them) are breakpoints too: three of them leave room
    for the rolling marker only, and the converted request carries no more than four."""
    from gateway.codecs.chat_anthropic import to_messages

    def nested(name: str) -> dict[str, Any]:
        text = {"type": "text", "text": "Refunds within 24 h. " * 200, "cache_control": MARK}
        return {"type": "search_result", "source": name, "title": name, "content": [text]}

    document = {
        "type": "document",
        "source": {"type": "content", "content": [{**nested("c")["content"][0]}]},
    }
    messages = history()
    messages[1] = {"role": "user", "content": [nested("a"), nested("b"), document]}
    result = await run(messages)
    assert details(result)["client_markers"] == 3
    assert [m["why"] for m in details(result)["markers"]] == ["rolling"]
    assert orjson.dumps(to_messages(result.request)).count(b'"cache_control"') == 4


async def test_a_message_with_no_block_that_takes_a_marker_is_not_marked() -> None:
    """Thinking blocks and empty text take no breakpoint (the codec skips them): a newest
    answer of thinking alone, or a message of an empty text part, leaves the rolling
    marker to the message before it, and every marker placed reaches the request."""
    from gateway.codecs.chat_anthropic import to_messages

    thinking = {"type": "thinking", "thinking": "Hm.", "signature": "c2ln"}
    for newest in (
        {"role": "assistant", "content": None, "thinking_blocks": [thinking]},
        {"role": "assistant", "content": [thinking]},
        {"role": "user", "content": [{"type": "text", "text": ""}]},
    ):
        messages = [*history(), newest]
        result = await run(messages)
        placed = details(result)["markers"]
        assert {"at": len(messages) - 2, "why": "rolling"} in placed
        sent = orjson.dumps(to_messages(result.request))
        assert sent.count(b'"cache_control"') == len(placed)


async def test_qwen_markers_never_land_on_an_empty_text_part() -> None:
    """Qwen: a newest message whose last part is an empty text is not marked; the
    rolling marker goes on the message before it."""
    messages = [*history(), {"role": "user", "content": [{"type": "text", "text": ""}]}]
    result = await run(messages, model=QWEN)
    assert {"at": len(messages) - 2, "why": "rolling"} in details(result)["markers"]
    assert result.request["messages"][-1] == messages[-1]


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


async def test_a_client_marking_its_newest_message_for_an_hour_keeps_the_cache_an_hour() -> None:
    """Claude, a client whose newest message carries a 1-hour breakpoint (the stage adds
    none after it): ten minutes later the cache is still hot and no break is named; after
    an hour it is the TTL. With a 5-minute one, ten minutes are past the TTL."""

    def asked(text: str, marker: dict[str, str] | None) -> dict[str, Any]:
        part: dict[str, Any] = {"type": "text", "text": text}
        return {"role": "user", "content": [{**part, "cache_control": marker} if marker else part]}

    for marker, gaps, expected in (
        (HOUR, [5.0, 600.0, 3_700.0], [None, None, "ttl"]),
        (MARK, [5.0, 600.0, 200.0], [None, "ttl", None]),
    ):
        messages = [*history()[:-1], asked("And the next one?", marker)]
        requests = [{"model": CLAUDE, "messages": messages}]
        for n in range(2):
            messages = [*messages[:-1], asked(messages[-1]["content"][0]["text"], None)]
            messages += [{"role": "assistant", "content": "Done."}, asked(f"More {n}?", marker)]
            requests.append({"model": CLAUDE, "messages": messages})
        assert await breaks_of(requests, gaps) == expected
