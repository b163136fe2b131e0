"""compress: deterministic compaction that fits, keeps tool pairs valid, loses nothing and
keeps the outgoing prefix stable between compaction events. Replayed on real traces."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, NamedTuple

import orjson
import pytest

from bench.compaction import Session, requests_of
from gateway.store import MemoryStore
from pipelines import Pipeline, Policy, Report, RequestRejected, TokenCounter
from pipelines.cache_break import without_markers
from pipelines.stages.compress import MAX_MIN_SAVING, MIN_SAVING_FLOOR, Compress
from tests.openai_schema import assert_valid_request
from tests.pipelines.stages.conftest import BoundaryProbe, FailingStore, boundary_at, probed
from tests.pipelines.stages.test_normalize import assert_valid

TRACES = Path(__file__).resolve().parents[3] / "bench" / "data" / "tau-bench-gpt-4o-airline.json"
REF = re.compile(r"ctx_[A-Za-z0-9_-]{22,}")


async def original_of(store: MemoryStore, message: dict[str, Any]) -> dict[str, Any]:
    """``message`` with a tool output an earlier stage archived or trimmed restored."""
    content = message.get("content")
    if message.get("role") == "tool" and isinstance(content, str) and content.startswith("["):
        found = REF.search(content.split("]", 1)[0])
        if found:
            stored = await store.get("", found.group())
            assert stored is not None
            return {**message, "content": stored.decode()}
    return message


@pytest.mark.parametrize("model", ["gpt-4o", "claude-sonnet-4-5"])
@pytest.mark.parametrize("max_input", [4_000, 8_000, 16_000])
async def test_replayed_traces_fit_stay_valid_and_stable(max_input: int, model: str) -> None:
    """Replaying tau-bench trajectories turn by turn under a small max-input: every request
    fits and is (its cache markers aside) a valid CreateChatCompletionRequest, tool pairs
    stay valid, the system prompt and latest user message are unchanged, tokens never grow,
    every ref restores, the same request gives the same bytes, and turn k+1's request
    starts with turn k's (cache markers aside: they are not cache content) unless the
    report records a compaction event (a stage moved a cut, compress changed level or cut,
    an emergency acted). The client is sometimes idle past the cache TTL, so the cache-TTL
    prune acts too."""
    store = MemoryStore()
    pipeline = Pipeline(store=store)
    policy = Policy(max_input=max_input)
    counter = TokenCounter()
    events = 0
    for trajectory in json.loads(TRACES.read_text()):
        previous: tuple[list[dict[str, Any]], Any] | None = None
        session = Session(pipeline, policy, model=model)
        for turn, history in enumerate(requests_of(trajectory["traj"])):
            request = {"model": model, "messages": history}
            state = session.state
            # now and then the user is away longer than the cache lives (gpt-4o: 600 s)
            result = await session.send(history, after=700.0 if turn % 7 == 6 else 5.0)
            out = without_markers(result.request["messages"])
            report = result.report
            assert report.tokens_after <= report.budget
            assert report.tokens_after == counter.count_messages(out)
            assert report.tokens_after <= report.tokens_before
            assert_valid(out)
            assert_valid_request(without_markers(result.request))
            assert out[0] == history[0]
            compress = report.stage("compress")
            if compress is None or "emergency_shortened" not in compress.details:
                assert out[1] == history[1]  # the first user message (the anchor)
            latest_user = max(i for i, m in enumerate(history) if m["role"] == "user")
            assert history[latest_user] in out
            for ref in REF.findall(orjson.dumps(out).decode()):
                assert await store.get("", ref) is not None
            again = await pipeline.compact(request, policy=policy, state=state, now=session.now)
            assert orjson.dumps(again.request) == orjson.dumps(result.request)
            if previous is not None:
                before_out, before_report = previous
                if report.is_event_after(before_report):
                    events += 1
                else:
                    assert out[: len(before_out)] == before_out
            previous = (out, report)
    assert events > 0


async def test_the_end_of_the_compacted_span_is_named_the_compaction_boundary() -> None:
    """When compress cuts, the last message of what it made of the span (a removal note
    here) is handed to the later stages as the compaction boundary: the received tail
    follows it untouched."""
    trajectory = max(json.loads(TRACES.read_text()), key=lambda t: len(t["traj"]))
    history = requests_of(trajectory["traj"])[-1]
    probe = BoundaryProbe()
    pipeline = Pipeline(stages=probed(probe), store=MemoryStore())
    result = await pipeline.compact(
        {"model": "gpt-4o", "messages": history}, policy=Policy(max_input=4_000, mode="truncate")
    )
    assert "compress" in result.report.actions
    index = boundary_at(probe, history)
    assert result.request["messages"][index]["content"].startswith("[Context note:")


async def test_removed_messages_restore_exactly() -> None:
    """The note left for removed messages names a ref whose content is exactly the removed
    messages, in order (tool outputs an earlier stage trimmed restore through their own
    refs)."""
    store = MemoryStore()
    trajectory = max(json.loads(TRACES.read_text()), key=lambda t: len(t["traj"]))
    history = requests_of(trajectory["traj"])[-1]
    result = await Pipeline(store=store).compact(
        {"model": "gpt-4o", "messages": history}, policy=Policy(max_input=4_000)
    )
    notes = [m for m in result.request["messages"] if "were removed" in str(m.get("content"))]
    assert notes
    for note in notes:
        removed = orjson.loads(await store.get("", REF.search(note["content"]).group()))  # type: ignore[arg-type, union-attr]
        removed = [await original_of(store, m) for m in removed]
        start = history.index(removed[0])
        assert history[start : start + len(removed)] == removed


async def test_below_the_light_threshold_nothing_changes() -> None:
    """A conversation well inside its budget passes compress untouched."""
    trajectory = json.loads(TRACES.read_text())[0]["traj"]
    result = await Pipeline(store=MemoryStore()).compact(
        {"model": "gpt-4o", "messages": trajectory}, policy=Policy(max_input=100_000)
    )
    assert "compress" not in result.report.actions


async def test_too_big_even_after_everything_is_refused() -> None:
    """When the system prompt and the latest user message alone exceed the budget, the
    request is refused with context_length_exceeded and the numbers."""
    messages = [
        {"role": "system", "content": "rules " * 5_000},
        {"role": "user", "content": "hello"},
    ]
    with pytest.raises(RequestRejected) as caught:
        await Pipeline(store=MemoryStore()).compact(
            {"model": "gpt-4o", "messages": messages}, policy=Policy(max_input=4_000)
        )
    assert caught.value.code == "context_length_exceeded"
    assert "4,000" in str(caught.value)


async def test_without_a_store_only_the_budget_forces_shortening() -> None:
    """With no store (or one that fails) nothing is removed while the request fits. When
    it cannot be sent otherwise, the largest texts are shortened and each says that no
    copy is kept; no ref is ever named, since nothing stands behind one."""
    trajectory = max(json.loads(TRACES.read_text()), key=lambda t: len(t["traj"]))["traj"]
    history = requests_of(trajectory)[-1]
    request = {"model": "gpt-4o", "messages": history}
    for pipeline in (
        Pipeline(stages=[Compress()]),
        Pipeline(stages=[Compress()], store=FailingStore()),
    ):
        roomy = await pipeline.compact(request, policy=Policy(max_input=9_000))
        assert roomy.report.tokens_before > 0.7 * 9_000
        assert not roomy.changed
        tight = await pipeline.compact(request, policy=Policy(max_input=4_000))
        assert tight.report.tokens_after <= 4_000
        sent = orjson.dumps(tight.request).decode()
        assert REF.search(sent) is None
        shortened = [
            m for m in tight.request["messages"] if "no copy is kept" in str(m.get("content"))
        ]
        assert len(shortened) == tight.report.stages[0].details["lossy_shortened"]
        assert tight.request["messages"][0] == history[0]
        assert tight.request["messages"][-1] == history[-1]


async def test_huge_tool_call_arguments_are_cut_and_stay_valid_json() -> None:
    """In an emergency, a tool call carrying a whole file in its arguments keeps its
    shape: the arguments parse, short fields are untouched, the long one keeps its head
    and tail and names the ref of the original calls, which restores them exactly."""
    text = "".join(f"line {i}: print('value {i}')\n" for i in range(3_000))
    call = {
        "id": "call_w",
        "type": "function",
        "function": {
            "name": "write_file",
            "arguments": orjson.dumps({"path": "src/app.py", "content": text}).decode(),
        },
    }
    history = [
        {"role": "system", "content": "You edit files."},
        {"role": "user", "content": "Write the app."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_w", "content": "written"},
    ]
    store = MemoryStore()
    result = await Pipeline(store=store).compact(
        {"model": "gpt-4o", "messages": history}, policy=Policy(max_input=4_000)
    )
    assert result.report.tokens_after <= 4_000
    sent = result.request["messages"][2]["tool_calls"][0]
    assert sent["id"] == "call_w"
    arguments = orjson.loads(sent["function"]["arguments"])
    assert arguments["path"] == "src/app.py"
    assert arguments["content"].startswith(text[:200])
    assert arguments["content"].endswith(text[-50:])
    ref = REF.search(arguments["content"]).group()  # type: ignore[union-attr]
    assert orjson.loads(await store.get("", ref)) == [call]  # type: ignore[arg-type]
    assert_valid(result.request["messages"])
    assert_valid_request(result.request)


async def test_a_cut_saving_less_than_the_room_left_waits() -> None:
    """Just over the trigger with room left under the budget, a cut that would save less
    than that room is not worth breaking the cached prefix: the request goes as it is.
    Closer to the budget, the same cut is taken."""
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You look things up."},
        {"role": "user", "content": "Find order 1."},
        {"role": "assistant", "content": "Looking."},
    ]
    for n in range(40):
        call = {
            "id": f"c{n}",
            "type": "function",
            "function": {"name": "lookup", "arguments": "{}"},
        }
        history.append({"role": "assistant", "content": None, "tool_calls": [call]})
        history.append({"role": "tool", "tool_call_id": f"c{n}", "content": f"row {n} " * 60})
    history.append({"role": "user", "content": "And order 2?"})
    pipeline = Pipeline(stages=[Compress()], store=MemoryStore())
    request = {"model": "gpt-4o", "messages": history}
    tokens = (await pipeline.compact(request, policy=Policy(mode="off"))).report.tokens_before

    def details(result: Any) -> dict[str, Any]:
        return next(s.details for s in result.report.stages if s.name == "compress")

    roomy = await pipeline.compact(request, policy=Policy(max_input=int(tokens / 0.72)))
    assert details(roomy)["level"] == "full"
    assert details(roomy)["skipped_saving"] < details(roomy)["minimum_saving"]
    assert "compress" not in roomy.report.actions
    tight = await pipeline.compact(request, policy=Policy(max_input=int(tokens / 0.88)))
    assert "cut" in details(tight)
    assert tight.report.tokens_after < tokens


class Turn(NamedTuple):
    """Two consecutive requests of a session whose first was cut, neither shortened in
    an emergency."""

    before: Report
    after: Report
    sent_before: list[dict[str, Any]]
    sent_after: list[dict[str, Any]]
    kept: int
    """Tokens the second request would have with the first one's cut: at most what the
    first sent plus the history's growth (later stages only ever shrink new messages)."""


