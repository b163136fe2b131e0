"""The tau-bench replays in the OpenAI Responses format (``bench.responses_sessions``,
``bench.compaction.replay_responses``): the chat replays' invariants hold of what the
gateway sends up through its Responses codec, and each check fails when the codec or the
store breaks what it checks."""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest

import gateway.codecs.responses.request as responses_request
from bench.compaction import (
    DATA,
    Formats,
    Replayed,
    Session,
    chained_sessions,
    formats_table,
    replay,
    replay_responses,
    single_sessions,
)
from bench.quality import units_of
from bench.responses_sessions import (
    REF,
    Style,
    chat_form,
    convert,
    prefix_kept,
    problems,
    reasoning_problems,
    send,
    unpaired,
    unrestorable,
)
from gateway.codecs.responses import chat_messages, response_items, stored_items
from gateway.codecs.responses.items import ITEMS
from gateway.store import MemoryStore
from pipelines import Pipeline, Policy, TokenCounter
from tests.gateway.codecs.responses.samples import ITEM, checked

TRAJECTORIES = orjson.loads(DATA.read_bytes())
Items = list[dict[str, Any]]


@dataclass
class Outcome:
    """What a Responses replay broke, and how much it exercised."""

    found: list[str] = field(default_factory=list)
    requests: int = 0
    changed: int = 0
    events: int = 0
    refs: int = 0
    reasoning_dropped: int = 0


async def replayed(
    sessions: Sequence[Replayed],
    budget: int,
    style: Style = "instructions",
    store: MemoryStore | None = None,
) -> Outcome:
    """Every session sent request by request as a Responses client sends it, through the
    codec and the pipeline (the chat replay's policy; now and then the client is away
    longer than gpt-4o's cache lives, so the cache-TTL prune acts too), and every rule
    checked on each body that goes up: it fits (the pipeline's report, and the body's own
    count), its pairs and reasoning items hold, the codec's keys stay home, every ref in
    it restores (transitively), the client's other fields (but the cache key the
    pipeline sets) and latest user message go up as sent, every item the gateway made is
    one the SDK takes, and between compaction events it starts with the previous
    request's items."""
    store = store if store is not None else MemoryStore()
    pipeline = Pipeline(store=store)
    policy = Policy(max_input=budget)
    counter = TokenCounter()
    out = Outcome()

    async def fetch(ref: str) -> bytes | None:
        return await store.get("", ref)

    for number, session in enumerate(sessions):
        conversion = convert(session.messages, style)
        client_session = Session(pipeline, policy, render=stored_items)
        previous: tuple[dict[str, Any], Any] | None = None
        for turn, history in enumerate(session.requests):
            client = conversion.body(len(history))
            sent = await send(
                client_session, orjson.dumps(client), after=700.0 if turn % 7 == 6 else 5.0
            )
            body, report = sent.body, sent.result.report
            found = problems(client, body, sent.wire)
            if report.tokens_after > report.budget:
                found.append(f"{report.tokens_after} tokens over the budget {report.budget}")
            size = counter.count_messages(chat_form(body))
            if size > report.budget:
                found.append(f"the body counts {size} tokens, over the budget {report.budget}")
            missing = await unrestorable(sent.wire.decode(), fetch)
            found += [f"{ref} does not restore" for ref in missing]
            # Every other field as the client sent it, but the cache key the pipeline sets.
            if {k: v for k, v in body.items() if k not in ("input", "prompt_cache_key")} != {
                k: v for k, v in client.items() if k != "input"
            }:
                found.append("a field other than input changed")
            users = [i for i in client["input"] if i.get("role") == "user"]
            if users and users[-1] not in body["input"]:
                found.append("the latest user message not sent as it came")
            sent_by_client = {orjson.dumps(item) for item in client["input"]}
            for item in body["input"]:
                if orjson.dumps(item) not in sent_by_client:
                    ITEM.validate_python(item)
            if previous is not None:
                before, before_report = previous
                if report.is_event_after(before_report):
                    out.events += 1
                elif not prefix_kept(before, body):
                    found.append("the prefix moved between compaction events")
            previous = (body, report)
            out.found += [f"session {number}, request {turn}: {problem}" for problem in found]
            out.requests += 1
            out.changed += sent.result.changed
            out.refs += len(set(REF.findall(sent.wire.decode())))
            kinds = [[i.get("type") for i in b["input"]] for b in (client, body)]
            out.reasoning_dropped += kinds[0].count("reasoning") - kinds[1].count("reasoning")
    return out


