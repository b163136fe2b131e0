"""tau-bench trajectories (``bench/data/tau-bench-gpt-4o-airline.json``) replayed as
``/v1/messages`` requests to an OpenAI-compatible model (gpt-4o, the scripted
``tests.mock_models.ChatModel``), each with Anthropic's ``clear_tool_uses_20250919`` edit,
through the official SDK's beta call: the gateway's polyfill (stage ``native_edits``)
against the reference rules of Anthropic's server (``tests.anthropic_edits``).

Every request a client sends while a trajectory unfolds (each prefix ending at a user
turn, ``bench.compaction.requests_of``) goes through the gateway. For each, the reference
says which tool uses a real Anthropic server would clear; the gateway must report the same
count in ``applied_edits``, and what reached the upstream must have exactly those tool
results (the same tool_use ids) replaced by placeholders, each naming a ref that gives the
original back byte for byte (``GET /v1/context/objects/{ref}``, the same key), with every
tool call answered and no tool message orphaned.

The trajectories reuse tool call ids across turns (gpt-4o's recorded ids), which
Anthropic's API refuses (``tool_use ids must be unique``): the reference comparison runs
on them with each reused id made unique, as a client of Anthropic's API would have them;
the trajectories as recorded, which an OpenAI-compatible upstream takes, have a test of
their own.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import anthropic
import httpx
import orjson
import pytest

from bench.compaction import requests_of
from gateway.codecs.chat_anthropic import to_messages
from gateway.config import Settings, UpstreamSettings
from tests.anthropic_edits import (
    CLEAR_TOOL_USES,
    CONTEXT_MANAGEMENT_BETA,
    Count,
    apply_edits,
    json_tokens,
)
from tests.harness import GatewayServer
from tests.mock_models import ChatModel
from tests.mock_upstream import MockUpstream

TRACES = Path(__file__).resolve().parents[2] / "bench" / "data" / "tau-bench-gpt-4o-airline.json"
MODEL = "gpt-4o"
KEY = "sk-ant-replay"
CLEARED = re.compile(r"^\[Tool result of \S+ cleared to save context .*stored as (ctx_\S+?)\.")
"""The gateway's placeholder of a cleared tool result (``cleared_placeholder``)."""
TRIGGER = 3
KEEP = 2
BY_TOOL_USES: dict[str, Any] = {
    "edits": [
        {
            "type": CLEAR_TOOL_USES,
            "trigger": {"type": "tool_uses", "value": TRIGGER},
            "keep": {"type": "tool_uses", "value": KEEP},
        }
    ]
}
INPUT_TRIGGER = 3_000
BY_INPUT_TOKENS: dict[str, Any] = {
    "edits": [
        {
            "type": CLEAR_TOOL_USES,
            "trigger": {"type": "input_tokens", "value": INPUT_TRIGGER},
            "keep": {"type": "tool_uses", "value": KEEP},
        }
    ]
}


@cache
def trajectories() -> tuple[list[dict[str, Any]], ...]:
    return tuple(t["traj"] for t in orjson.loads(TRACES.read_bytes()))


