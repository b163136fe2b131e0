"""Prompt caching on Claude: what contextgate's cache markers save, against no markers and
against one marker on the system prompt (what a careful client does by hand).

    python -m bench.cache [--trajectories 200] [--output docs/BENCHMARKS.md]

Every tau-bench airline trajectory is replayed request by request, as an Anthropic client
sends it (the whole history each time, 5 seconds between turns), through the gateway's
``POST /v1/messages`` to a mock Anthropic upstream on loopback that bills each request as
Anthropic's prompt cache would (``bench.prompt_cache``: breakpoints, a 20-block lookback,
a 1,024-token minimum, 5-minute entries renewed on use). Three ways to send:

- ``contextgate``: the client marks nothing; the gateway's ``cache_markers`` stage does;
- ``no markers``: nobody marks anything (``x-contextgate-policy: cache-markers=?0``);
- ``system only``: the client marks its system prompt, the gateway adds nothing.

Each at the model's own budget (no compaction on these sessions) and at ``max-input``
8,000 (compaction events happen). The cache is billed two ways: each session on a cache of
its own, and all sessions in turn on one shared cache (a fleet of agents with the same
system prompt). Cost is at Claude Sonnet prices: input $3, cache writes $3.75, cache reads
$0.30 per million tokens (output left out: the same for every method); "vs no markers"
compares the cost of all sessions.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.compaction import requests_of
from bench.prompt_cache import PrefixCache, cost
from bench.report import publish
from gateway.codecs.chat_anthropic import to_messages
from gateway.config import AnthropicSettings, Settings, UpstreamSettings
from pipelines import TokenCounter
from tests.harness import GatewayServer
from tests.mock_upstream import JSONReply, MockUpstream, Received, Reply

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "bench" / "data" / "tau-bench-gpt-4o-airline.json"
MARKERS = ("<!-- cache:start -->", "<!-- cache:end -->")
MODEL = "claude-sonnet-4-6"
TURN_GAP_S = 5.0
METHODS = ("contextgate", "no markers", "system only")


@dataclass
class Bill:
    """Tokens billed to one method over a replay, by kind, and cost per session."""

    read: int = 0
    written: int = 0
    uncached: int = 0
    sessions: list[float] = field(default_factory=list)

    def add(self, usage: dict[str, int]) -> float:
        self.read += usage["cache_read_input_tokens"]
        self.written += usage["cache_creation_input_tokens"]
        self.uncached += usage["input_tokens"]
        return cost(usage)

    @property
    def total(self) -> int:
        return self.read + self.written + self.uncached


@dataclass
class Billing:
    """The mock's side: one request's usage on the session's own cache (returned to the
    gateway) and on the fleet's shared cache."""

    counter: TokenCounter
    now: float = 0.0
    own: PrefixCache | None = None
    shared: PrefixCache | None = None
    last_shared: dict[str, int] = field(default_factory=dict)
    markers: list[int] = field(default_factory=list)

    def answer(self, received: Received) -> Reply:
        request = received.json()
        assert self.own is not None
        assert self.shared is not None
        usage = self.own.usage(request, self.now)
        self.last_shared = self.shared.usage(request, self.now)
        self.markers.append(received.body.count(b'"cache_control"'))
        return JSONReply(
            {
                "id": "msg_bench",
                "type": "message",
                "role": "assistant",
                "model": MODEL,
                "content": [{"type": "text", "text": "OK."}],
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": {**usage, "output_tokens": 2},
            }
        )


def client_request(history: list[dict[str, Any]], method: str) -> dict[str, Any]:
    """The Messages request an Anthropic client sends for ``history``."""
    request = to_messages({"model": MODEL, "messages": history}, default_max_tokens=1_024)
    if method == "system only":
        request["system"][-1]["cache_control"] = {"type": "ephemeral"}
    return request


