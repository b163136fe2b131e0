"""The restore tool's arrival: ``from_start`` against ``when_needed``, billed on Claude's cache.

    .venv/bin/python -m bench.restore_tool [--trajectories 200] [--output docs/BENCHMARKS.md]

The gateway adds its ``context_restore`` tool to a conversation's ``tools`` either from the
conversation's first request (``Settings.restore_tool = "from_start"``) or from the first
request whose outgoing body names an offloaded object (``"when_needed"``), which changes
the tools, the first thing Anthropic's prompt cache reads, mid-conversation. Two gateways,
one per setting, in front of one mock Anthropic upstream on loopback, in one run:

- tau-bench airline trajectories replayed as an Anthropic client sends them (the whole
  history each time, 5 seconds between turns, one function tool per tool the trajectory
  calls, the same list on every request) through ``POST /v1/messages``, each session
  billed on a prompt cache of its own (``bench.prompt_cache``), at the model's own budget
  and at ``max-input`` 8,000;
- if it is installed (``make agents``), Claude Code itself, eight turns of tool use with
  large outputs (``claude -p``, ``--session-id`` then ``--resume``) under ``max-input``
  30,000, against ``tests.mock_models.ClaudeModel``, which bills on its own cache and drops
  thinking blocks whose prefix changed.

Cost is input only, in dollars at Sonnet prices (``bench.prompt_cache.cost``); token counts
are o200k's, a proxy for Claude's tokenizer.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx
import orjson

from bench.cache import Bill
from bench.compaction import requests_of
from bench.prompt_cache import PrefixCache
from bench.report import publish
from gateway.codecs.chat_anthropic import to_messages
from gateway.config import AnthropicSettings, Settings, UpstreamSettings
from gateway.context.restore import RESTORE_TOOL_NAME
from pipelines import TokenCounter
from tests.harness import GatewayServer
from tests.mock_models import ClaudeModel
from tests.mock_upstream import JSONReply, MockUpstream, Received, Reply

ROOT: Final = Path(__file__).resolve().parent.parent
DATA: Final = ROOT / "bench" / "data" / "tau-bench-gpt-4o-airline.json"
CLAUDE: Final = ROOT / ".tools" / "agents" / "node_modules" / ".bin" / "claude"
MARKERS: Final = ("<!-- restore-tool:start -->", "<!-- restore-tool:end -->")
MODEL: Final = "claude-sonnet-4-6"
TURN_GAP_S: Final = 5.0
SETTINGS: Final = ("from_start", "when_needed")
PROMPTS: Final = (
    "RUN: seq 1 1500\nRUN: seq 2 1500",
    "RUN: seq 1 4000\nRUN: seq 3 1500",
    "RUN: seq 4 1500\nRUN: seq 5 1500",
    "RUN: seq 6 1500",
    "RUN: seq 2 4000\nRUN: seq 7 1500",
    "RUN: seq 8 1500\nRUN: seq 9 1500",
    "RUN: seq 10 1500",
    "RUN: echo last",
)
"""Claude Code's eight user turns: each ``seq K 1500`` output ~3,500 tokens, each
``seq K 4000`` over the filter's 5,000 (offloaded, so a ref goes up from that turn on)."""


@dataclass
class Tally:
    """What one setting cost over a workload, and when its sessions got the tool."""

    bill: Bill = field(default_factory=Bill)
    requests: int = 0
    sessions: int = 0
    tooled: int = 0
    """Sessions whose requests carried the restore tool at some point."""
    late: int = 0
    """Sessions that got it after their first request (their tools changed)."""
    arrivals: list[int] = field(default_factory=list)
    """Per tooled session, the 1-based request at which the tool first went up."""
    dropped: int = 0
    """Thinking blocks the upstream dropped (their prefix changed); Claude Code only."""

    def session(self, usages: list[dict[str, int]], tools: list[bool]) -> None:
        """Count one session: each request's usage and whether it carried the tool."""
        self.sessions += 1
        self.requests += len(usages)
        self.bill.sessions.append(sum(self.bill.add(usage) for usage in usages))
        if any(tools):
            first = tools.index(True)
            self.tooled += 1
            self.late += first > 0
            self.arrivals.append(first + 1)


