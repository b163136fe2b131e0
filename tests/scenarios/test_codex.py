"""Codex CLI itself (the pinned npm package, installed by ``make test``) through the
gateway, run non-interactively as a user would (``codex exec``, then ``codex exec resume``
in the same session), against ``tests.mock_models.ResponsesModel`` on loopback: a model
behind the Responses API that checks each request as OpenAI does (tool pairs whole, its
encrypted reasoning given back untouched, a ``previous_response_id`` it can continue) and
runs the ``RUN:`` lines of the prompt with Codex's shell tool. Codex talks to the gateway
over HTTP (``POST /v1/responses``, streamed) or over the Responses WebSocket (``GET
/v1/responses`` upgraded, each request after its first continuing the one before by
``previous_response_id``), as its provider config says. Nothing leaves the machine:
plugins, analytics and the update check are off, and no request is retried."""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.config import Settings, UpstreamSettings
from tests.harness import GatewayServer
from tests.mock_models import ResponsesModel
from tests.mock_upstream import MockUpstream, Received, Reply, SSEReply
from tests.scenarios.test_claude_code import COMPACTING, Recorder

ROOT = Path(__file__).resolve().parents[2]
CODEX = ROOT / ".tools" / "agents" / "node_modules" / ".bin" / "codex"
MODEL = "gpt-5.5"
"""A model of Codex's catalog with the classic Responses shape (its default model uses
another, "responses lite")."""
KEY = "sk-codex-test"
BUDGET = 30_000
DONE = re.compile(r"Done after (\d+) commands")
REF = re.compile(r"ctx_[A-Za-z0-9_-]{22,}")
TOKENS = re.compile(r"before=(\d+), after=(\d+)")
PROMPTS = [
    "RUN: seq 1 3000\nRUN: seq 2 1800",
    "RUN: seq 3 1800\nRUN: seq 4 1800",
    "RUN: seq 5 1800\nRUN: seq 6 1800",
    "RUN: seq 7 1800\nRUN: seq 8 1800",
]
"""Four user turns of two commands each. The first output (~8,000 tokens) is over the
pipeline's ``filter-tokens`` and offloaded at once; the others (~4,400 tokens each) are
not, and take the history past a 30,000-token budget by the third turn."""


def config(base_url: str, *, websockets: bool, policy: str | None) -> str:
    """Codex's ``config.toml``: the gateway as a custom Responses provider, every call
    home switched off, no retries (a refusal fails the turn at once)."""
    headers = f'http_headers = {{ "x-contextgate-policy" = "{policy}" }}\n' if policy else ""
    return f"""\
model = "{MODEL}"
model_provider = "contextgate"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[model_providers.contextgate]
name = "contextgate"
base_url = "{base_url}"
env_key = "CONTEXTGATE_API_KEY"
wire_api = "responses"
supports_websockets = {"true" if websockets else "false"}
request_max_retries = 0
stream_max_retries = 0
{headers}
[features]
plugins = false
unbounded_connection_retries = false

[analytics]
enabled = false
"""


