"""Claude Code itself (the pinned npm package, installed by ``make test``) through the
gateway, run non-interactively as a user would (``claude -p``, ``--session-id`` then
``--resume``, then ``--continue``), against the scripted models of ``tests.mock_models``
on loopback: a Claude that checks each request as Anthropic does, bills it on a prompt
cache, binds its thinking to its prefix and applies the request's context management as
Anthropic's server does, and an OpenAI-compatible model behind ``/v1/messages``.

With thinking on, Claude Code asks for context management on every request
(``clear_thinking_20251015`` keeping all thinking, beta ``context-management-2025-06-27``)
and reads the ``applied_edits`` of the answer's ``message_delta``: to Claude the gateway
honours it (it goes up as sent), to an OpenAI-compatible model it applies it itself (it
does not go up)."""

from __future__ import annotations

import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.config import AnthropicSettings, Settings, UpstreamSettings
from tests.harness import GatewayServer
from tests.mock_models import ChatModel, ClaudeModel
from tests.mock_upstream import MockUpstream, Received, Reply

ROOT = Path(__file__).resolve().parents[2]
CLAUDE = ROOT / ".tools" / "agents" / "node_modules" / ".bin" / "claude"
DONE = re.compile(r"Done after (\d+) commands")
COMPACTING = {"filter", "ttl_prune", "compress", "summarize", "media"}
"""Stages whose action rewrites the history that went up before."""


@dataclass
class Exchange:
    """One request to the gateway as its client saw it."""

    path: str
    body: bytes = b""
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    answer: bytes = b""


class Recorder:
    """An ASGI middleware around the gateway keeping each request's body and the status,
    headers and body of its answer: what Claude Code sent and got back."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.exchanges: list[Exchange] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        exchange = Exchange(scope["path"])
        self.exchanges.append(exchange)

        async def receiving() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                exchange.body += message.get("body", b"")
            return message

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                exchange.status = message["status"]
                exchange.headers = {k.decode(): v.decode() for k, v in message["headers"]}
            elif message["type"] == "http.response.body":
                exchange.answer += message.get("body", b"")
            await send(message)

        await self.app(scope, receiving, sending)

    def messages(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.path == "/v1/messages"]


@dataclass
class Session:
    """A gateway in front of the scripted models, and Claude Code pointed at it."""

    claude: ClaudeModel
    chat: ChatModel
    upstream: MockUpstream
    recorder: Recorder
    env: dict[str, str]
    workdir: Path

    def ask(self, prompt: str, *args: str) -> str:
        """Claude Code's answer to ``prompt`` (``args``: its other options)."""
        done = subprocess.run(
            [str(CLAUDE), "-p", prompt, "--allowedTools", "Bash", *args],
            env=self.env,
            cwd=self.workdir,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, (done.stdout[-2_000:], done.stderr[-2_000:])
        return done.stdout

    def ledger(self, requests: int) -> list[dict[str, Any]]:
        """The conversations the inspector lists for Claude Code's key, once they count
        ``requests`` in all (entries are written after each answer, in the background)."""
        url = f"{self.env['ANTHROPIC_BASE_URL']}/v1/context/conversations"
        headers = {"x-api-key": self.env["ANTHROPIC_API_KEY"]}
        deadline = time.monotonic() + 10
        while True:
            rows: list[dict[str, Any]] = httpx.get(url, headers=headers).json()["data"]
            if sum(row["requests"] for row in rows) >= requests or time.monotonic() > deadline:
                return rows
            time.sleep(0.05)


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    if not CLAUDE.exists():
        pytest.fail(f"Claude Code is not installed at {CLAUDE}: `make test` installs it")
    claude, chat = ClaudeModel(), ChatModel()

    def answer(received: Received) -> Reply | None:
        return claude(received) or chat(received)

    recorders: list[Recorder] = []

    def recording(app: Any) -> Recorder:
        recorders.append(Recorder(app))
        return recorders[-1]

    with MockUpstream() as upstream:
        upstream.handler = answer
        settings = Settings(
            upstream=UpstreamSettings(base_url=upstream.base_url),
            anthropic=AnthropicSettings(base_url=upstream.base_url.removesuffix("/v1")),
            summaries=False,
        )
        with GatewayServer(settings, wrap=recording) as gateway:
            home, workdir = tmp_path / "home", tmp_path / "work"
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
            }
            yield Session(claude, chat, upstream, recorders[0], env, workdir)