async def turns_after_cuts(max_input: int, trajectories: int) -> list[Turn]:
    """Tau-bench trajectories chained into one long agent session and replayed turn by
    turn through the default pipeline, the record carried; refs come from a fixed
    secret, so the token counts are the same on every run."""
    traces = json.loads(TRACES.read_text())[:trajectories]
    chained = [traces[0]["traj"][0]] + [m for t in traces for m in t["traj"][1:]]
    session = Session(Pipeline(store=MemoryStore(secret=b"turns")), Policy(max_input=max_input))
    turns: list[Turn] = []
    previous: tuple[Report, list[dict[str, Any]]] | None = None
    for history in requests_of(chained):
        result = await session.send(history)
        report, sent = result.report, result.request["messages"]
        assert report.tokens_after <= report.budget
        if previous is not None and previous[0].compaction()[1] is not None:
            before, sent_before = previous
            if not before.compaction()[-1] and not report.compaction()[-1]:
                kept = before.tokens_after + report.tokens_before - before.tokens_before
                turns.append(Turn(before, report, sent_before, sent, kept))
        previous = report, sent
    return turns


@pytest.mark.parametrize(("max_input", "trajectories"), [(8_000, 8), (16_000, 12)])
async def test_a_cut_stays_put_while_the_request_fits_under_the_trigger(
    max_input: int, trajectories: int
) -> None:
    """Once a request of a long agent session is cut, the next ones keep that cut, and so
    the provider's cached prefix, for as long as the grown history fits under ``trigger``
    with it, even when the cut sits off compress's grid and a grid point appears just
    after it: no compaction event, the outgoing prefix unchanged."""
    turns = await turns_after_cuts(max_input, trajectories)
    fitting = [t for t in turns if t.kept <= Policy().trigger * t.after.budget]
    assert len(fitting) > 10
    assert any(t.after.is_event_after(t.before) for t in turns)
    for turn in fitting:
        assert not turn.after.is_event_after(turn.before)
        assert turn.sent_after[: len(turn.sent_before)] == turn.sent_before