def replay(
    trajectories: list[Any], gateway: GatewayServer, billing: Billing, max_input: int | None
) -> dict[str, tuple[Bill, Bill]]:
    """Every trajectory by every method; per method the bills on own and shared caches."""
    bills = {method: (Bill(), Bill()) for method in METHODS}
    with httpx.Client(base_url=gateway.url, timeout=60) as http:
        for method in METHODS:
            own_bill, shared_bill = bills[method]
            billing.shared = PrefixCache(billing.counter)
            billing.now = 1_000_000.0
            for number, trajectory in enumerate(trajectories):
                billing.own = PrefixCache(billing.counter)
                policy = [] if method == "contextgate" else ["cache-markers=?0"]
                if max_input is not None:
                    policy.append(f"max-input={max_input}")
                conversation = f"{method}-{max_input}-{number}".replace(" ", "-")
                headers = {
                    "x-api-key": "sk-ant-bench",
                    "x-contextgate-conversation": conversation,
                    "x-contextgate-policy": ", ".join(policy),
                }
                own_cost = shared_cost = 0.0
                for history in requests_of(trajectory["traj"]):
                    billing.now += TURN_GAP_S
                    response = http.post(
                        "/v1/messages",
                        content=orjson.dumps(client_request(history, method)),
                        headers={**headers, "content-type": "application/json"},
                    )
                    if response.is_error:
                        raise SystemExit(f"{response.status_code}: {response.text[:500]}")
                    own_cost += own_bill.add(response.json()["usage"])
                    shared_cost += shared_bill.add(billing.last_shared)
                own_bill.sessions.append(own_cost)
                shared_bill.sessions.append(shared_cost)
    return bills


def table(title: str, bills: dict[str, tuple[Bill, Bill]]) -> list[str]:
    lines = [
        title,
        "",
        "| method | input tokens billed | read from cache | written to cache |"
        " cost per session (median) | all sessions | vs no markers | shared cache: read |"
        " shared: cost per session (median) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = sum(bills["no markers"][0].sessions)
    for method, (own, shared) in bills.items():
        median, total = statistics.median(own.sessions), sum(own.sessions)
        lines.append(
            f"| {method} | {own.total:,} | {own.read / own.total:.1%} |"
            f" {own.written / own.total:.1%} | ${median:.4f} | ${total:.2f} |"
            f" {total / base:.2f}x |"
            f" {shared.read / shared.total:.1%} |"
            f" ${statistics.median(shared.sessions):.4f} |"
        )
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trajectories", type=int, default=200)
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "BENCHMARKS.md")
    args = parser.parse_args()
    trajectories = json.loads(DATA.read_text())[: args.trajectories]
    billing = Billing(TokenCounter("o200k_base"))
    lines: list[str] = []
    with MockUpstream(record=False) as upstream:
        upstream.handler = billing.answer
        settings = Settings(
            upstream=UpstreamSettings(base_url=upstream.base_url),
            anthropic=AnthropicSettings(base_url=upstream.base_url.removesuffix("/v1")),
            summaries=False,
        )
        with GatewayServer(settings) as gateway:
            for max_input, title in (
                (None, "At the model's budget (no compaction)"),
                (8_000, "At max-input 8,000 (compaction events)"),
            ):
                bills = replay(trajectories, gateway, billing, max_input)
                requests = sum(len(requests_of(t["traj"])) for t in trajectories)
                lines += table(f"{title}, {requests:,} requests per method:", bills)
    lines.append(
        f"Markers in what the upstream received: at most {max(billing.markers)} per request"
        f" (over {len(billing.markers):,} requests)."
    )
    how = (
        f"`python -m bench.cache --trajectories {len(trajectories)}` (tau-bench airline"
        f" through `POST /v1/messages` as {MODEL}; token counts are o200k, a proxy for"
        " Claude's tokenizer; cost counts input only, in dollars at Sonnet prices)."
    )
    publish(args.output, MARKERS, "## Prompt caching on Claude (`make bench`)", how, lines)


if __name__ == "__main__":
    main()