@pytest.mark.parametrize(
    ("alias", "model"),
    [
        (None, "claude-opus-5-5"),
        ("opus", "claude-opus-5-5"),
        ("sonnet", "claude-sonnet-5-5"),
        ("claude-sonnet-4-6", "claude-sonnet-4-6"),
    ],
)
def test_claude_code_answers_on_its_default_model_and_aliases(
    session: Session, alias: str | None, model: str
) -> None:
    """On its default model, its aliases and a 4.x model, Claude Code gets its answer: its
    mid-conversation system message is accepted and reaches Claude in its place, with
    Claude Code's own headers."""
    args = ["--model", alias] if alias else []
    assert DONE.search(session.ask("Say hello.", *args))
    assert session.claude.refusals == []
    (sent,) = session.claude.requests
    assert sent["model"] == model
    roles = [turn["role"] for turn in sent["messages"]]
    if model.endswith("5-5"):
        assert "system" in roles
    (received,) = [r for r in session.upstream.received if r.path.startswith("/v1/messages")]
    assert received.headers["x-app"] == "cli"
    assert received.headers["user-agent"].startswith("claude-cli/")
    assert "x-claude-code-session-id" in received.headers


PROMPTS = [
    "RUN: seq 1 1500\nRUN: seq 2 1500",
    "RUN: seq 3 1500\nRUN: seq 4 1500",
    "RUN: seq 5 1500\nRUN: seq 6 1500",
    "RUN: seq 7 1500",
    "RUN: echo last",
]
"""Five user turns of tool use, each output ~3,500 tokens: past a 30,000-token budget by
the third."""
CONTINUED = "RUN: echo again"
"""The turn of ``--continue``, after the session was compacted."""
CONTEXT_MANAGEMENT_BETA = "context-management-2025-06-27"


def thinking_signatures(body: dict[str, Any]) -> list[str]:
    return [
        block["signature"]
        for turn in body.get("messages") or ()
        if isinstance(turn.get("content"), list)
        for block in turn["content"]
        if block.get("type") == "thinking"
    ]


def unanswered_tool_uses(body: dict[str, Any]) -> list[str]:
    """What breaks the tool pairs of a Messages request: a tool_use not answered by a
    tool_result in the next user turn, or a tool_result answering no tool_use of the
    assistant turn before it."""
    turns = [t for t in body.get("messages") or () if t.get("role") != "system"]

    def blocks(turn: dict[str, Any] | None, kind: str, key: str) -> set[str]:
        content = turn.get("content") if turn is not None else None
        return (
            {b[key] for b in content if b.get("type") == kind}
            if isinstance(content, list)
            else set()
        )

    problems = []
    for index, turn in enumerate(turns):
        following = turns[index + 1] if index + 1 < len(turns) else None
        if turn.get("role") == "assistant":
            uses = blocks(turn, "tool_use", "id")
            answered = blocks(following, "tool_result", "tool_use_id")
            if following is not None and uses - answered:
                problems.append(f"turn {index}: {sorted(uses - answered)} unanswered")
        else:
            earlier = turns[index - 1] if index else None
            orphans = blocks(turn, "tool_result", "tool_use_id") - blocks(earlier, "tool_use", "id")
            if orphans:
                problems.append(f"turn {index}: {sorted(orphans)} answer no tool_use")
    return problems


def message_delta(answer: bytes) -> dict[str, Any]:
    """The ``message_delta`` event of a streamed Messages answer."""
    for event in answer.split(b"\n\n"):
        for line in event.split(b"\n"):
            if line.startswith(b"data:") and b'"message_delta"' in line:
                data: dict[str, Any] = orjson.loads(line[5:])
                if data.get("type") == "message_delta":
                    return data
    raise AssertionError(f"no message_delta in {answer[-500:]!r}")