class SocketRecorder(Recorder):
    """A ``Recorder`` that also keeps the text of every message a WebSocket client sent
    the gateway (Codex's ``response.create`` frames), one list per connection."""

    def __init__(self, app: Any) -> None:
        super().__init__(app)
        self.sockets: list[list[str]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            await super().__call__(scope, receive, send)
            return
        frames: list[str] = []
        self.sockets.append(frames)

        async def receiving() -> Any:
            message = await receive()
            if message["type"] == "websocket.receive" and message.get("text") is not None:
                frames.append(message["text"])
            return message

        await self.app(scope, receiving, send)


@dataclass
class Turn:
    """What one ``codex exec`` showed its user."""

    thread: str
    """The session's id (``thread.started``)."""
    events: list[dict[str, Any]]
    """Its ``--json`` events."""
    last: str
    """The final message (``-o``)."""

    def commands(self) -> list[dict[str, Any]]:
        return [
            event["item"]
            for event in self.events
            if event.get("type") == "item.completed"
            and event["item"].get("type") == "command_execution"
        ]


@dataclass
class Session:
    """A gateway in front of the scripted model, and Codex pointed at it."""

    model: ResponsesModel
    upstream: MockUpstream
    recorder: SocketRecorder
    gateway: GatewayServer
    env: dict[str, str]
    home: Path
    workdir: Path
    tmp: Path

    def configure(self, *, websockets: bool = False, policy: str | None = None) -> None:
        text = config(self.gateway.base_url, websockets=websockets, policy=policy)
        (self.home / "config.toml").write_text(text)

    def run(self, prompt: str, thread: str | None = None) -> Turn:
        """``codex exec`` with ``prompt`` (resuming session ``thread`` when given)."""
        last = self.tmp / "last.txt"
        last.unlink(missing_ok=True)
        options = ["--json", "--skip-git-repo-check", "-o", str(last)]
        if thread is None:
            args = ["exec", *options, "-C", str(self.workdir), prompt]
        else:
            args = ["exec", "resume", *options, thread, prompt]
        done = subprocess.run(
            [str(CODEX), *args],
            env=self.env,
            cwd=self.workdir,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, (done.stdout[-3_000:], done.stderr[-3_000:])
        events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        (started,) = [e for e in events if e.get("type") == "thread.started"]
        assert events[-1]["type"] == "turn.completed", events[-3:]
        return Turn(started["thread_id"], events, last.read_text())


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    if not CODEX.exists():
        pytest.fail(f"Codex CLI is not installed at {CODEX}: `make test` installs it")
    model = ResponsesModel()
    recorders: list[SocketRecorder] = []

    def recording(app: Any) -> SocketRecorder:
        recorders.append(SocketRecorder(app))
        return recorders[-1]

    with MockUpstream() as upstream:
        upstream.handler = model
        settings = Settings(upstream=UpstreamSettings(base_url=upstream.base_url), summaries=False)
        with GatewayServer(settings, wrap=recording) as gateway:
            home, workdir = tmp_path / "codex-home", tmp_path / "work"
            home.mkdir()
            workdir.mkdir()
            env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "HOME": str(tmp_path),
                "CODEX_HOME": str(home),
                "CONTEXTGATE_API_KEY": KEY,
            }
            yield Session(model, upstream, recorders[0], gateway, env, home, workdir, tmp_path)


def test_codex_exec_answers_through_the_gateway(session: Session) -> None:
    """One ``codex exec`` over HTTP: Codex runs the command and prints the model's answer;
    every model call went through the gateway (answered 200 with its headers) and reached
    the model with Codex's own headers and body fields; the turn state the upstream gives
    (``x-codex-turn-state``, for sticky routing) comes back on the turn's next request."""

    def with_turn_state(received: Received) -> Reply | None:
        reply = session.model(received)
        if isinstance(reply, SSEReply):
            reply.headers["x-codex-turn-state"] = "turn-state-1"
        return reply

    session.upstream.handler = with_turn_state
    session.configure()
    turn = session.run("RUN: echo hello")
    assert turn.last.startswith("Done after 1 commands"), turn.last
    (command,) = turn.commands()
    assert (command["aggregated_output"], command["exit_code"]) == ("hello\n", 0)
    assert session.model.refusals == []
    sent = [e for e in session.recorder.exchanges if e.path == "/v1/responses"]
    assert sent
    assert [e.status for e in sent] == [200] * len(sent)
    for exchange in sent:
        assert exchange.headers.get("x-contextgate-request-id")
        assert TOKENS.search(exchange.headers["x-contextgate-tokens"])
        assert "x-contextgate-actions" in exchange.headers
    received = [r for r in session.upstream.received if r.path == "/v1/responses"]
    assert len(received) == len(sent) == len(session.model.requests)
    for request, body in zip(received, session.model.requests, strict=True):
        headers = request.headers
        assert headers["authorization"] == f"Bearer {KEY}"
        assert headers["session-id"] == turn.thread
        assert json.loads(headers["x-codex-turn-metadata"])["thread_id"] == turn.thread
        assert headers["x-codex-beta-features"]
        assert headers["x-client-request-id"] == turn.thread
        assert headers["originator"] == "codex_exec"
        assert body["model"] == MODEL
        assert body["store"] is False
        assert body["stream"] is True
        assert "reasoning.encrypted_content" in body["include"]
        assert body["prompt_cache_key"] == turn.thread
        assert body["client_metadata"]["thread_id"] == turn.thread
        assert "exec_command" in [tool.get("name") for tool in body["tools"]]
    assert [r.headers.get("x-codex-turn-state") for r in received] == [None, "turn-state-1"]


def seq_output(command: str) -> str:
    """What ``seq A B`` prints."""
    first, last = (int(n) for n in command.split()[1:])
    return "".join(f"{n}\n" for n in range(first, last + 1))


def restore(session: Session, ref: str) -> str:
    """What ``ref`` restores to, through the gateway, with Codex's key."""
    got = httpx.get(
        f"{session.gateway.base_url}/context/objects/{ref}",
        headers={"authorization": f"Bearer {KEY}"},
    )
    assert got.status_code == 200, (ref, got.text)
    return got.text


def ledger(session: Session, requests: int) -> list[dict[str, Any]]:
    """The conversations the inspector lists for Codex's key, once they count
    ``requests`` in all (entries are written after each answer, in the background)."""
    url = f"{session.gateway.base_url}/context/conversations"
    deadline = time.monotonic() + 10
    while True:
        got = httpx.get(url, headers={"authorization": f"Bearer {KEY}"})
        rows: list[dict[str, Any]] = got.json()["data"]
        if sum(row["requests"] for row in rows) >= requests or time.monotonic() > deadline:
            return rows
        time.sleep(0.05)


def assert_in_the_ledger(session: Session, requests: int, api: str) -> None:
    """The inspector lists every request of the session, under its API, with its
    compactions."""
    rows = ledger(session, requests)
    assert sum(row["requests"] for row in rows) == requests
    assert {row["api"] for row in rows} == {api}
    assert sum(row["compactions"] for row in rows) >= 1
    assert sum(row["upstream_tokens"] for row in rows) < sum(row["client_tokens"] for row in rows)


def assert_nothing_lost(session: Session) -> int:
    """Every request that reached the model: each tool output it holds that the gateway
    offloaded restores (by the ref in its preview) to what the command printed, and every
    call made before it that it no longer holds is in what a note's ref restores (but in
    a prewarm, which holds the instructions alone). The number of refs restored."""
    model = session.model
    restored = 0
    for index, items in enumerate(model.inputs):
        commands = {
            item["call_id"]: json.loads(item["arguments"])["cmd"]
            for item in items
            if item.get("type") == "function_call"
        }
        notes = ""
        for item in items:
            text = json.dumps(item.get("output") or item.get("content") or "")
            refs = REF.findall(text)
            if item.get("type") == "function_call_output" and refs:
                assert seq_output(commands[item["call_id"]]) in restore(session, refs[0])
                restored += 1
            elif item.get("type", "message") == "message" and refs:
                notes += "".join(restore(session, ref) for ref in refs)
                restored += len(refs)
        if model.requests[index].get("generate") is False:
            continue  # a prewarm: the instructions alone
        made = {
            item["call_id"]
            for output in model.outputs[:index]
            for item in output
            if item["type"] == "function_call"
        }
        for call_id in made - set(commands):
            assert call_id in notes, (index, call_id)
    return restored


def assert_session_completed(turns: list[Turn]) -> None:
    """Every turn ran both its commands and ended on the model's answer saying so."""
    assert len({turn.thread for turn in turns}) == 1
    for prompt, turn in zip(PROMPTS, turns, strict=True):
        found = DONE.search(turn.last)
        assert found is not None, turn.last
        assert int(found[1]) == prompt.count("RUN:")
        ran = [command["command"] for command in turn.commands()]
        asked = [line.removeprefix("RUN: ") for line in prompt.splitlines()]
        assert len(ran) == len(asked)
        assert all(want in got for want, got in zip(asked, ran, strict=True)), ran
        assert {command["exit_code"] for command in turn.commands()} == {0}


def run_session(session: Session) -> list[Turn]:
    """The prompts as one session: ``codex exec``, then ``codex exec resume`` by id."""
    turns: list[Turn] = []
    for prompt in PROMPTS:
        turns.append(session.run(prompt, turns[0].thread if turns else None))
    return turns


def test_a_codex_session_under_compaction_over_http(session: Session) -> None:
    """Four ``codex exec`` turns of one session, two big command outputs each, under a
    max-input that forces compaction: every turn completes with both its commands; the
    model refused nothing (tool pairs whole, its encrypted reasoning given back
    untouched); the gateway compacted, and every request that reached the model fits the
    budget; a cache-break header comes only with a request that did not extend the prompt
    that went up before it; the refs in what the model saw restore what it no longer
    sees."""
    session.configure(policy=f"max-input={BUDGET}")
    turns = run_session(session)
    assert_session_completed(turns)
    model = session.model
    assert model.refusals == []
    sent = [e for e in session.recorder.exchanges if e.path == "/v1/responses"]
    assert [e.status for e in sent] == [200] * len(sent)
    assert len(sent) == len(model.requests) == 3 * len(PROMPTS)
    assert set(model.transports) == {"http"}
    actions = [set(filter(None, e.headers["x-contextgate-actions"].split(", "))) for e in sent]
    assert any(acted & COMPACTING for acted in actions), actions
    counts = [token_counts(e.headers["x-contextgate-tokens"]) for e in sent]
    assert max(before for before, _ in counts) > BUDGET, counts
    assert all(after <= BUDGET for _, after in counts), counts
    breaks = [e.headers.get("x-contextgate-cache-break") for e in sent]
    extended = [model.extends(index, index - 1) for index in range(1, len(sent))]
    assert any(extended)
    for index, extends in enumerate(extended, start=1):
        if extends:
            assert breaks[index] is None, (index, breaks)
    assert all("previous_response_id" not in body for body in model.requests)
    received = [r for r in session.upstream.received if r.path == "/v1/responses"]
    assert all("x-contextgate-policy" not in r.headers for r in received)
    assert sum(item.get("type") == "reasoning" for items in model.inputs for item in items)
    assert assert_nothing_lost(session) > 0
    assert_in_the_ledger(session, len(sent), "responses")


def token_counts(header: str) -> tuple[int, int]:
    """``x-contextgate-tokens``: the request's tokens before and after the pipeline."""
    found = TOKENS.search(header)
    assert found is not None, header
    return int(found[1]), int(found[2])


def test_a_codex_session_under_compaction_over_a_websocket(
    session: Session, caplog: pytest.LogCaptureFixture
) -> None:
    """The same session with the provider's WebSocket on: each ``codex exec`` opens one
    WebSocket to the gateway, which opens one to the model's with Codex's handshake
    headers; Codex continues each response by ``previous_response_id`` with only the new
    items, and the gateway sends the model the whole history instead, compacted to the
    budget as over HTTP: every turn completes, the model refused nothing, and the refs in
    what it saw restore what it no longer sees."""
    session.configure(websockets=True, policy=f"max-input={BUDGET}")
    with caplog.at_level(logging.INFO, logger="contextgate.access"):
        turns = run_session(session)
    assert_session_completed(turns)
    model = session.model
    assert model.refusals == []
    assert set(model.transports) == {"ws"}
    assert [e.path for e in session.recorder.exchanges if e.path == "/v1/responses"] == []
    sockets = session.upstream.websockets
    assert len(sockets) == len(PROMPTS)
    for socket in sockets:
        headers = socket.handshake.headers
        assert (socket.handshake.method, socket.handshake.path) == ("GET", "/v1/responses")
        assert headers["openai-beta"].startswith("responses_websockets=")
        assert headers["authorization"] == f"Bearer {KEY}"
        assert headers["session-id"] == turns[0].thread
        assert "x-contextgate-policy" not in headers
        sent = [message.json() for message in socket.messages]
        assert {message["type"] for message in sent} == {"response.create"}
        assert sent[0].get("generate") is False  # Codex's prewarm
    assert len(model.requests) == sum(len(socket.messages) for socket in sockets)
    # Codex continued each response by previous_response_id, sending only the new items;
    # the model got each whole and stateless.
    frames = [[json.loads(text) for text in socket] for socket in session.recorder.sockets]
    assert [len(socket) for socket in frames] == [len(s.messages) for s in sockets]
    instructions = frames[0][0]["input"][0]
    flat = [frame for socket in frames for frame in socket]
    for frame, items in zip(flat, model.inputs, strict=True):
        assert items[0] == instructions
        if frame.get("generate") is not False:
            assert frame.get("previous_response_id"), frame
            assert instructions not in frame["input"]
    assert all("previous_response_id" not in body for body in model.requests)
    asked = [
        [prompt for prompt in PROMPTS if json.dumps(prompt) in json.dumps(items)]
        for items, body in zip(model.inputs, model.requests, strict=True)
        if body.get("generate") is not False
    ]
    for earlier, later in itertools.pairwise(asked):
        assert later[: len(earlier)] == earlier
    assert asked[-1] == PROMPTS
    # The gateway's count of each response (its access-log line: a WebSocket answer has no
    # headers). What reached the model was stateless, so that count is of all it saw.
    lines = [
        record.fields  # type: ignore[attr-defined]
        for record in caplog.records
        if record.name == "contextgate.access" and record.fields["method"] == "WS"  # type: ignore[attr-defined]
    ]
    assert len(lines) == len(model.requests)
    assert {line["status"] for line in lines} == {200}
    assert max(line["tokens_before"] for line in lines) > BUDGET
    assert all(line["tokens_after"] <= BUDGET for line in lines), lines
    assert_in_the_ledger(session, len(model.requests), "responses-ws")
    assert sum(item.get("type") == "reasoning" for items in model.inputs for item in items)
    assert assert_nothing_lost(session) > 0
