"""Scaling out: three ``contextgate serve`` processes on one Redis, the requests of a
conversation spread across them. What one replica offloaded the others restore; a summary
prepared on one is used by another without asking the model again; three replicas
crossing the prepare threshold at once ask the summary model once; a conversation served by
two replicas shows all its requests in the ledger of either; and a replica killed mid-stream
breaks only its own streams, while its refs stay restorable elsewhere."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
from openai.types.chat import ChatCompletionChunk
from prometheus_client.parser import text_string_to_metric_families

from bench.compaction import requests_of
from gateway.context.restore import RESTORE_TOOL_NAME
from pipelines.summary import summary_message
from tests.harness import Replicas, ServeProcess, redis_server
from tests.mock_upstream import (
    JSONReply,
    MockUpstream,
    Received,
    SSEReply,
    SummaryModel,
    chat_chunk,
    chat_completion,
    events_of,
)

KEY = "sk-scale-out-caller"
AUTH = {"authorization": f"Bearer {KEY}"}
TIMEOUT = httpx.Timeout(30.0, connect=5.0)
REF = re.compile(r"ctx_[A-Za-z0-9_-]{22,}")
OFFLOAD = "filter-tokens=300"
"""Tool outputs over 300 tokens are offloaded (each output here is about 1,500)."""
SUMMARISE = "max-input=8000"
"""A budget the tau-bench conversation outgrows: a summary is prepared, then used."""
TRACES = Path(__file__).resolve().parents[2] / "bench" / "data" / "tau-bench-gpt-4o-airline.json"


@pytest.fixture(scope="module")
def deployment(
    mock_upstream: MockUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replicas]:
    """Three replicas, summaries on, on a redis-server of their own."""
    with redis_server() as redis:
        config = (
            f"upstream:\n  base_url: {mock_upstream.base_url}\n"
            f"redis_url: {redis.url}\nsummaries: true\n"
        )
        with Replicas(config, str(tmp_path_factory.mktemp("replicas")), 3) as replicas:
            yield replicas


@pytest.fixture
def replicas(deployment: Replicas, upstream: MockUpstream) -> Replicas:
    """The three replicas, all running (one a test killed is replaced), in front of a
    freshly reset mock upstream."""
    deployment.revive()
    # Background summaries of an earlier test would be answered by this test's upstream.
    wait_until(lambda: idle(*deployment))
    return deployment


# -- conversations --------------------------------------------------------------------------


def bookings(name: str) -> str:
    """A tool output of about 1,500 tokens, its own for each conversation ``name``."""
    return "".join(
        f"[{name}] booking BK{i:04d}: passenger {i}, seat {i % 30}C, status confirmed\n"
        for i in range(60)
    )


def exported(name: str) -> list[dict[str, Any]]:
    """A conversation whose last message is the large output of a tool call."""
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "list_bookings", "arguments": "{}"},
    }
    return [
        {"role": "user", "content": f"[{name}] Which booking is in seat 7C?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": bookings(name)},
    ]


def anthropic_exported(name: str) -> list[dict[str, Any]]:
    """``exported(name)`` as an Anthropic Messages client writes it."""
    call = {"type": "tool_use", "id": "t1", "name": "list_bookings", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": bookings(name)}
    return [
        {"role": "user", "content": f"[{name}] Which booking is in seat 7C?"},
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [result]},
    ]


def tau_turns() -> list[list[dict[str, Any]]]:
    """The histories the client of the longest tau-bench trajectory sends, turn by turn."""
    trajectories = sorted(json.loads(TRACES.read_text()), key=lambda t: -len(t["traj"]))
    return requests_of(trajectories[0]["traj"])


def headers(conversation: str, policy: str) -> dict[str, str]:
    return {"x-contextgate-conversation": conversation, "x-contextgate-policy": policy}


# -- the upstream's side --------------------------------------------------------------------


def refs_in(received: Received) -> list[str]:
    return sorted(set(REF.findall(orjson.dumps(received.json()["messages"]).decode())))


def chat_requests(upstream: MockUpstream) -> list[Received]:
    return [r for r in upstream.received if b'"response_format"' not in r.body]


def restore_call(ref: str) -> dict[str, Any]:
    arguments = orjson.dumps({"ref": ref}).decode()
    return {
        "id": "r1",
        "type": "function",
        "function": {"name": RESTORE_TOOL_NAME, "arguments": arguments},
    }


def calling_restore(ref: str) -> dict[str, Any]:
    reply = chat_completion()
    reply["choices"][0]["message"] = {
        "role": "assistant",
        "content": None,
        "tool_calls": [restore_call(ref)],
    }
    reply["choices"][0]["finish_reason"] = "tool_calls"
    return reply


def words(name: str, count: int) -> list[str]:
    return [f"{name}-{n:02d} " for n in range(count)]


def slow_stream(texts: list[str], interval: float) -> SSEReply:
    """An answer streamed one piece of text every ``interval`` seconds."""
    chunks = [chat_chunk({"role": "assistant", "content": ""})]
    chunks += [chat_chunk({"content": text}) for text in texts]
    return SSEReply(events_of([*chunks, chat_chunk({}, "stop")]), interval=interval)


def streamed_restore(ref: str) -> SSEReply:
    call = {**restore_call(ref), "index": 0}
    return SSEReply(
        events_of(
            [chat_chunk({"role": "assistant", "tool_calls": [call]}), chat_chunk({}, "tool_calls")]
        )
    )


# -- the gateway's side ---------------------------------------------------------------------


def sdk(replica: ServeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=replica.base_url, api_key=KEY, max_retries=0, timeout=TIMEOUT)


def texts(stream: Iterable[ChatCompletionChunk]) -> Iterator[str]:
    """The pieces of text a streamed answer brings, as they come."""
    for piece in stream:
        if piece.choices and piece.choices[0].delta.content:
            yield piece.choices[0].delta.content


def post(replica: ServeProcess, history: list[dict[str, Any]], conversation: str) -> httpx.Response:
    response = httpx.post(
        f"{replica.base_url}/chat/completions",
        json={"model": "gpt-4o", "messages": history},
        headers={**AUTH, **headers(conversation, SUMMARISE)},
        timeout=TIMEOUT,
    )
    assert response.status_code == 200, response.text
    return response


def summary_of(response: httpx.Response) -> str:
    return response.headers.get("x-contextgate-summary", "")


def counters(replica: ServeProcess, name: str) -> Counter[str]:
    """The samples of counter ``name`` on ``replica``'s /metrics, by their one label."""
    text = httpx.get(f"{replica.url}/metrics", timeout=TIMEOUT).text
    found: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"{name}_total":
                (label,) = sample.labels.values()
                found[label] += int(sample.value)
    return found


