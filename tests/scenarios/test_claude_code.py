"""Claude Code itself (the pinned npm package, installed by ``make test``) through the
gateway, run non-interactively as a user would (``claude -p``, ``--session-id`` then
``--resume``), against the scripted models of ``tests.mock_models`` on loopback: a Claude
that checks each request as Anthropic does, bills it on a prompt cache and binds its
thinking to its prefix, and an OpenAI-compatible model behind ``/v1/messages``."""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


class Recorder:
    """An ASGI middleware around the gateway keeping each request's body and the status and
    headers of its answer: what Claude Code sent and got back."""

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


def thinking_signatures(body: dict[str, Any]) -> list[str]:
    return [
        block["signature"]
        for turn in body.get("messages") or ()
        if isinstance(turn.get("content"), list)
        for block in turn["content"]
        if block.get("type") == "thinking"
    ]


@pytest.mark.parametrize("model", ["default", "gpt-4o"])
def test_a_claude_code_session_under_compaction(session: Session, model: str) -> None:
    """A five-turn session of tool use (``--session-id``, then ``--resume``) under a
    max-input that forces compaction, to Claude on Claude Code's default model and to an
    OpenAI-compatible model: every turn completes; nothing the upstream would refuse goes
    up (at most 4 breakpoints, tool pairs whole, thinking where it must be and signed for
    its prefix); thinking is kept as the client asks; a cache-break header comes only
    with a request that did not extend the prompt that went up before it."""
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
    assert upstream.refusals == []
    sent = session.recorder.messages()
    assert [e.status for e in sent] == [200] * len(sent)
    assert len(sent) == len(upstream.requests)
    actions = [set(e.headers["x-contextgate-actions"].split(", ")) for e in sent]
    assert any(acted & COMPACTING for acted in actions), actions
    breaks = [e.headers.get("x-contextgate-cache-break") for e in sent]
    for index in range(1, len(sent)):
        if upstream.extends(index, index - 1):
            assert breaks[index] is None, (index, breaks)
    if model != "default":
        return
    for exchange, went_up, acted in zip(sent, upstream.requests, actions, strict=True):
        client = thinking_signatures(orjson.loads(exchange.body))
        kept = thinking_signatures(went_up)
        assert set(kept) <= set(client)
        if not acted & COMPACTING:
            assert kept == client
        markers = orjson.dumps(went_up).count(b'"cache_control"')
        assert markers <= 4
    assert sum(len(thinking_signatures(r)) for r in upstream.requests) > len(PROMPTS)