def unique_ids(trajectory: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``trajectory`` with every reused tool call id made unique: the ``n``-th call that
    reuses an id gets ``_n`` after it, and so do the tool messages that answer it."""
    seen: Counter[str] = Counter()
    out: list[dict[str, Any]] = []
    renamed: dict[str, str] = {}
    for message in trajectory:
        message = dict(message)
        if message["role"] == "assistant" and message.get("tool_calls"):
            renamed = {}
            calls = []
            for call in message["tool_calls"]:
                seen[call["id"]] += 1
                new = call["id"] if seen[call["id"]] == 1 else f"{call['id']}_{seen[call['id']]}"
                renamed[call["id"]] = new
                calls.append({**call, "id": new})
            message["tool_calls"] = calls
        elif message["role"] == "tool":
            message["tool_call_id"] = renamed.get(message["tool_call_id"], message["tool_call_id"])
        out.append(message)
    return out


def bodies(trajectory: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The Messages requests a client sends while ``trajectory`` unfolds."""
    history = [dict(message) for message in trajectory]
    return [to_messages({"model": MODEL, "messages": h}) for h in requests_of(history)]


def reuses_ids(body: Mapping[str, Any]) -> bool:
    ids = [use["id"] for use, _ in uses_and_results(body)]
    return len(ids) != len(set(ids))


def uses_and_results(body: Mapping[str, Any]) -> list[tuple[dict[str, Any], int | None]]:
    """Every tool_use of ``body``, oldest first, with the position (among all the
    request's tool_result blocks, in order) of the result that answers it: the one in the
    next user turn with its id."""
    turns = body["messages"]
    positions: list[dict[str, int]] = []
    flat = 0
    for turn in turns:
        found: dict[str, int] = {}
        for block in turn["content"] if isinstance(turn["content"], list) else ():
            if block.get("type") == "tool_result":
                found.setdefault(block["tool_use_id"], flat)
                flat += 1
        positions.append(found)
    out = []
    for at, turn in enumerate(turns):
        if turn["role"] != "assistant" or not isinstance(turn["content"], list):
            continue
        following = positions[at + 1] if at + 1 < len(turns) else {}
        for block in turn["content"]:
            if block.get("type") == "tool_use":
                out.append((block, following.get(block["id"])))
    return out


def results_of(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [
        block
        for turn in body["messages"]
        if isinstance(turn["content"], list)
        for block in turn["content"]
        if block.get("type") == "tool_result"
    ]


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or () if isinstance(part, dict))


def same_result(went_up: str, sent: str) -> bool:
    """Whether a tool result that was not cleared went up as sent: the same text, or the
    same JSON (the gateway minifies JSON results losslessly)."""
    if went_up == sent:
        return True
    try:
        return bool(orjson.loads(went_up) == orjson.loads(sent))
    except orjson.JSONDecodeError:
        return False


def broken_pairs(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """What a chat completions API would refuse in ``messages``: a tool call without its
    tool message right after its assistant message, or a tool message answering no call
    of the assistant message before it."""
    problems = []
    for index, message in enumerate(messages):
        if message.get("role") == "assistant" and message.get("tool_calls"):
            wanted = sorted(call["id"] for call in message["tool_calls"])
            after = itertools.takewhile(lambda m: m.get("role") == "tool", messages[index + 1 :])
            answered = sorted(str(m.get("tool_call_id")) for m in after)
            if answered != wanted:
                problems.append(f"messages[{index}]: calls {wanted} answered by {answered}")
        if message.get("role") == "tool":
            before = [m for m in messages[:index] if m.get("role") != "tool"]
            calls = (before[-1].get("tool_calls") or []) if before else []
            if message.get("tool_call_id") not in {call.get("id") for call in calls}:
                problems.append(f"messages[{index}]: tool message answering no call")
    return problems


def gateways_count(body: Mapping[str, Any], tokens: int) -> Count:
    """A ``Count`` for the reference that gives ``tokens`` (the gateway's own count of
    ``body``'s prompt) for the prompt as sent, which is what decides an input-tokens
    trigger, and the reference's rough count for anything else (what a clearing saves,
    which is not compared)."""

    def count(value: Any) -> int:
        if isinstance(value, Mapping) and value.get("messages") == body["messages"]:
            return tokens
        return json_tokens(value)

    return count


@dataclass
class Totals:
    requests: int = 0
    over: int = 0
    """Requests the reference clears something in."""
    cleared: int = 0
    """Tool uses the gateway reported cleared."""
    equal: int = 0
    """Requests whose count is the reference's."""
    restored: int = 0
    """Placeholders whose ref gave the original back."""
    rough: int = 0
    """Requests the reference's rough count (a quarter of the JSON) decides otherwise than
    the gateway's count."""
    problems: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return (
            f"{self.requests} requests, {self.over} over the trigger, {self.cleared} tool uses"
            f" cleared, {self.equal} counts equal to the reference's, {self.restored}"
            f" placeholders restored, {len(self.problems)} problems ({self.rough} decided"
            " otherwise by a rough count)"
        )


class Replay:
    """The gateway in front of the scripted model, the SDK pointed at it, and the checks of
    one request against what it should have made of it."""

    def __init__(self, gateway: GatewayServer, model: ChatModel) -> None:
        self.gateway, self.model = gateway, model
        self.sdk = anthropic.Anthropic(base_url=gateway.url, api_key=KEY, max_retries=0)
        self.http = httpx.Client(base_url=gateway.base_url, headers={"x-api-key": KEY})
        self.objects: dict[str, bytes] = {}
        self.totals = Totals()

    def close(self) -> None:
        self.sdk.close()
        self.http.close()

    def send(
        self, body: Mapping[str, Any], management: Any
    ) -> tuple[anthropic.types.beta.BetaMessage, dict[str, Any], int]:
        """``body`` sent with ``management``: the answer, what reached the upstream, and
        the gateway's own count of the request as received (``x-contextgate-tokens``'
        ``before``: what an input-tokens trigger is compared with)."""
        before = len(self.model.requests)
        raw = self.sdk.beta.messages.with_raw_response.create(
            model=MODEL,
            max_tokens=body["max_tokens"],
            system=body["system"],
            messages=body["messages"],
            betas=[CONTEXT_MANAGEMENT_BETA],
            context_management=management,
        )
        assert raw.status_code == 200
        assert len(self.model.requests) == before + 1
        tokens = raw.headers["x-contextgate-tokens"]
        assert "estimated" not in tokens, tokens
        counted = int(re.search(r"before=(\d+)", tokens)[1])  # type: ignore[index]
        return raw.parse(), self.model.requests[-1], counted

    def restored(self, ref: str) -> bytes | None:
        if ref not in self.objects:
            got = self.http.get(f"/context/objects/{ref}")
            if got.status_code != 200:
                return None
            self.objects[ref] = got.content
        return self.objects[ref]

    def check(
        self, where: str, body: Mapping[str, Any], management: Any, *, counted: bool = False
    ) -> None:
        """Send ``body`` with ``management`` and check it against the reference (counting
        with the gateway's own count of the prompt when ``counted``, else its own rough
        count), adding what is wrong to the totals' problems."""
        totals, problems = self.totals, self.totals.problems
        message, went_up, tokens = self.send(body, management)
        full = {**body, "context_management": management}
        reference = apply_edits(full, gateways_count(body, tokens) if counted else json_tokens)
        if counted:
            rough = apply_edits(full)
            totals.rough += rough.cleared_tool_use_ids != reference.cleared_tool_use_ids
        applied = message.context_management.applied_edits if message.context_management else []
        got = sum(e.cleared_tool_uses for e in applied if e.type == CLEAR_TOOL_USES)
        want = len(reference.cleared_tool_use_ids)
        totals.requests += 1
        totals.over += bool(want)
        totals.cleared += got
        totals.equal += got == want
        if got != want:
            problems.append(f"{where}: the gateway cleared {got} tool uses, Anthropic {want}")
        if "context_management" in went_up:
            problems.append(f"{where}: context_management went up")
        problems += [f"{where}: {p}" for p in broken_pairs(went_up["messages"])]
        sent = results_of(body)
        tools = [m for m in went_up["messages"] if m.get("role") == "tool"]
        if [m.get("tool_call_id") for m in tools] != [b["tool_use_id"] for b in sent]:
            problems.append(f"{where}: the tool messages upstream are not the results sent")
            return
        ids = [m["tool_call_id"] for m in tools if CLEARED.match(text_of(m["content"]))]
        if ids != reference.cleared_tool_use_ids:
            problems.append(f"{where}: cleared {ids}, Anthropic {reference.cleared_tool_use_ids}")
        results = {use["id"]: at for use, at in uses_and_results(body)}
        cleared = [results[i] for i in reference.cleared_tool_use_ids]
        self.compare(where, sent, tools, [at for at in cleared if at is not None])

    def compare(
        self,
        where: str,
        sent: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        cleared: Sequence[int],
    ) -> None:
        """The tool messages that went up (``tools``) against the results ``sent``: those
        at ``cleared`` placeholders whose ref gives back the result sent there, byte for
        byte; the others as sent."""
        problems = self.totals.problems
        for at, (result, tool) in enumerate(zip(sent, tools, strict=True)):
            original, went = text_of(result["content"]), text_of(tool["content"])
            placeholder = CLEARED.match(went)
            if at not in cleared:
                if placeholder is not None or not same_result(went, original):
                    problems.append(f"{where}: result {at} changed: {went[:120]!r}")
                continue
            if placeholder is None:
                problems.append(f"{where}: result {at} not cleared: {went[:120]!r}")
                continue
            restored = self.restored(placeholder[1])
            if restored != original.encode():
                shown = None if restored is None else restored[:120]
                problems.append(f"{where}: result {at} restores {shown!r}, not {original[:80]!r}")
            else:
                self.totals.restored += 1


@pytest.fixture
def replay() -> Iterator[Replay]:
    """A gateway of its own in front of an OpenAI-compatible model that refuses broken
    tool pairs with a 400 (its offload store in memory, no summary model)."""
    model = ChatModel()
    with MockUpstream() as upstream:
        upstream.handler = model
        settings = Settings(upstream=UpstreamSettings(base_url=upstream.base_url), summaries=False)
        with GatewayServer(settings) as gateway:
            replaying = Replay(gateway, model)
            yield replaying
            replaying.close()


def test_the_polyfill_clears_what_anthropic_would_by_tool_uses(replay: Replay) -> None:
    """Every request of every trajectory (reused ids made unique) with a small tool-uses
    trigger: the gateway clears the tool uses Anthropic's server would, reports their
    count, and what went up has exactly those results as placeholders, each restoring the
    original, and every pair whole."""
    for number, trajectory in enumerate(trajectories()):
        for index, body in enumerate(bodies(unique_ids(trajectory))):
            replay.check(f"trajectory {number} request {index}", body, BY_TOOL_USES)
    totals = replay.totals
    print(f"\nby tool uses: {totals}")
    assert totals.problems == [], (str(totals), totals.problems[:10])
    assert totals.requests > 2_500
    assert totals.over > 1_000
    assert totals.restored >= totals.cleared > 5_000


def test_the_polyfill_clears_what_anthropic_would_by_input_tokens(replay: Replay) -> None:
    """Every request of 100 trajectories with an input-tokens trigger, the reference
    counting the prompt as the gateway counted it (``x-contextgate-tokens``' ``before``:
    its count of the request as received, its restore tool included once the
    conversation carries it, which is what the stage compares with the trigger), so that
    both compare the same number: the same uses cleared, reported and restorable. (The
    reference's own rough count, a quarter of the JSON, decides some requests otherwise:
    another tokenizer's count is not one the gateway can match.)"""
    for number, trajectory in enumerate(trajectories()[:100]):
        for index, body in enumerate(bodies(unique_ids(trajectory))):
            replay.check(
                f"trajectory {number} request {index}", body, BY_INPUT_TOKENS, counted=True
            )
    totals = replay.totals
    print(f"\nby input tokens: {totals}")
    assert totals.problems == [], (str(totals), totals.problems[:10])
    assert 100 < totals.over < totals.requests
    assert totals.restored >= totals.cleared > 500


def test_reused_tool_call_ids_clear_each_uses_own_result(replay: Replay) -> None:
    """The trajectories as recorded, where gpt-4o's ids come back in later turns (which
    the chat API takes: a tool message answers the call just before it): each cleared use
    is its own call's result, restorable, and the kept latest uses' results go up whole."""
    checked = 0
    for number, trajectory in enumerate(trajectories()):
        for index, body in enumerate(bodies(trajectory)):
            if not reuses_ids(body):
                continue
            where = f"trajectory {number} request {index}"
            message, went_up, _ = replay.send(body, BY_TOOL_USES)
            uses = uses_and_results(body)
            older = uses[: max(0, len(uses) - KEEP)] if len(uses) > TRIGGER else []
            cleared = [at for _, at in older if at is not None]
            applied = message.context_management.applied_edits if message.context_management else []
            got = sum(e.cleared_tool_uses for e in applied if e.type == CLEAR_TOOL_USES)
            if got != len(cleared):
                replay.totals.problems.append(f"{where}: {got} cleared, {len(cleared)} due")
            tools = [m for m in went_up["messages"] if m.get("role") == "tool"]
            replay.compare(where, results_of(body), tools, cleared)
            checked += 1
    assert checked > 100
    assert replay.totals.problems == [], replay.totals.problems[:10]
