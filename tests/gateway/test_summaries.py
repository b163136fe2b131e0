"""Summaries through the gateway (``summaries: true``): the request that compacts asks the
mock upstream, playing the summary model, for the checkpoint and sends the summary in
place of the compacted span; the next request of the conversation reuses it, no call."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from bench.compaction import requests_of
from gateway.settings import Settings, UpstreamSettings
from pipelines.summary import FIELDS, LIST_FIELDS
from tests.harness import GatewayServer
from tests.mock_upstream import JSONReply, MockUpstream, chat_completion

TRACES = Path(__file__).resolve().parents[2] / "bench" / "data" / "tau-bench-gpt-4o-airline.json"
SUMMARY = {n: ([] if n in LIST_FIELDS else "") for n in FIELDS} | {
    "user_goal": "El usuario quiere cambiar su reserva.",
    "completed_actions": ["Reserva consultada."],
}


@pytest.fixture
def gateway(upstream: MockUpstream) -> Iterator[GatewayServer]:
    settings = Settings(upstream=UpstreamSettings(base_url=upstream.base_url), summaries=True)
    with GatewayServer(settings) as server:
        yield server


def test_the_compacting_request_carries_a_summary_and_the_next_reuses_it(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    summary_calls: list[dict[str, Any]] = []

    def script(received: Any) -> JSONReply:
        body = received.json()
        if "response_format" in body:
            summary_calls.append(body)
            return JSONReply(chat_completion(orjson.dumps(SUMMARY).decode()))
        return JSONReply(chat_completion("ok"))

    upstream.handler = script
    trajectory = max(json.loads(TRACES.read_text()), key=lambda t: len(t["traj"]))
    history = requests_of(trajectory["traj"])[-1]
    headers = {
        "authorization": "Bearer sk-test",
        "x-contextgate-policy": "max-input=6000",
        "x-contextgate-conversation": "summary-1",
    }
    counts = []
    for _ in range(2):
        response = httpx.post(
            f"{gateway.base_url}/chat/completions",
            json={"model": "gpt-4o", "messages": history},
            headers=headers,
            timeout=30,
        )
        assert response.status_code == 200
        counts.append(len(summary_calls))
    # The first request asked (retrying while the scripted summary kept too few of the
    # key entities, then keeping the best); the second reused the checkpoint.
    assert 1 <= counts[0] <= 3
    assert counts[1] == counts[0]
    assert summary_calls[0]["response_format"]["type"] == "json_schema"
    sent = [r.json() for r in upstream.received if "response_format" not in r.json()]
    assert len(sent) == 2
    assert sent[0]["messages"] == sent[1]["messages"]
    recalled = [m for m in sent[0]["messages"] if str(m.get("content", "")).startswith("[Recalled")]
    assert len(recalled) == 1
    assert "El usuario quiere cambiar su reserva." in recalled[0]["content"]