@pytest.mark.parametrize("model", ["default", "gpt-4o"])
def test_a_claude_code_session_under_compaction(session: Session, model: str) -> None:
    """A five-turn session of tool use (``--session-id``, then ``--resume``) under a
    max-input that forces compaction, then one more turn with ``--continue``, to Claude
    on Claude Code's default model and to an OpenAI-compatible model: every turn
    completes; nothing the upstream would refuse goes up (at most 4 breakpoints, tool
    pairs whole, thinking where it must be and signed for its prefix); thinking is kept
    as the client asks; a cache-break header comes only with a request that did not
    extend the prompt that went up before it. Claude Code's context management goes up to
    Claude exactly as it sent it, Claude applies it, and its account reaches Claude Code
    in the ``message_delta``; it does not go up to the OpenAI-compatible model, which
    gets plain requests, and Claude Code is answered as usual."""
    session.env["ANTHROPIC_CUSTOM_HEADERS"] = "x-contextgate-policy: max-input=30000"
    args = [] if model == "default" else ["--model", model]
    conversation = str(uuid.uuid4())
    for number, prompt in enumerate(PROMPTS):
        flag = ["--session-id", conversation] if number == 0 else ["--resume", conversation]
        answer = session.ask(prompt, *flag, *args)
        found = DONE.search(answer)
        assert found is not None, answer
        assert int(found[1]) == prompt.count("RUN:")
    upstream = session.claude if model == "default" else session.chat
    resumed = [
        set(e.headers["x-contextgate-actions"].split(", ")) for e in session.recorder.messages()
    ]
    assert any(acted & COMPACTING for acted in resumed), resumed
    answer = session.ask(CONTINUED, "--continue", *args)
    found = DONE.search(answer)
    assert found is not None, answer
    assert int(found[1]) == 1
    assert upstream.refusals == []
    sent = session.recorder.messages()
    assert len(sent) > len(resumed)
    assert [e.status for e in sent] == [200] * len(sent)
    assert len(sent) == len(upstream.requests)
    actions = [set(e.headers["x-contextgate-actions"].split(", ")) for e in sent]
    breaks = [e.headers.get("x-contextgate-cache-break") for e in sent]
    for index in range(1, len(sent)):
        if upstream.extends(index, index - 1):
            assert breaks[index] is None, (index, breaks)
    clients = [orjson.loads(e.body) for e in sent]
    assert all(body.get("context_management") is not None for body in clients)
    ledger = session.ledger(len(sent))
    assert sum(row["requests"] for row in ledger) == len(sent)
    assert sum(row["compactions"] for row in ledger) >= 1
    assert all(row["api"] == "messages" for row in ledger)
    if model == "default":  # no list price is settled for it: its cost is unknown
        assert [row["priced"] for row in ledger] == [0] * len(ledger)
    continued = orjson.dumps(clients[len(resumed)]["messages"]).decode()
    assert PROMPTS[-1] in continued  # the session went on, with its history
    assert CONTINUED in continued
    if model != "default":
        for went_up in session.chat.requests:
            assert "context_management" not in went_up
        for exchange in sent:
            assert "context_management" not in message_delta(exchange.answer)
        return
    received = [r for r in session.upstream.received if r.path == "/v1/messages"]
    assert len(received) == len(sent)
    for exchange, client, went_up, acted, seen, applied in zip(
        sent, clients, upstream.requests, actions, received, session.claude.applied, strict=True
    ):
        assert went_up["context_management"] == client["context_management"]
        assert CONTEXT_MANAGEMENT_BETA in seen.headers["anthropic-beta"]
        assert message_delta(exchange.answer)["context_management"] == {"applied_edits": applied}
        assert unanswered_tool_uses(went_up) == []
        kept = thinking_signatures(went_up)
        assert set(kept) <= set(thinking_signatures(client))
        if not acted & COMPACTING:
            assert kept == thinking_signatures(client)
        markers = orjson.dumps(went_up).count(b'"cache_control"')
        assert markers <= 4
    assert sum(len(thinking_signatures(r)) for r in upstream.requests) > len(PROMPTS)