@pytest.mark.parametrize(("max_input", "trajectories"), [(8_000, 8), (16_000, 12)])
async def test_a_cut_moves_only_for_a_saving_worth_the_cache_break(
    max_input: int, trajectories: int
) -> None:
    """When the grown history no longer fits under ``trigger`` with the previous cut but
    still fits the budget, the cut moves only if the move saves at least the room left
    under the budget (clamped to 500-3,000 tokens) compared with keeping it: a move
    saving a few hundred tokens is not worth a cache break every other request."""
    turns = await turns_after_cuts(max_input, trajectories)
    moves = 0
    for turn in turns:
        budget = turn.after.budget
        if turn.after.is_event_after(turn.before) and turn.kept <= budget:
            moves += 1
            minimum = min(MAX_MIN_SAVING, max(MIN_SAVING_FLOOR, budget - turn.kept))
            assert turn.kept - turn.after.tokens_after >= minimum
    assert moves > 2


async def test_a_long_chat_of_short_turns_fits() -> None:
    """Hundreds of short exchanges: once the user messages alone outgrow the span's
    share, the oldest go into notes too (restorable), so the request fits, quickly."""
    history: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for n in range(1_000):
        history += [
            {"role": "user", "content": f"What is {n} squared?"},
            {"role": "assistant", "content": f"{n * n}."},
        ]
    history.append({"role": "user", "content": "And 1000 squared?"})
    store = MemoryStore()
    result = await Pipeline(store=store).compact(
        {"model": "gpt-4o", "messages": history}, policy=Policy(max_input=4_000)
    )
    out = result.request["messages"]
    assert result.report.tokens_after <= 4_000
    assert out[0] == history[0]
    assert out[-1] == history[-1]
    assert result.report.ms < 5_000
    kept_or_stored = set()
    for message in out:
        found = REF.search(str(message.get("content")))
        if message.get("role") == "user" and found and "were removed" in message["content"]:
            stored = await store.get("", found.group())
            assert stored is not None
            kept_or_stored.update(m["content"] for m in orjson.loads(stored) if m["role"] == "user")
        elif message.get("role") == "user":
            kept_or_stored.add(message["content"])
    assert kept_or_stored == {m["content"] for m in history if m["role"] == "user"}


