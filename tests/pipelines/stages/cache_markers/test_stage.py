"""cache_markers: Anthropic/Qwen breakpoints (at most 4 with the client's) and the OpenAI
prompt_cache_key."""

from __future__ import annotations

from dataclasses import dataclass
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
from pipelines.stages.cache_markers import CacheMarkers, cache_key
from tests.pipelines.stages.cache_markers.samples import (
    CLAUDE,
    HOUR,
    MARK,
    POLICY,
    QWEN,
    REPLAYED,
    breaks_of,
    call,
    details,
    history,
    marked,
    run,
    stage_details,
    tool,
)
from tests.pipelines.stages.cache_replay import COUNTER, to_anthropic, trajectories
from tests.pipelines.stages.cache_replay import replay as replay_traces


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