def summary_jobs(*replicas: ServeProcess) -> Counter[str]:
    """Summary jobs by outcome, added up over ``replicas``."""
    total: Counter[str] = Counter()
    for replica in replicas:
        total.update(counters(replica, "contextgate_summary_jobs"))
    return total


def idle(*replicas: ServeProcess) -> bool:
    """Whether every summary job ``replicas`` scheduled has ended, one way or another."""
    jobs = summary_jobs(*replicas)
    ended = ("made", "reused", "locked", "failed")
    return sum(jobs[outcome] for outcome in ended) == jobs["scheduled"]


def wait_until(condition: Callable[[], bool], seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


# -- the tests ------------------------------------------------------------------------------


def test_a_ref_made_on_one_replica_is_restored_through_the_others(
    replicas: Replicas, upstream: MockUpstream
) -> None:
    """A offloads a tool output; B's objects route returns its exact bytes; C answers the
    model's restore call for it with the whole original."""
    a, b, c = replicas
    history = exported("refs")
    original = bookings("refs")
    upstream.push(JSONReply(chat_completion("Seat 7C is booking BK0007.")))
    with sdk(a) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o",
            messages=history,  # type: ignore[arg-type]
            extra_headers=headers("refs", OFFLOAD),
        )
    assert raw.parse().choices[0].message.content == "Seat 7C is booking BK0007."
    assert "filter" in raw.headers["x-contextgate-actions"].split(", ")
    (first,) = upstream.received
    assert original.encode() not in first.body
    (ref,) = refs_in(first)
    dry_run = httpx.post(
        f"{a.base_url}/context/compact",
        json={"model": "gpt-4o", "messages": history},
        headers={**AUTH, **headers("refs", OFFLOAD)},
        timeout=TIMEOUT,
    )
    stages = {stage["name"]: stage for stage in dry_run.json()["report"]["stages"]}
    assert stages["filter"]["details"]["refs"] == [ref]

    restored = httpx.get(f"{b.base_url}/context/objects/{ref}", headers=AUTH, timeout=TIMEOUT)
    assert restored.status_code == 200
    assert restored.content == original.encode()
    assert restored.headers["x-contextgate-object-lines"] == "60"

    upstream.reset()
    upstream.push(
        JSONReply(calling_restore(ref)),
        JSONReply(chat_completion("BK0012 is in seat 12C.")),
    )
    follow_up = [
        *history,
        {"role": "assistant", "content": "Seat 7C is booking BK0007."},
        {"role": "user", "content": "And who is in seat 12C?"},
    ]
    with sdk(c) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o",
            messages=follow_up,  # type: ignore[arg-type]
            extra_headers=headers("refs", OFFLOAD),
        )
    answer = raw.parse().choices[0].message
    assert answer.content == "BK0012 is in seat 12C."
    assert answer.tool_calls is None
    assert raw.headers["x-contextgate-restore"] == "rounds=1, calls=1"
    asked, answered = (r.json() for r in upstream.received)
    assert refs_in(upstream.received[0]) == [ref]  # C sent A's preview unchanged
    assert [t["function"]["name"] for t in asked["tools"]] == [RESTORE_TOOL_NAME]
    assert answered["messages"][-1] == {"role": "tool", "tool_call_id": "r1", "content": original}