async def test_arguments_made_of_many_short_values_are_cut_by_structure() -> None:
    """A call whose arguments are a long array of short strings has no long string to
    cut: the array is cut by structure instead, still valid JSON, and the message says
    where the original is."""
    lines = [f"row {i}" for i in range(4_000)]
    call = {
        "id": "call_b",
        "type": "function",
        "function": {"name": "bulk_insert", "arguments": orjson.dumps({"lines": lines}).decode()},
    }
    history = [
        {"role": "user", "content": "Insert the rows."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_b", "content": "inserted"},
    ]
    store = MemoryStore()
    result = await Pipeline(store=store).compact(
        {"model": "gpt-4o", "messages": history}, policy=Policy(max_input=4_000)
    )
    assert result.report.tokens_after <= 4_000
    message = result.request["messages"][1]
    arguments = orjson.loads(message["tool_calls"][0]["function"]["arguments"])
    assert arguments["lines"][:3] == lines[:3]
    assert arguments["lines"][-3:] == lines[-3:]
    ref = REF.search(message["content"]).group()  # type: ignore[union-attr]
    assert orjson.loads(await store.get("", ref)) == [call]  # type: ignore[arg-type]


@pytest.mark.parametrize("max_input", [4_000, 8_000])
async def test_reusing_the_last_cut_gives_the_same_bytes_as_computing_it(max_input: int) -> None:
    """A pipeline that re-applies each conversation's last cut sends exactly what a fresh
    pipeline (no memory of earlier requests) computes, turn by turn, on every trace."""
    from pipelines.stages import DEFAULT_STAGES, PassThrough

    store = MemoryStore()
    policy = Policy(max_input=max_input)
    remembering = Pipeline(store=store)
    reused = 0
    for trajectory in json.loads(TRACES.read_text()):
        session = Session(remembering, policy)
        for history in requests_of(trajectory["traj"]):
            state = session.state
            result = await session.send(history)
            fresh = Pipeline(
                stages=[s if isinstance(s, PassThrough) else type(s)() for s in DEFAULT_STAGES],
                store=store,
            )
            fresh._counters = remembering._counters
            computed = await fresh.compact(
                {"model": "gpt-4o", "messages": history},
                policy=policy,
                state=state,
                now=session.now,
            )
            assert orjson.dumps(result.request) == orjson.dumps(computed.request)
            compress = result.report.stage("compress")
            reused += bool(compress and compress.details.get("reused"))
    # With compact JSON the traces leave 77 cut requests at 8,000 tokens (686 at 4,000).
    assert reused > 50


async def test_the_cuts_kept_for_reuse_stay_within_their_bound() -> None:
    """Each conversation's last cut is kept to be re-applied, with the tool outputs before
    it (whole histories' worth on long conversations): together they stay within
    ``memo_chars``, the least recently used conversations dropped first, and the latest
    conversation still has its cut re-applied."""
    from pipelines.stages import DEFAULT_STAGES

    compress = Compress(memo_chars=40_000)
    stages = [compress if isinstance(s, Compress) else s for s in DEFAULT_STAGES]
    pipeline = Pipeline(stages=stages, store=MemoryStore())
    messages = json.loads(TRACES.read_text())[0]["traj"]
    for number in range(8):
        # Eight conversations: the same trace under eight system prompts.
        system = {**messages[0], "content": f"Agent {number}. {messages[0]['content']}"}
        session = Session(pipeline, Policy(max_input=4_000))
        # Request 9 makes a clean cut, the next ones re-apply it.
        for history in requests_of([system, *messages[1:]])[:12]:
            result = await session.send(history)
        assert compress._memos.held <= 40_000
    details = result.report.stage("compress").details  # type: ignore[union-attr]
    assert details.get("reused")
    assert 2 <= len(compress._memos) < 8