@pytest.mark.parametrize(
    ("count", "budget", "style"),
    [(200, 4_000, "instructions"), (80, 8_000, "developer")],
)
async def test_replayed_trajectories_keep_the_chat_replays_invariants(
    count: int, budget: int, style: Style
) -> None:
    """The tau-bench trajectories as Responses sessions (instructions or a developer
    message; typed or short-form user messages), each turn of the model after a
    synthetic reasoning item: every request fits, pairs hold, reasoning items are sent
    byte for byte with their follower or not at all, every ref restores, and the prefix
    holds between compaction events; and the replay did compact (refs, removed reasoning
    items, events)."""
    outcome = await replayed(single_sessions(TRAJECTORIES[:count]), budget, style)
    assert outcome.found == []
    assert outcome.changed > outcome.requests // 2
    assert outcome.events > 0
    assert outcome.refs > 0
    assert outcome.reasoning_dropped > 0


async def test_long_sessions_keep_the_chat_replays_invariants() -> None:
    """Trajectories chained into sessions of 100 requests (one agent serving customer
    after customer), where compaction acts on most requests: the same rules hold."""
    sessions = chained_sessions(TRAJECTORIES[:30], 100)
    assert len(sessions) >= 3
    outcome = await replayed(sessions, 8_000)
    assert outcome.found == []
    assert outcome.events > 20
    assert outcome.reasoning_dropped > 1_000


# -- each check fails when what it checks breaks ------------------------------------------


Mutation = Callable[[Items], Items]


def _drop_a_follower(items: Items) -> Items:
    """The item after the first reasoning item left out (a codec that drops a call and
    keeps its reasoning)."""
    at = next((i for i, item in enumerate(items) if item.get("type") == "reasoning"), None)
    return items if at is None else items[: at + 1] + items[at + 2 :]


def _drop_a_reasoning(items: Items) -> Items:
    """The first reasoning item left out, its follower sent alone."""
    kinds = [item.get("type") for item in items]
    at = kinds.index("reasoning") if "reasoning" in kinds else None
    return items if at is None else items[:at] + items[at + 1 :]


def _edit_reasoning(items: Items) -> Items:
    return [{**item, "summary": []} if item.get("type") == "reasoning" else item for item in items]


def _drop_an_output(items: Items) -> Items:
    kinds = [item.get("type") for item in items]
    at = kinds.index("function_call_output") if "function_call_output" in kinds else None
    return items if at is None else items[:at] + items[at + 1 :]


def _leak_the_codec_keys(items: Items) -> Items:
    return [{**items[0], ITEMS: [items[0]]}, *items[1:]]


def _pad(items: Items) -> Items:
    return [*items[:-1], {"role": "developer", "content": "pad " * 9_000}, items[-1]]


