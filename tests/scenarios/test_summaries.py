"""Summaries through the gateway (``summaries: true``), with the mock upstream playing
both the chat model and the summary model, and a real Redis: prepared in the background
without holding the request, used at the cut without a call, bounded in number over a
long session, shared by replicas (two ``contextgate serve`` processes), single-flight,
within their deadline, cancelled on shutdown, and written in the conversation's language."""

from __future__ import annotations

import json
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis

from bench.compaction import requests_of
from gateway.config import Settings, UpstreamSettings
from pipelines import ModelInfo
from pipelines.summary import FIELDS, LIST_FIELDS
from tests.harness import GatewayServer, ServeProcess
from tests.mock_upstream import JSONReply, MockUpstream, Received, SummaryModel, chat_completion
from tests.openai_schema import assert_valid_request

TRACES = Path(__file__).resolve().parents[2] / "bench" / "data" / "tau-bench-gpt-4o-airline.json"
POLICY = "max-input=7000"
"""Small enough that the longest trajectory is compacted and summarised: as compact JSON
it is 7,379 tokens, and at 8,000 its first cold pass alone brings it under the trigger."""
REPLICA_POLICY = "max-input=8000"
"""For a preparation on one replica used at the cut on another, turn by turn: the first
replica prepares at the 11th request, and the 23rd is cut on the second before that one's
own span has outgrown the checkpoint by a grid step (it next prepares two requests after
the cut). So does 7,600 to 8,500; at 7,000, 7,400, 7,500 or 9,000 the second replica
schedules its own preparation one or two requests before the cut."""


def trajectories() -> list[dict[str, Any]]:
    return sorted(json.loads(TRACES.read_text()), key=lambda t: -len(t["traj"]))


def turns() -> list[list[dict[str, Any]]]:
    """The histories the longest trajectory's client sends, turn by turn."""
    return requests_of(trajectories()[0]["traj"])


def long_session(count: int = 60) -> list[list[dict[str, Any]]]:
    """``count`` turns of one session: the longest trajectories, one after the other
    under the first one's system prompt (the same agent serving on)."""
    messages: list[dict[str, Any]] = []
    for trajectory in trajectories():
        traj = trajectory["traj"]
        messages.extend(traj if not messages else traj[1:])
        if len(requests_of(messages)) >= count:
            break
    return requests_of(messages)[:count]


def post(
    base_url: str, history: list[dict[str, Any]], conversation: str, policy: str = POLICY
) -> httpx.Response:
    response = httpx.post(
        f"{base_url}/chat/completions",
        json={"model": "gpt-4o", "messages": history},
        headers={
            "authorization": "Bearer sk-test",
            "x-contextgate-policy": policy,
            "x-contextgate-conversation": conversation,
        },
        timeout=60,
    )
    assert response.status_code == 200, response.text
    return response


def chat_requests(upstream: MockUpstream) -> list[dict[str, Any]]:
    return [r.json() for r in upstream.received if "response_format" not in r.json()]