def test_a_summary_prepared_on_one_replica_is_used_by_another(
    replicas: Replicas, upstream: MockUpstream
) -> None:
    """A prepares a summary in the background; B, at the cut, sends A's checkpoint without
    asking the summary model for one, and what B prepares next merges A's."""
    a, b, _ = replicas
    model = SummaryModel(delay=0.5)
    upstream.handler = model
    jobs_before, paths_before = summary_jobs(a, b), counters(b, "contextgate_summaries")
    history = tau_turns()
    index = 0
    while "prepare=scheduled" not in summary_of(post(a, history[index], "checkpoint")):
        index += 1
        assert index < len(history), "A never prepared a summary"
    wait_until(lambda: (summary_jobs(a, b) - jobs_before)["made"] == 1)  # A's checkpoint
    (prepared,) = model.answers

    for request in history[index + 1 :]:
        response = post(b, request, "checkpoint")
        path = summary_of(response).split(",")[0]
        if path:
            break
        assert len(model.calls) == 1
    assert path == "prepared"
    assert "summarize" in response.headers["x-contextgate-actions"].split(", ")
    (recalled,) = [
        m["content"]
        for m in chat_requests(upstream)[-1].json()["messages"]
        if str(m.get("content")).startswith("[Recalled context")
    ]
    assert recalled.startswith(summary_message(prepared, [])["content"])
    assert counters(b, "contextgate_summaries") - paths_before == Counter(prepared=1)

    # B's own preparation (a later span) goes on from A's summary instead of starting over.
    wait_until(lambda: idle(a, b))
    assert len(model.calls) <= 2
    for call in model.calls[1:]:
        instructions = call["messages"][0]["content"]
        assert orjson.loads(instructions.split("Previous checkpoint:\n")[1]) == prepared


def test_three_replicas_crossing_the_threshold_at_once_ask_for_one_summary(
    replicas: Replicas, upstream: MockUpstream
) -> None:
    """The same turns reach all three replicas at once; at the prepare threshold each
    schedules a summary, and the summary model (slow, so the three overlap) is asked once."""
    delay = 3.0
    model = SummaryModel(delay=delay)
    upstream.handler = model
    before = summary_jobs(*replicas)
    with ThreadPoolExecutor(3) as pool:
        for request in tau_turns():
            answers = list(pool.map(post, replicas, [request] * 3, ["single-flight"] * 3))
            if any("prepare=scheduled" in summary_of(a) for a in answers):
                break
        else:
            pytest.fail("no replica prepared a summary")
    assert [summary_of(a) for a in answers] == ["prepare=scheduled"] * 3
    wait_until(lambda: idle(*replicas))
    jobs = summary_jobs(*replicas) - before
    assert len(model.calls) == 1
    (call,) = [r for r in upstream.received if b'"response_format"' in r.body]
    # The three requests were all in before the summary model answered: they overlapped.
    assert max(r.at for r in chat_requests(upstream)[-3:]) < call.at + delay
    assert (jobs["scheduled"], jobs["made"], jobs["locked"] + jobs["reused"]) == (3, 1, 2)


def test_a_conversation_served_by_two_replicas_shows_all_its_requests_on_either(
    replicas: Replicas, upstream: MockUpstream
) -> None:
    """Four requests of one conversation, alternately on A and B: the ledger each replica
    shows has all four, newest first, the offloaded output's ref among them, and the
    detail of a request served by A is read through B."""
    a, b, _ = replicas
    history = exported("ledger")
    served: list[str] = []
    for turn in range(4):
        upstream.push(JSONReply(chat_completion(f"Answer {turn}.")))
        with sdk((a, b)[turn % 2]) as client:
            raw = client.chat.completions.with_raw_response.create(
                model="gpt-4o",
                messages=history,  # type: ignore[arg-type]
                extra_headers=headers("ledger", OFFLOAD),
            )
        served.append(raw.headers["x-contextgate-request-id"])
        history = [
            *history,
            {"role": "assistant", "content": f"Answer {turn}."},
            {"role": "user", "content": f"Question {turn + 1}?"},
        ]

    def seen(replica: ServeProcess) -> dict[str, Any]:
        url = f"{replica.base_url}/context/conversations/client:ledger"
        found: dict[str, Any] = httpx.get(url, headers=AUTH, timeout=TIMEOUT).json()
        return found

    wait_until(lambda: all(seen(r).get("requests") == 4 for r in (a, b)))
    for replica in (a, b):
        conversation = seen(replica)
        assert conversation["requests"] == conversation["entries"]["total"] == 4
        assert [e["id"] for e in conversation["entries"]["data"]] == served[::-1]
        assert conversation["upstream_tokens"] < conversation["client_tokens"]
        listed = httpx.get(f"{replica.base_url}/context/conversations", headers=AUTH).json()
        assert "client:ledger" in [row["id"] for row in listed["data"]]
    first = httpx.get(
        f"{b.base_url}/context/conversations/client:ledger/requests/{served[0]}",
        headers=AUTH,
        timeout=TIMEOUT,
    ).json()
    (ref,) = {ref["ref"] for ref in first["refs"]}
    tool = next(row for row in first["detail"]["messages"] if row["role"] == "tool")
    assert tool["fate"] == "offloaded"
    assert tool["refs"] == [ref]


