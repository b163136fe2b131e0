"""GET /v1/context/conversations[/{id}[/requests/{request_id}]]: the ledger of what the
gateway did to each of the caller's conversations, seen by that caller and nobody else."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.config import AnthropicSettings, InspectorSettings, Settings, UpstreamSettings
from pipelines import ModelInfo, ModelPrice
from tests.conftest import settings_for
from tests.gateway.routes.test_objects import OUTPUT, history
from tests.harness import GatewayServer
from tests.mock_upstream import JSONReply, MockUpstream, chat_completion

KEY, OTHER = "sk-alice-ledger", "sk-bob-ledger"


@pytest.fixture
def memory_gateway(upstream: MockUpstream) -> Iterator[GatewayServer]:
    settings = settings_for(
        upstream,
        models=(ModelInfo("tiny-*", 6_000, 1_000),),
        prices=(ModelPrice("tiny-*", 1.0, 4.0, 0.1),),
    )
    with GatewayServer(settings) as server:
        yield server


def api(gateway: GatewayServer, path: str, key: str = KEY, **params: Any) -> httpx.Response:
    return httpx.get(
        f"{gateway.base_url}/context/conversations{path}",
        params=params,
        headers={"authorization": f"Bearer {key}"},
    )


def listed(gateway: GatewayServer, key: str = KEY, count: int = 1) -> dict[str, Any]:
    """The caller's conversation list once it holds ``count`` requests in all (the ledger is
    written after the answer, in the background)."""
    deadline = time.monotonic() + 5
    while True:
        body: dict[str, Any] = api(gateway, "", key).json()
        if sum(row["requests"] for row in body["data"]) >= count or time.monotonic() > deadline:
            return body
        time.sleep(0.02)


def chat(gateway: GatewayServer, upstream: MockUpstream, messages: Any, **extra: Any) -> None:
    upstream.push(JSONReply(chat_completion()))
    with openai.OpenAI(base_url=gateway.base_url, api_key=KEY, max_retries=0) as client:
        client.chat.completions.create(messages=messages, **{"model": "gpt-4o", **extra})


def test_an_offloaded_tool_output_is_in_the_ledger_with_its_ref(
    memory_gateway: GatewayServer, upstream: MockUpstream
) -> None:
    chat(memory_gateway, upstream, history(OUTPUT))
    body = listed(memory_gateway)
    assert body["object"] == "list"
    assert body["total"] == 1
    assert not body["has_more"]
    row = body["data"][0]
    assert row["requests"] == 1
    assert row["model"] == "gpt-4o"
    assert row["api"] == "chat"
    assert row["title"] == "Export the bookings."
    assert row["client_tokens"] > 10 * row["upstream_tokens"]
    # The mock reports 12 prompt tokens; gpt-4o has a list price: known, and saved.
    assert row["priced"] == 1
    assert row["cost_without"] > row["cost_with"] > 0

    conversation = api(memory_gateway, f"/{row['id']}").json()
    assert conversation["object"] == "conversation"
    assert conversation["entries"]["total"] == 1
    entry = conversation["entries"]["data"][0]
    assert entry["api"] == "chat"
    assert entry["status"] == 200
    assert entry["stream"] is False
    acted = [stage["name"] for stage in entry["stages"] if stage["changed"]]
    assert "filter" in acted
    (ref,) = entry["refs"]
    assert ref["kind"] == "tool output"
    assert ref["stage"] == "filter"
    assert ref["bytes"] == len(OUTPUT.encode())
    assert ref["replaced"] == f"tool message, {len(OUTPUT):,} characters"

    detail = api(memory_gateway, f"/{row['id']}/requests/{entry['id']}").json()["detail"]
    fates = [(message["role"], message["fate"]) for message in detail["messages"]]
    assert fates == [("user", "kept"), ("assistant", "kept"), ("tool", "offloaded")]
    tool = detail["messages"][2]
    assert tool["refs"] == [ref["ref"]]
    assert tool["client"]["chars"] == len(OUTPUT)
    assert tool["client"]["text"] == OUTPUT[:300]
    # The ref shows the original bytes.
    original = httpx.get(
        f"{memory_gateway.base_url}/context/objects/{ref['ref']}",
        headers={"authorization": f"Bearer {KEY}"},
    )
    assert original.content == OUTPUT.encode()


def test_another_key_sees_nothing_of_it(
    memory_gateway: GatewayServer, upstream: MockUpstream
) -> None:
    chat(memory_gateway, upstream, history(OUTPUT))
    mine = listed(memory_gateway)["data"][0]
    theirs = api(memory_gateway, "", OTHER).json()
    assert theirs["data"] == []
    assert theirs["total"] == 0
    assert api(memory_gateway, f"/{mine['id']}", OTHER).status_code == 404
    request_id = api(memory_gateway, f"/{mine['id']}").json()["entries"]["data"][0]["id"]
    assert api(memory_gateway, f"/{mine['id']}/requests/{request_id}", OTHER).status_code == 404


def test_a_compaction_is_marked_and_an_unpriced_model_has_no_cost(
    memory_gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """A 6,000-token model: a long history is compacted; its price is configured, but
    the other model of the test has none."""
    turns: list[dict[str, Any]] = [{"role": "user", "content": "Plan the migration."}]
    for n in range(60):
        turns += [
            {"role": "assistant", "content": f"Step {n}: " + "checked the schema again. " * 12},
            {"role": "user", "content": f"Go on with step {n + 1}."},
        ]
    chat(memory_gateway, upstream, turns, model="tiny-1")
    chat(memory_gateway, upstream, [{"role": "user", "content": "Hi."}], model="unpriced-model")
    rows = listed(memory_gateway, count=2)["data"]
    by_model = {row["model"]: row for row in rows}
    tiny = by_model["tiny-1"]
    entry = api(memory_gateway, f"/{tiny['id']}").json()["entries"]["data"][0]
    assert entry["compaction"] is True
    assert tiny["compactions"] == 1
    assert entry["tokens"]["client"] > entry["thresholds"]["trigger"] == 3_500
    assert entry["tokens"]["upstream"] < entry["tokens"]["client"]
    compress = next(stage for stage in entry["stages"] if stage["name"] == "compress")
    assert compress["changed"]
    assert "level=full" in compress["note"]
    detail = api(memory_gateway, f"/{tiny['id']}/requests/{entry['id']}").json()["detail"]
    fates = {message["fate"] for message in detail["messages"]}
    assert {"kept", "pruned", "added"} <= fates
    assert entry["tokens"]["budget"] == 5_000
    assert entry["cost"]["with"] is not None
    unpriced = by_model["unpriced-model"]
    assert unpriced["priced"] == 0
    entry = api(memory_gateway, f"/{unpriced['id']}").json()["entries"]["data"][0]
    assert entry["cost"] == {"with": None, "without": None, "currency": "USD"}
    detail = api(memory_gateway, f"/{tiny['id']}/requests/{entry['id']}", KEY)
    assert detail.status_code == 404  # that request belongs to the other conversation


def test_paging_newest_first(memory_gateway: GatewayServer, upstream: MockUpstream) -> None:
    for n in range(3):
        chat(memory_gateway, upstream, [{"role": "user", "content": f"conversation {n}"}])
    first = listed(memory_gateway, count=3)
    assert [row["title"] for row in first["data"]] == [
        "conversation 2",
        "conversation 1",
        "conversation 0",
    ]
    page = api(memory_gateway, "", offset=1, limit=1).json()
    assert [row["title"] for row in page["data"]] == ["conversation 1"]
    assert page["total"] == 3
    assert page["has_more"] is True
    for bad in ({"limit": 0}, {"limit": 101}, {"offset": -1}, {"limit": "x"}):
        refused = api(memory_gateway, "", **bad)
        assert refused.status_code == 400
        assert refused.json()["error"]["code"] == "invalid_parameter"


def test_a_claude_answer_records_the_cache_it_read_and_wrote(upstream: MockUpstream) -> None:
    settings = Settings(
        upstream=UpstreamSettings(base_url=upstream.base_url),
        anthropic=AnthropicSettings(base_url=upstream.base_url.removesuffix("/v1")),
        summaries=False,
    )
    usage = {
        "input_tokens": 100,
        "cache_read_input_tokens": 3_000,
        "cache_creation_input_tokens": 400,
        "output_tokens": 20,
    }
    upstream.push(JSONReply(_claude_answer(usage)))
    with GatewayServer(settings) as gateway:
        client = anthropic.Anthropic(
            base_url=gateway.base_url.removesuffix("/v1"), api_key=KEY, max_retries=0
        )
        client.messages.create(
            model="claude-opus-4-5-20251101",
            max_tokens=100,
            messages=[{"role": "user", "content": "Read the logs."}],
        )
        row = listed(gateway)["data"][0]
        entry = api(gateway, f"/{row['id']}").json()["entries"]["data"][0]
    assert entry["api"] == "messages"
    assert entry["cache"]["cached"] == 3_000
    assert entry["cache"]["written"] == 400
    assert entry["cache"]["uncached"] == 100
    # Opus 4.5 list prices: $5 in, $0.50 cache read, $6.25 cache write, $25 out.
    expected = (100 * 5 + 3_000 * 0.50 + 400 * 6.25 + 20 * 25) / 1_000_000
    assert entry["cost"]["with"] == pytest.approx(expected)
    assert row["input_tokens"] == 3_500
    assert row["cached_tokens"] == 3_000


def _claude_answer(usage: dict[str, int]) -> dict[str, Any]:
    return {
        "id": "msg_ledger",
        "type": "message",
        "role": "assistant",
        "model": "claude-opus-4-5-20251101",
        "content": [{"type": "text", "text": "Read."}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": usage,
    }


def test_switched_off_nothing_is_kept_and_the_routes_are_404(upstream: MockUpstream) -> None:
    settings = settings_for(upstream, inspector=InspectorSettings(enabled=False))
    with GatewayServer(settings) as gateway:
        chat(gateway, upstream, history(OUTPUT))
        refused = api(gateway, "")
        assert refused.status_code == 404
        assert "inspector" in refused.json()["error"]["message"]