def wait_until(condition: Callable[[], bool], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


def settle(model: SummaryModel, quiet: float = 1.5) -> None:
    """Wait until no summary call has come for ``quiet`` seconds (longer than the model
    takes to answer): replicas in other processes have finished their background work."""
    seen, since = len(model.calls), time.monotonic()
    deadline = since + 30
    while time.monotonic() - since < quiet:
        assert time.monotonic() < deadline, "summary calls kept coming"
        time.sleep(0.1)
        if len(model.calls) != seen:
            seen, since = len(model.calls), time.monotonic()


def recalled(request: dict[str, Any]) -> list[str]:
    return [
        str(m["content"])
        for m in request["messages"]
        if str(m.get("content", "")).startswith("[Recalled context")
    ]


@pytest.fixture
def settings(upstream: MockUpstream, redis_url: str) -> Settings:
    return Settings(
        upstream=UpstreamSettings(base_url=upstream.base_url),
        redis_url=redis_url,
        summaries=True,
    )


@pytest.fixture
def gateway(settings: Settings) -> Iterator[GatewayServer]:
    with GatewayServer(settings) as server:
        yield server


def made(server: GatewayServer) -> int:
    return int(server.app.state.gateway.summaries.counts["made"])


def test_a_background_summary_does_not_hold_the_request_and_is_used_at_the_cut(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    model = SummaryModel(delay=2.0)
    upstream.handler = model
    scheduled = False
    for history in turns():
        started = time.monotonic()
        response = post(gateway.base_url, history, "background-1")
        elapsed = time.monotonic() - started
        summary = response.headers.get("x-contextgate-summary", "")
        if "prepare=scheduled" in summary and not scheduled:
            scheduled = True
            # The summary model takes 2 s; the request that scheduled it did not wait.
            assert elapsed < 1.5
            wait_until(lambda: made(gateway) == 1)
        if summary.split(",")[0] in ("prepared", "made", "fallback", "extended"):
            break
    assert scheduled
    assert summary.startswith("prepared")
    sent = chat_requests(upstream)[-1]
    (text,) = recalled(sent)
    assert model.goal in text
    assert len(model.calls) >= 1


def test_a_60_turn_session_makes_a_bounded_number_of_summary_calls(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    model = SummaryModel()
    upstream.handler = model
    session = long_session(60)
    assert len(session) == 60
    paths: list[str] = []
    for history in session:
        response = post(gateway.base_url, history, "session-60")
        paths.append(response.headers.get("x-contextgate-summary", ""))
        # Let background work finish between turns, as a user's think time would.
        wait_until(lambda: not gateway.app.state.gateway.summaries.busy)
    kinds = [p.split(",")[0] for p in paths]
    used = [k in ("prepared", "reused", "extended") for k in kinds]
    assert sum(used) >= 20  # summaries stood in for the old turns on many requests
    assert "made" not in kinds  # no request waited for one
    assert 1 <= len(model.calls) <= 8  # not one per turn
    sent = chat_requests(upstream)
    assert len(sent) == 60
    for request, summarised in zip(sent, used, strict=True):
        assert len(recalled(request)) == (1 if summarised else 0)


def test_a_summary_past_its_deadline_leaves_the_notes(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    model = SummaryModel(delay=5.0)
    upstream.handler = model
    history = turns()[-1]
    started = time.monotonic()
    response = post(gateway.base_url, history, "deadline-1", f"{POLICY}, summary-timeout=0.5")
    assert time.monotonic() - started < 4.0
    assert response.headers["x-contextgate-summary"].startswith("fallback")
    sent = chat_requests(upstream)[-1]
    assert recalled(sent) == []
    assert any(str(m.get("content", "")).startswith("[Context note:") for m in sent["messages"])


def test_a_summary_model_overflow_drops_tool_outputs_until_it_fits(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    def overflows(body: dict[str, Any]) -> bool:
        """Too long while any tool output is left in the transcript."""
        transcript = body["messages"][-1]["content"]
        return re.search(r"^\[tool\] (?!\[Tool output omitted)", transcript, re.M) is not None

    model = SummaryModel(overflows=overflows)
    upstream.handler = model
    response = post(gateway.base_url, turns()[-1], "overflow-1")
    assert response.headers["x-contextgate-summary"].startswith("made")
    # Asked with 0, 10, 20, 50 and 100% of the tool outputs dropped; the last one fits.
    assert len(model.calls) == 5
    (text,) = recalled(chat_requests(upstream)[-1])
    assert model.goal in text


def test_a_non_english_conversation_is_summarised_in_its_language(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """A Spanish support conversation with ids and amounts: the summary model is told to
    write in the user's language and gets the Spanish turns; the Spanish summary it
    writes, keeping every id, is accepted at once and stands in for the old turns."""
    model = SummaryModel(goal="El usuario quiere cambiar la reserva ABC123 al vuelo IB6251.")
    upstream.handler = model
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "Eres un agente de atención al cliente de una aerolínea."},
        {"role": "user", "content": "Hola, quiero cambiar mi reserva ABC123."},
        {"role": "assistant", "content": "Claro. ¿A qué vuelo desea cambiarla?"},
    ]
    for turn in range(40):
        call = f"call_{turn:03d}"
        history += [
            {
                "role": "user",
                "content": f"¿Hay asientos en el vuelo IB{6200 + turn} del día {turn % 28 + 1}?",
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call,
                        "type": "function",
                        "function": {
                            "name": "buscar_vuelo",
                            "arguments": json.dumps({"vuelo": f"IB{6200 + turn}"}),
                        },
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": call,
                "content": json.dumps(
                    {
                        "vuelo": f"IB{6200 + turn}",
                        "asientos_libres": turn % 7,
                        "precio_eur": 120 + turn,
                        "observaciones": "Salida desde Madrid-Barajas, terminal 4. " * 12,
                    },
                    ensure_ascii=False,
                ),
            },
            {
                "role": "assistant",
                "content": f"El vuelo IB{6200 + turn} tiene {turn % 7} asientos libres.",
            },
        ]
    history.append({"role": "user", "content": "Perfecto, cámbiela al IB6251, por favor."})
    response = post(gateway.base_url, history, "espanol-1")
    assert response.headers["x-contextgate-summary"].startswith("made")
    (call,) = model.calls  # every key entity kept: accepted at the first attempt
    instructions = call["messages"][0]["content"]
    assert "language the user writes in" in instructions
    assert "¿Hay asientos en el vuelo IB6200" in call["messages"][-1]["content"]
    (text,) = recalled(chat_requests(upstream)[-1])
    assert "El usuario quiere cambiar la reserva ABC123 al vuelo IB6251." in text
    assert "IB6200" in text


def test_shutdown_cancels_background_summaries_and_releases_their_locks(
    settings: Settings, upstream: MockUpstream, redis_url: str
) -> None:
    model = SummaryModel(delay=30.0)
    upstream.handler = model
    server = GatewayServer(settings)
    with server:
        for history in turns():
            response = post(server.base_url, history, "shutdown-1")
            if "prepare=scheduled" in response.headers.get("x-contextgate-summary", ""):
                break
        wait_until(lambda: len(model.calls) == 1)
        client = redis.Redis.from_url(redis_url)
        locks = [k for k in client.scan_iter("cg:{c:*:client:shutdown-1}:lock")]
        assert len(locks) == 1
        started = time.monotonic()
    assert time.monotonic() - started < 8.0
    assert client.exists(*locks) == 0


def replica_config(upstream: MockUpstream, redis_url: str) -> str:
    return f"upstream:\n  base_url: {upstream.base_url}\nredis_url: {redis_url}\nsummaries: true\n"


def test_two_replicas_share_a_prepared_summary_and_make_one_for_concurrent_requests(
    upstream: MockUpstream, redis_url: str
) -> None:
    """A summary one replica prepared is sent by the other at the cut, which asks the
    summary model nothing; two replicas asked at once for a new cut make one summary."""
    model = SummaryModel(delay=1.0)
    upstream.handler = model
    config = replica_config(upstream, redis_url)
    with (
        tempfile.TemporaryDirectory() as workdir,
        ServeProcess(config, workdir) as first,
        ServeProcess(config, workdir) as second,
    ):
        # Prepared on the first replica, used by the second at the cut with no new call.
        history = turns()
        index = 0
        for request in history:
            index += 1
            response = post(first.base_url, request, "replicas-1", REPLICA_POLICY)
            if "prepare=scheduled" in response.headers.get("x-contextgate-summary", ""):
                break
        else:
            pytest.fail("the first replica never prepared a summary")
        settle(model)  # the summary model answers after 1 s; then it is stored
        assert len(model.calls) == 1
        path = ""
        for request in history[index:]:
            response = post(second.base_url, request, "replicas-1", REPLICA_POLICY)
            path = response.headers.get("x-contextgate-summary", "").split(",")[0]
            if path:
                break
        assert path == "prepared"  # used as prepared: no summary made for this request
        assert len(model.calls) == 1  # nor any by the second replica before the cut
        (text,) = recalled(chat_requests(upstream)[-1])
        assert model.goal in text

        # Two requests of a new conversation, already past the cut, at once on both,
        # once the background work the first conversation scheduled is done.
        settle(model)
        upstream.reset()
        upstream.handler = model = SummaryModel(delay=1.0)
        last = history[-1]
        with ThreadPoolExecutor(2) as pool:
            answers = list(
                pool.map(
                    lambda base: post(base, last, "replicas-2"),
                    [first.base_url, second.base_url],
                )
            )
        paths = sorted(a.headers["x-contextgate-summary"].split(",")[0] for a in answers)
        assert len(model.calls) == 1
        assert paths == ["made", "prepared"] or paths == ["made", "made"]
        sent = chat_requests(upstream)
        assert len(sent) == 2
        assert recalled(sent[0]) == recalled(sent[1])
        assert len(recalled(sent[0])) == 1


def test_summaries_stay_out_of_truncate_mode(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    model = SummaryModel()
    upstream.handler = model
    response = post(gateway.base_url, turns()[-1], "truncate-1", f"{POLICY}, mode=truncate")
    assert "x-contextgate-summary" not in response.headers
    assert model.calls == []
    assert re.search(r"\[Context note:", str(chat_requests(upstream)[-1]))


def test_a_dry_run_asks_no_model_for_a_summary(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    model = SummaryModel()
    upstream.handler = model
    response = httpx.post(
        f"{gateway.base_url}/context/compact",
        json={"model": "gpt-4o", "messages": turns()[-1]},
        headers={"authorization": "Bearer sk-test", "x-contextgate-policy": POLICY},
        timeout=30,
    )
    assert response.status_code == 200
    stages = {s["name"]: s for s in response.json()["report"]["stages"]}
    assert stages["summarize"]["details"]["path"] == "fallback: a dry run makes no summary"
    time.sleep(0.3)  # a background call, if one were scheduled, would have gone out
    assert upstream.received == []


def summary_reply(kind: str) -> Callable[[Received], JSONReply]:
    """A summary model that answers every summary call the same way (``kind``)."""
    fields = {n: ([] if n in LIST_FIELDS else "") for n in FIELDS}
    replies = {
        "invalid JSON": JSONReply(chat_completion("{not json")),
        "missing fields": JSONReply(chat_completion(orjson.dumps({"user_goal": "x"}).decode())),
        "an error": JSONReply({"error": {"message": "overloaded", "type": "server_error"}}, 503),
        "too slow": JSONReply(chat_completion(orjson.dumps(fields).decode()), delay=5.0),
    }

    def answer(received: Received) -> JSONReply:
        if "response_format" not in received.json():
            return JSONReply(chat_completion("ok"))
        return replies[kind]

    return answer


@pytest.mark.parametrize("kind", ["invalid JSON", "missing fields", "an error", "too slow"])
def test_every_failing_summary_gives_a_valid_request_with_the_notes(
    gateway: GatewayServer, upstream: MockUpstream, kind: str
) -> None:
    upstream.handler = summary_reply(kind)
    started = time.monotonic()
    response = post(
        gateway.base_url,
        turns()[-1],
        "failing-" + kind.replace(" ", "-"),
        f"{POLICY}, summary-timeout=1",
    )
    assert time.monotonic() - started < 4.0
    assert response.headers["x-contextgate-summary"].startswith("fallback")
    sent = chat_requests(upstream)
    assert len(sent) == 1
    assert_valid_request(sent[0])
    assert recalled(sent[0]) == []
    assert any(str(m.get("content", "")).startswith("[Context note:") for m in sent[0]["messages"])


def test_a_summary_model_too_small_for_the_span_gives_way_to_the_main_model(
    upstream: MockUpstream, redis_url: str
) -> None:
    settings = Settings(
        upstream=UpstreamSettings(base_url=upstream.base_url),
        redis_url=redis_url,
        models=(ModelInfo("tiny-summarizer", 1_500, 200),),
    )
    model = SummaryModel()
    upstream.handler = model
    with GatewayServer(settings) as server:
        policy = f"{POLICY}, summary-model=tiny-summarizer"
        response = post(server.base_url, turns()[-1], "tiny-1", policy)
    assert response.headers["x-contextgate-summary"].startswith("made")
    assert [call["model"] for call in model.calls] == ["gpt-4o"]
    (sent,) = chat_requests(upstream)
    assert_valid_request(sent)
    assert len(recalled(sent)) == 1


def replay_until_summarised(
    base_url: str,
    history: list[list[dict[str, Any]]],
    conversation: str,
    busy: Callable[[], bool] = lambda: False,
) -> str:
    """Replay ``history`` turn by turn, letting background summaries finish between
    turns, up to the first request that carries a summary; its path."""
    for request in history:
        response = post(base_url, request, conversation)
        path = response.headers.get("x-contextgate-summary", "").split(",")[0]
        if path in ("prepared", "reused", "extended", "made"):
            return path
        wait_until(lambda: not busy())
    return ""


def test_an_edited_history_gets_summaries_of_its_own(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """The client edits an early turn and carries on under the same conversation id:
    the checkpoints of the first version (prepared far ahead by then) do not apply, their
    hash chain differs, and are not passed off as the new version's; it gets its own."""
    model = SummaryModel()
    upstream.handler = model
    service = gateway.app.state.gateway.summaries
    for history in turns():
        post(gateway.base_url, history, "edited-1")
        wait_until(lambda: not service.busy)

    def edited(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
        copy = [dict(m) for m in history]
        index = next(i for i in range(3, len(copy)) if copy[i]["role"] == "user")
        copy[index]["content"] = str(copy[index]["content"]) + " My member id is EDITED999."
        return copy

    later = [h for h in turns() if sum(m["role"] == "user" for m in h[3:]) > 0]
    edits = [edited(h) for h in later]
    assert replay_until_summarised(gateway.base_url, edits, "edited-1", lambda: service.busy)
    (text,) = recalled(chat_requests(upstream)[-1])
    assert "EDITED999" in text


def test_a_checkpoint_whose_originals_are_gone_is_not_used(
    upstream: MockUpstream, redis_url: str
) -> None:
    """Redis lost the stored originals (a restart without persistence; the epoch goes
    with them) after a prepared summary went out. The same request again once the cache
    has lapsed: the checkpoint is not sent again naming refs that are gone; a new summary
    is made, and every ref it lists restores."""
    settings = Settings(
        upstream=UpstreamSettings(base_url=upstream.base_url),
        redis_url=redis_url,
        models=(ModelInfo("gpt-4o", 128_000, 16_384, "openai", "none", cache_ttl=1),),
    )
    model = SummaryModel()
    upstream.handler = model
    policy = f"{POLICY}, soft-ratio=1.0, hard-ratio=1.0"  # no cache-TTL prune
    with GatewayServer(settings) as gateway:
        service = gateway.app.state.gateway.summaries
        last: list[dict[str, Any]] = []
        for last in turns():
            response = post(gateway.base_url, last, "lost-1", policy)
            if response.headers.get("x-contextgate-summary", "").startswith("prepared"):
                break
            wait_until(lambda: not service.busy)
        else:
            pytest.fail("no prepared summary was used")
        wait_until(lambda: not service.busy)
        client = redis.Redis.from_url(redis_url)
        client.delete(*client.scan_iter("cg:o:*"), b"cg:epoch")
        client.close()
        time.sleep(1.5)  # past the cache TTL: no hot-cache bypass
        response = post(gateway.base_url, last, "lost-1", policy)
        assert response.headers["x-contextgate-summary"].startswith("made")
        (text,) = recalled(chat_requests(upstream)[-1])
        refs = re.findall(r"ctx_[A-Za-z0-9_-]{22,}", text.rsplit("\n", 1)[-1])
        assert refs
        for ref in refs:
            restored = httpx.get(
                f"{gateway.base_url}/context/objects/{ref}",
                headers={"authorization": "Bearer sk-test"},
            )
            assert restored.status_code == 200