def test_killing_a_replica_mid_stream_breaks_only_its_own_streams(
    replicas: Replicas, upstream: MockUpstream
) -> None:
    """Streams through A, B and C (the anthropic SDK); B is killed (SIGKILL) mid-stream:
    A's and C's streams end whole, B's client sees its connection break, and B's
    conversation goes on through A, which restores the output B had offloaded."""
    a, b, c = replicas
    count = 50  # five seconds of streaming, all three open within the first
    retried: list[Received] = []

    def answer(received: Received) -> SSEReply:
        name = next(n for n in "abc" if f"[stream-{n}]".encode() in received.body)
        if name == "b" and any(b"[stream-b]" in r.body for r in upstream.received[:-1]):
            retried.append(received)  # B's conversation again, now through A
            if len(retried) == 1:
                return streamed_restore(refs_in(received)[0])
            return SSEReply(events_of([chat_chunk({"content": "BK0007."}), chat_chunk({}, "stop")]))
        return slow_stream(words(name, count), interval=0.1)

    upstream.handler = answer
    with (
        sdk(a) as client_a,
        sdk(b) as client_b,
        anthropic.Anthropic(base_url=c.url, api_key=KEY, max_retries=0, timeout=30.0) as client_c,
        client_a.chat.completions.create(
            model="gpt-4o",
            messages=exported("stream-a"),  # type: ignore[arg-type]
            extra_headers=headers("stream-a", OFFLOAD),
            stream=True,
        ) as stream_a,
        client_b.chat.completions.create(
            model="gpt-4o",
            messages=exported("stream-b"),  # type: ignore[arg-type]
            extra_headers=headers("stream-b", OFFLOAD),
            stream=True,
        ) as stream_b,
        client_c.messages.stream(
            model="gpt-4o",
            max_tokens=500,
            messages=anthropic_exported("stream-c"),  # type: ignore[arg-type]
            extra_headers=headers("stream-c", OFFLOAD),
        ) as stream_c,
    ):
        texts_a, texts_b = texts(stream_a), texts(stream_b)
        texts_c = iter(stream_c.text_stream)
        got_a, got_b, got_c = [next(texts_a)], [next(texts_b)], [next(texts_c)]
        assert upstream.in_flight == 3  # all three still streaming
        b.kill()
        got_a.extend(texts_a)
        got_c.extend(texts_c)
        with pytest.raises(openai.APIConnectionError) as broken:
            got_b.extend(texts_b)
    # The body ended mid-way, without its last chunk: a broken connection, not an answer.
    cause = broken.value.__cause__
    assert type(cause).__name__ == "RemoteProtocolError", repr(cause)
    assert "incomplete chunked read" in str(cause)
    assert "".join(got_a) == "".join(words("a", count))
    assert "".join(got_c) == "".join(words("c", count))
    assert 1 <= len(got_b) < count
    assert got_b == words("b", count)[: len(got_b)]
    assert b.process.returncode == -9
    assert len(upstream.disconnects) == 1  # B's upstream stream, and no other

    (made_by_b,) = refs_in(next(r for r in upstream.received if b"[stream-b]" in r.body))
    restored = httpx.get(f"{a.base_url}/context/objects/{made_by_b}", headers=AUTH, timeout=TIMEOUT)
    assert restored.status_code == 200
    assert restored.content == bookings("stream-b").encode()
    with sdk(a) as client_a:
        retry = client_a.chat.completions.create(
            model="gpt-4o",
            messages=exported("stream-b"),  # type: ignore[arg-type]
            extra_headers=headers("stream-b", OFFLOAD),
            stream=True,
        )
        assert "".join(texts(retry)) == "BK0007."
    asked, answered = (r.json() for r in retried)
    assert refs_in(retried[0]) == [made_by_b]
    assert [t["function"]["name"] for t in asked["tools"]] == [RESTORE_TOOL_NAME]
    assert answered["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "r1",
        "content": bookings("stream-b"),
    }