class Upstream:
    """The mock's side of the replays: each request billed on the session's own cache, on
    a simulated clock, and whether it carried the restore tool."""

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self.cache = PrefixCache(counter)
        self.now = 0.0
        self.usages: list[dict[str, int]] = []
        self.tools: list[bool] = []

    def start_session(self) -> None:
        self.cache, self.now, self.usages, self.tools = PrefixCache(self.counter), 1e6, [], []

    def answer(self, received: Received) -> Reply:
        request = received.json()
        usage = self.cache.usage(request, self.now)
        self.usages.append(usage)
        self.tools.append(carries_tool(request))
        message = {
            "id": "msg_bench",
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": [{"type": "text", "text": "OK."}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {**usage, "output_tokens": 2},
        }
        return JSONReply(message)


def carries_tool(request: dict[str, Any]) -> bool:
    return any(tool.get("name") == RESTORE_TOOL_NAME for tool in request.get("tools") or ())


def tools_of(trajectory: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One function tool per tool the trajectory's assistant calls, with a string
    parameter per argument key seen, in order of first call: a client's stable tools."""
    keys: dict[str, dict[str, None]] = {}
    for message in trajectory:
        for call in message.get("tool_calls") or ():
            function = call["function"]
            arguments = json.loads(function.get("arguments") or "{}")
            seen = keys.setdefault(function["name"], {})
            seen.update(dict.fromkeys(arguments if isinstance(arguments, dict) else ()))
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": f"The airline's {name.replace('_', ' ')}.",
                "parameters": {
                    "type": "object",
                    "properties": {key: {"type": "string"} for key in seen},
                },
            },
        }
        for name, seen in keys.items()
    ]


def replay(
    trajectories: list[Any],
    gateways: dict[str, GatewayServer],
    upstream: Upstream,
    max_input: int | None,
) -> dict[str, Tally]:
    """Every trajectory through each setting's gateway, session after session."""
    tallies = {setting: Tally() for setting in SETTINGS}
    clients = {s: httpx.Client(base_url=g.url, timeout=60) for s, g in gateways.items()}
    policy = {} if max_input is None else {"x-contextgate-policy": f"max-input={max_input}"}
    try:
        for number, trajectory in enumerate(trajectories):
            tools = tools_of(trajectory["traj"])
            for setting in SETTINGS:
                upstream.start_session()
                headers = {
                    "x-api-key": "sk-ant-bench",
                    "content-type": "application/json",
                    "x-contextgate-conversation": f"{setting}-{max_input}-{number}",
                    **policy,
                }
                for history in requests_of(trajectory["traj"]):
                    upstream.now += TURN_GAP_S
                    response = clients[setting].post(
                        "/v1/messages",
                        content=orjson.dumps(client_request(history, tools)),
                        headers=headers,
                    )
                    if response.is_error:
                        raise SystemExit(f"{response.status_code}: {response.text[:500]}")
                tallies[setting].session(upstream.usages, upstream.tools)
    finally:
        for client in clients.values():
            client.close()
    return tallies