class _Mover:
    """Numbers the first item anew on every request: the prefix moves every time."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, items: Items) -> Items:
        self.calls += 1
        return [{**items[0], "id": f"msg_{self.calls}"}, *items[1:]]


@pytest.mark.parametrize(
    ("mutation", "expected"),
    [
        (_drop_a_follower, "not followed by"),
        (_drop_a_reasoning, "sent without its reasoning"),
        (_edit_reasoning, "edited or invented"),
        (_drop_an_output, "never answered"),
        (_leak_the_codec_keys, f"codec key {ITEMS} sent"),
        (_pad, "over the budget"),
        (_Mover(), "the prefix moved"),
    ],
)
async def test_the_replay_fails_when_the_codec_breaks_a_rule(
    monkeypatch: pytest.MonkeyPatch, mutation: Mutation, expected: str
) -> None:
    """``to_request`` made to break one rule on every request the pipeline changed: the
    replay reports it."""

    def broken(
        messages: Sequence[Mapping[str, Any]], parsed: Sequence[Mapping[str, Any]] = ()
    ) -> list[Any]:
        return mutation(response_items(messages, parsed))

    monkeypatch.setattr(responses_request, "response_items", broken)
    outcome = await replayed(single_sessions(TRAJECTORIES[:12]), 4_000)
    assert any(expected in problem for problem in outcome.found), outcome.found[:5]


class _ForgettingStore(MemoryStore):
    """A store that loses every object once it is written."""

    async def get(self, namespace: str, ref: str) -> bytes | None:
        return None


async def test_the_replay_fails_when_a_ref_does_not_restore() -> None:
    outcome = await replayed(single_sessions(TRAJECTORIES[:12]), 4_000, store=_ForgettingStore())
    assert any("does not restore" in problem for problem in outcome.found)


# -- the checks on their own --------------------------------------------------------------

ENCRYPTED = base64.urlsafe_b64encode(b"\x80" + b"x" * 60).decode()
REASONING: dict[str, Any] = {
    "type": "reasoning",
    "id": "rs_1",
    "summary": [],
    "encrypted_content": ENCRYPTED,
}
CALL: dict[str, Any] = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
OUTPUT: dict[str, Any] = {"type": "function_call_output", "call_id": "c1", "output": "ok"}
USER: dict[str, Any] = {"role": "user", "content": "Hi"}


def test_unpaired_names_every_broken_pair() -> None:
    assert unpaired([USER, CALL, OUTPUT]) == []
    assert unpaired([USER, OUTPUT, CALL]) == ["input[1]: output of c1 before any call of it"]
    assert unpaired([USER, CALL]) == ["call c1 never answered"]
    assert unpaired([CALL, OUTPUT, OUTPUT]) == ["input[2]: output of c1 sent twice"]
    assert unpaired([CALL, CALL, OUTPUT]) == ["input[1]: call c1 sent twice"]


def test_reasoning_problems_hold_reasoning_and_follower_together() -> None:
    client = [USER, REASONING, CALL, OUTPUT]
    assert reasoning_problems(client, client) == []
    assert reasoning_problems(client, [USER]) == []  # removed together: fine
    assert reasoning_problems(client, [USER, REASONING, OUTPUT]) == [
        "input[1]: reasoning rs_1 not followed by function_call:c1"
    ]
    assert reasoning_problems(client, [USER, CALL, OUTPUT]) == [
        "input[1]: function_call:c1 sent without its reasoning"
    ]
    edited = {**REASONING, "summary": [{"type": "summary_text", "text": "x"}]}
    assert reasoning_problems(client, [USER, edited, CALL, OUTPUT]) == [
        "input[1]: reasoning rs_1 edited or invented",
        "input[2]: function_call:c1 sent without its reasoning",
    ]
    assert "sent twice" in reasoning_problems(client, [REASONING, REASONING, CALL])[0]


async def test_unrestorable_follows_refs_inside_what_they_restore() -> None:
    store = MemoryStore()
    inner = await store.put("", b"the output", ttl=60)
    outer = await store.put("", f"[preview; stored as {inner}]".encode(), ttl=60)
    missing = "ctx_" + "m" * 24

    async def fetch(ref: str) -> bytes | None:
        return await store.get("", ref)

    assert await unrestorable(f"see {outer}", fetch) == []
    names_missing = await store.put("", f"names {missing}".encode(), ttl=60)
    assert await unrestorable(f"see {outer} and {names_missing}", fetch) == [missing]


def test_prefix_kept_compares_instructions_and_items_byte_for_byte() -> None:
    before = {"instructions": "A", "input": [USER, CALL]}
    assert prefix_kept(before, {"instructions": "A", "input": [USER, CALL, OUTPUT]})
    assert not prefix_kept(before, {"instructions": "B", "input": [USER, CALL, OUTPUT]})
    reordered = {"arguments": "{}", **CALL}
    assert not prefix_kept(before, {"instructions": "A", "input": [USER, reordered]})
    assert not prefix_kept(before, {"instructions": "A", "input": [USER]})


# -- the conversion -----------------------------------------------------------------------


@pytest.mark.parametrize("style", ["instructions", "developer"])
def test_a_converted_session_is_what_a_responses_client_sends(style: Style) -> None:
    """Every item is one the SDK takes; every turn of the model starts with a reasoning
    item; call ids are unique (tau-bench reuses some); a longer history extends a shorter
    one's items; the codec gives the items back as they are; and the chat form carries
    the chat history's text, so retention and reversibility count alike."""
    for trajectory in TRAJECTORIES[:40]:
        messages = trajectory["traj"]
        conversion = convert(messages, style)
        items = checked(conversion.items)
        assert (conversion.instructions is not None) == (style == "instructions")
        calls = [i["call_id"] for i in items if i.get("type") == "function_call"]
        assert (
            len(calls) == len(set(calls)) == sum(len(m.get("tool_calls") or ()) for m in messages)
        )
        assert unpaired(items) == []
        for index, message in enumerate(messages):
            run = items[conversion.ends[index] : conversion.ends[index + 1]]
            kinds = [item.get("type", "message") for item in run]
            if message["role"] == "assistant":
                assert kinds[0] == "reasoning"
                assert kinds.count("reasoning") == 1
                assert kinds.count("function_call") == len(message.get("tool_calls") or ())
            else:
                assert "reasoning" not in kinds
        body = conversion.body(len(messages))
        assert response_items(chat_messages(items, conversion.instructions)) == items
        assert _units(chat_form(body)) == _units(messages)
        assert convert(messages, style) == conversion  # deterministic
        for end in range(len(messages)):
            shorter, longer = conversion.body(end)["input"], conversion.body(end + 1)["input"]
            assert longer[: len(shorter)] == shorter


