"""POST /v1/context/compact: the pipeline as a dry run."""

from __future__ import annotations

import httpx

from pipelines import STAGE_NAMES, TokenCounter
from tests.harness import GatewayServer
from tests.mock_upstream import MockUpstream

REQUEST = {
    "model": "gpt-4.1",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Summarise the plan."},
    ],
    "max_completion_tokens": 1000,
    "metadata": {"team": "search"},
}


def test_dry_run_returns_request_and_report(gateway: GatewayServer, upstream: MockUpstream) -> None:
    """The dry run returns the request that would be sent and a report of every stage, in
    pipeline order, and calls no upstream."""
    response = httpx.post(
        f"{gateway.base_url}/context/compact",
        json=REQUEST,
        headers={"x-contextgate-policy": "max-input=50000"},
    )
    assert response.status_code == 200
    payload = response.json()
    assert payload["request"] == REQUEST
    report = payload["report"]
    assert [stage["name"] for stage in report["stages"]] == list(STAGE_NAMES)
    tokens = TokenCounter("o200k_base").count_messages(REQUEST["messages"])  # type: ignore[arg-type]
    assert report["tokens_before"] == report["tokens_after"] == tokens
    assert report["window"] == 1_047_576
    assert report["output_reserve"] == 1000
    assert report["budget"] == 50_000
    assert report["actions"] == []
    assert response.headers["x-contextgate-tokens"] == f"before={tokens}, after={tokens}"
    assert upstream.received == []


def test_dry_run_rejects_bad_body(gateway: GatewayServer) -> None:
    """The dry run checks the body like the chat route does."""
    response = httpx.post(f"{gateway.base_url}/context/compact", json={"model": "gpt-4o"})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "messages"


def test_cold_long_history_reports_estimate(gateway: GatewayServer) -> None:
    """A long history the gateway has not seen, far below every threshold, is reported as
    estimated in the tokens header and the report."""
    messages = [
        {"role": "user", "content": f"cold turn {i}: " + "lorem ipsum dolor " * 300}
        for i in range(20)
    ]
    response = httpx.post(
        f"{gateway.base_url}/context/compact", json={"model": "gpt-4.1", "messages": messages}
    )
    assert response.status_code == 200
    assert response.json()["report"]["exact"] is False
    assert response.headers["x-contextgate-tokens"].endswith(", estimated")