def client_request(history: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The Messages request an Anthropic client sends for ``history`` with ``tools``."""
    body = {"model": MODEL, "messages": history, **({"tools": tools} if tools else {})}
    return to_messages(body, default_max_tokens=1_024)


def claude_code(gateway: GatewayServer, upstream: MockUpstream) -> tuple[Tally, ClaudeModel]:
    """Claude Code's eight turns through ``gateway``, against a fresh ``ClaudeModel``."""
    model = ClaudeModel()
    upstream.handler = model
    conversation = str(uuid.uuid4())
    with tempfile.TemporaryDirectory() as temp:
        home, workdir = Path(temp, "home"), Path(temp, "work")
        home.mkdir()
        workdir.mkdir()
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "ANTHROPIC_BASE_URL": gateway.url,
            "ANTHROPIC_API_KEY": "sk-ant-test",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "ANTHROPIC_CUSTOM_HEADERS": "x-contextgate-policy: max-input=30000",
        }
        for number, prompt in enumerate(PROMPTS):
            session = ["--session-id" if number == 0 else "--resume", conversation]
            done = subprocess.run(
                [str(CLAUDE), "-p", prompt, "--allowedTools", "Bash", *session],
                env=env,
                cwd=workdir,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            if done.returncode != 0 or "Done after" not in done.stdout:
                raise SystemExit(f"Claude Code, turn {number + 1}: {done.stdout[-1_000:]}")
    tally = Tally(dropped=sum(model.dropped))
    tally.session(model.usages, [carries_tool(request) for request in model.requests])
    return tally, model


def table(tallies: dict[str, Tally], extra: bool = False) -> list[str]:
    """One row per setting; ``extra``: the thinking blocks dropped too."""
    head = (
        "| setting | requests | sessions with the tool | of which it arrived mid-session |"
        " tool from request (median) | read from cache | written to cache | uncached |"
        " cost | vs when_needed |"
    )
    rule = "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    if extra:
        head, rule = head + " thinking blocks dropped (summed over requests) |", rule + "---:|"
    lines = [head, rule]
    base = sum(tallies["when_needed"].bill.sessions)
    for setting, tally in tallies.items():
        bill, total = tally.bill, sum(tally.bill.sessions)
        arrivals = sorted(tally.arrivals)
        arrival = f"{arrivals[len(arrivals) // 2]}" if arrivals else "-"
        row = (
            f"| {setting} | {tally.requests:,} | {tally.tooled} of {tally.sessions} |"
            f" {tally.late} | {arrival} | {bill.read:,} | {bill.written:,} | {bill.uncached:,} |"
            f" ${total:.4f} | {total / base:.3f}x |"
        )
        lines.append(row + (f" {tally.dropped} |" if extra else ""))
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trajectories", type=int, default=200)
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "BENCHMARKS.md")
    parser.add_argument("--no-claude-code", action="store_true", help="tau-bench only")
    args = parser.parse_args()
    trajectories = json.loads(DATA.read_text())[: args.trajectories]
    upstream = Upstream(TokenCounter("o200k_base"))
    lines: list[str] = []
    with MockUpstream(record=False) as mock:
        gateways = {
            setting: GatewayServer(
                Settings(
                    upstream=UpstreamSettings(base_url=mock.base_url),
                    anthropic=AnthropicSettings(base_url=mock.base_url.removesuffix("/v1")),
                    summaries=False,
                    restore_tool=setting,
                )
            )
            for setting in SETTINGS
        }
        for gateway in gateways.values():
            gateway.__enter__()
        try:
            for max_input, title in (
                (None, "tau-bench airline at the model's budget (no compaction)"),
                (8_000, "tau-bench airline at max-input 8,000 (compaction events)"),
            ):
                mock.handler = upstream.answer
                tallies = replay(trajectories, gateways, upstream, max_input)
                lines += [f"{title}, {len(trajectories)} sessions per setting:", ""]
                lines += table(tallies)
            if CLAUDE.exists() and not args.no_claude_code:
                runs = {s: claude_code(g, mock) for s, g in gateways.items()}
                models = sorted({str(r["model"]) for _, m in runs.values() for r in m.requests})
                lines += [
                    f"Claude Code ({', '.join(models)} by default; mock `ClaudeModel`),"
                    f" {len(PROMPTS)} turns under max-input 30,000, one session per setting:",
                    "",
                ]
                lines += table({s: tally for s, (tally, _) in runs.items()}, extra=True)
                refused = sum(len(model.refusals) for _, model in runs.values())
                lines.append(f"Requests the mock Claude refused: {refused}.")
            elif not args.no_claude_code:
                lines.append(f"Claude Code not run (not installed at {CLAUDE}: `make agents`).")
        finally:
            for gateway in gateways.values():
                gateway.__exit__(None, None, None)
    how = (
        f"`.venv/bin/python -m bench.restore_tool --trajectories {len(trajectories)}`"
        f" (tau-bench airline through `POST /v1/messages` as {MODEL}, each session on its own"
        " cache; token counts are o200k, a proxy for Claude's tokenizer; cost counts input"
        " only, in dollars at Sonnet prices)."
    )
    publish(args.output, MARKERS, "## The restore tool's arrival", how, lines)


if __name__ == "__main__":
    main()