def _units(messages: list[dict[str, Any]]) -> list[str]:
    """The text units of ``messages`` (``bench.quality``), their edges' whitespace aside (a
    message's parts are joined and stripped)."""
    return [unit.strip() for message in messages for unit in units_of(message)]


def test_without_reasoning_a_conversion_has_the_rest_alike() -> None:
    messages = TRAJECTORIES[0]["traj"]
    full, bare = convert(messages), convert(messages, reasoning=False)
    assert bare.items == [i for i in full.items if i["type"] != "reasoning"]


# -- the benchmark's Responses replay -----------------------------------------------------


async def test_the_benchmark_counts_the_responses_format_as_the_chat_format() -> None:
    """``replay_responses`` on a few trajectories: nothing over budget, no broken pair or
    reasoning rule, every fact retained, every removed byte restorable, every ref
    restores; without reasoning items the raw history is the chat history's (less the
    tool names); the side-by-side table has a row per format."""
    sessions = single_sessions(TRAJECTORIES[:12])
    chat, times = await replay(sessions, 4_000, headroom=False)
    responses = await replay_responses(sessions, 4_000)
    bare = await replay_responses(sessions, 4_000, reasoning=False)
    for run in (responses, bare):
        ours = run.tallies["contextgate"]
        assert ours.requests == chat["contextgate"].requests
        assert ours.over == ours.broken == run.reasoning_broken == run.rejected == 0
        assert ours.quality.retention == 1.0
        assert ours.quality.reversibility == 1.0
        assert ours.refs == ours.restorable > 0
    assert responses.reasoning_tokens > 0 == bare.reasoning_tokens
    assert 0 < responses.reasoning_sent < responses.reasoning_items
    raw = bare.tallies["none"].tokens
    assert raw == chat["none"].tokens - bare.tool_name_tokens + bare.call_id_tokens
    lines = formats_table([Formats("single, 4,000", chat, times, responses, bare)])
    rows = [line for line in lines if line.startswith("| single, 4,000 |")]
    assert [row.split(" | ")[1] for row in rows] == [
        "chat",
        "responses",
        "responses, no reasoning items",
    ]
