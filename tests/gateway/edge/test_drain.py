"""Graceful shutdown of ``contextgate serve`` on SIGTERM: no new connections, what is in
flight finishes within ``shutdown_grace``, what cannot is ended with an error the client
reads (a 503 or a stream's terminal error event), the spans are flushed, and the process
exits 0 before the orchestrator would kill it."""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from tests.conftest import settings_for
from tests.harness import GatewayServer, ServeProcess
from tests.mock_upstream import (
    JSONReply,
    MockUpstream,
    Received,
    Reply,
    SSEReply,
    chat_chunk,
    events_of,
)
from tests.otlp_receiver import OTLPReceiver

GRACE = 3.0
KEY = "sk-shutdown-test"


def chunks(words: int) -> list[bytes]:
    """A streamed completion of ``words`` words, ``w0 w1 ...``."""
    pieces = [chat_chunk({"content": f"w{n} "}) for n in range(words)]
    return events_of([*pieces, chat_chunk({}, "stop")])


def full_text(words: int) -> str:
    return "".join(f"w{n} " for n in range(words))


SHORT_WORDS, LONG_WORDS = 6, 300


def script(received: Received) -> Reply:
    """The upstream, by what the request asks: a short or a long stream, a quick or a
    stuck answer."""
    ask = received.json()["messages"][-1]["content"]
    if ask == "short stream":
        return SSEReply(chunks(SHORT_WORDS), interval=0.25)  # ends about 1.5 s in
    if ask == "long stream":
        return SSEReply(chunks(LONG_WORDS), interval=0.1)  # would take 30 s
    if ask == "quick answer":
        return JSONReply(
            {
                "id": "chatcmpl-quick",
                "object": "chat.completion",
                "created": 1,
                "model": "gpt-4o",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "done in time"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6},
            },
            delay=1.0,
        )
    return JSONReply({}, delay=60.0)  # "stuck answer"


@pytest.fixture
def receiver() -> Iterator[OTLPReceiver]:
    with OTLPReceiver() as server:
        yield server


@pytest.fixture
def served(upstream: MockUpstream, receiver: OTLPReceiver, tmp_path: Any) -> Iterator[ServeProcess]:
    """A traced gateway that exports spans only when flushed (the schedule delay is
    ten minutes), so the spans received after it exits are the shutdown's flush."""
    upstream.handler = script
    config = f"upstream:\n  base_url: {upstream.base_url}\nshutdown_grace: {GRACE}\n"
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "600000"}
    with ServeProcess(config, str(tmp_path), env=env) as process:
        yield process


class Outcome:
    """One client's request, run on a thread: what it received, how it ended, when."""

    def __init__(self, work: Callable[[Outcome], None]) -> None:
        self.work = work
        self.text = ""
        self.error: Exception | None = None
        self.began = threading.Event()
        self.ended_at = 0.0

    def run(self) -> None:
        try:
            self.work(self)
        except Exception as exc:
            self.error = exc
        finally:
            self.ended_at = time.monotonic()


def openai_stream(served: ServeProcess, ask: str) -> Outcome:
    def work(outcome: Outcome) -> None:
        with openai.OpenAI(
            base_url=served.base_url, api_key=KEY, max_retries=0, timeout=30
        ) as client:
            stream = client.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": ask}], stream=True
            )
            for chunk in stream:
                outcome.began.set()
                if chunk.choices and chunk.choices[0].delta.content:
                    outcome.text += chunk.choices[0].delta.content

    return Outcome(work)


def openai_answer(served: ServeProcess, ask: str) -> Outcome:
    def work(outcome: Outcome) -> None:
        with openai.OpenAI(
            base_url=served.base_url, api_key=KEY, max_retries=0, timeout=30
        ) as client:
            answer = client.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": ask}]
            )
            outcome.text = answer.choices[0].message.content or ""

    return Outcome(work)


def anthropic_stream(served: ServeProcess, ask: str) -> Outcome:
    """A Messages stream (model ``gpt-4o``: the gateway translates the upstream's)."""

    def work(outcome: Outcome) -> None:
        with (
            anthropic.Anthropic(
                base_url=served.base_url.removesuffix("/v1"),
                api_key=KEY,
                max_retries=0,
                timeout=30,
            ) as client,
            client.messages.stream(
                model="gpt-4o", max_tokens=1000, messages=[{"role": "user", "content": ask}]
            ) as stream,
        ):
            for text in stream.text_stream:
                outcome.began.set()
                outcome.text += text

    return Outcome(work)


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def refused(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return False
    except OSError:
        return True


def test_sigterm_lets_in_flight_work_finish_and_ends_the_rest_readably(
    served: ServeProcess, upstream: MockUpstream, receiver: OTLPReceiver
) -> None:
    short = openai_stream(served, "short stream")
    long = openai_stream(served, "long stream")
    quick = openai_answer(served, "quick answer")
    stuck = openai_answer(served, "stuck answer")
    messages = anthropic_stream(served, "long stream")
    everything = [short, long, quick, stuck, messages]
    with ThreadPoolExecutor(len(everything)) as pool:
        futures: list[Future[None]] = [pool.submit(outcome.run) for outcome in everything]
        for outcome in (short, long, messages):
            assert outcome.began.wait(15), "a stream did not begin"
        wait_until(lambda: len(upstream.received) >= len(everything), 15, "every request")

        served.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()

        # The gateway takes no new connection at once.
        wait_until(lambda: refused(served.port), 2, "the listening socket to close")
        for future in futures:
            future.result(timeout=GRACE + 10)
        served.process.wait(timeout=GRACE + 10)
        exited = time.monotonic()

    # What could finish within the grace period finished, whole.
    assert short.error is None
    assert short.text == full_text(SHORT_WORDS)
    assert quick.error is None
    assert quick.text == "done in time"

    # The rest was ended at the deadline with the gateway's error, readable by each SDK.
    # An error event inside a 200 stream: APIError, not the status error of a refusal.
    assert type(long.error) is openai.APIError, long.error
    assert long.error.code == "gateway_shutting_down"
    assert full_text(LONG_WORDS).startswith(long.text)
    assert len(long.text) > 20
    assert GRACE - 0.5 < long.ended_at - signalled < GRACE + 3

    assert isinstance(stuck.error, openai.APIStatusError), stuck.error
    assert stuck.error.status_code == 503
    assert stuck.error.code == "gateway_shutting_down"
    assert stuck.error.response.headers["retry-after"] == "1"
    assert GRACE - 0.5 < stuck.ended_at - signalled < GRACE + 3

    assert isinstance(messages.error, anthropic.APIStatusError), messages.error
    assert messages.error.body["error"]["type"] == "api_error"  # type: ignore[index]
    assert "shutting down" in messages.error.body["error"]["message"]  # type: ignore[index]
    assert full_text(LONG_WORDS).startswith(messages.text)
    assert len(messages.text) > 20

    # The upstream responses of the ended requests were closed, not left running.
    assert len(upstream.disconnects) >= 3

    # It exited cleanly, before a Kubernetes-style kill would have come.
    assert served.process.returncode == 0
    assert exited - signalled < GRACE + 4

    log = [orjson.loads(line) for line in served.log().splitlines() if line.startswith("{")]
    assert any(line["message"].startswith("draining: 5 request(s) in flight") for line in log)
    drained = [line for line in log if line.get("drained")]
    assert sorted(line["status"] for line in drained) == [200, 200, 503]
    assert not [line for line in log if line["level"] in ("error", "critical")], log

    # Every request's server span was exported on the way out (nothing was sent before).
    servers = [s for s in receiver.spans if s.kind == "SERVER"]
    assert len(servers) == len(everything), [s.name for s in servers]


@pytest.fixture
def gateway(gateway: GatewayServer) -> Iterator[GatewayServer]:
    """The session's gateway, ready again after the test: the test below marks it draining,
    and the tests that share it after this module expect it ready."""
    yield gateway
    gateway.app.state.gateway.draining.started = False


def test_readyz_says_draining_once_shutdown_began(gateway: GatewayServer) -> None:
    """Load balancers that keep probing an open connection are told to stop sending."""
    with httpx.Client(base_url=gateway.url, timeout=5) as client:
        assert client.get("/readyz").json()["status"] == "ready"
        gateway.app.state.gateway.draining.started = True
        answer = client.get("/readyz")
    assert answer.status_code == 503
    assert answer.json() == {"status": "draining"}
    # Liveness is unaffected: the process is healthy, only leaving.
    assert httpx.get(f"{gateway.url}/healthz", timeout=5).status_code == 200


async def test_sigterm_lets_websocket_responses_finish_then_closes_with_going_away(
    upstream: MockUpstream, tmp_path: Any
) -> None:
    """On a WebSocket (``GET /v1/responses``): the response in flight is answered whole,
    then the connection closes with 1001; an idle connection closes with 1001 at once;
    uvicorn's own close (1012, mid-response) never comes first."""
    import asyncio

    import websockets
    from websockets.exceptions import ConnectionClosed

    from tests.mock_upstream import WSReply, message_item, response_body, response_events

    events = response_events(response_body("gpt-4o", [message_item("finished in time")]))
    upstream.push(WSReply(events, delay=1.5))
    config = f"upstream:\n  base_url: {upstream.base_url}\nshutdown_grace: {GRACE}\n"
    headers = {"authorization": f"Bearer {KEY}"}
    with ServeProcess(config, str(tmp_path)) as served:
        url = f"ws://127.0.0.1:{served.port}/v1/responses"
        async with (
            websockets.connect(url, additional_headers=headers) as busy,
            websockets.connect(url, additional_headers=headers) as idle,
        ):
            create = {"type": "response.create", "model": "gpt-4o", "input": "Hi"}
            await busy.send(orjson.dumps(create).decode())
            await asyncio.to_thread(
                wait_until,
                lambda: any(r.method == "WS" for r in upstream.received),
                5,
                "the response sent up",
            )
            served.process.send_signal(signal.SIGTERM)
            with pytest.raises(ConnectionClosed) as idle_closed:
                await asyncio.wait_for(idle.recv(), 2)
            received = []
            with pytest.raises(ConnectionClosed) as busy_closed:
                while True:
                    received.append(orjson.loads(await asyncio.wait_for(busy.recv(), 5)))
        await asyncio.to_thread(served.process.wait, GRACE + 10)
    assert idle_closed.value.rcvd is not None
    assert idle_closed.value.rcvd.code == 1001
    assert received == events  # answered whole, no error event
    assert busy_closed.value.rcvd is not None
    assert busy_closed.value.rcvd.code == 1001
    assert served.process.returncode == 0


def test_a_responses_stream_the_deadline_ends_gets_an_error_numbered_after_its_events(
    upstream: MockUpstream,
) -> None:
    """A ``/v1/responses`` stream cut at the drain's deadline ends with an ``error`` event
    whose ``sequence_number`` follows the last event's (the SDK orders events by it)."""
    from tests.gateway.routes.test_responses_socket_faults import LoopCatcher
    from tests.mock_upstream import message_item, response_body, response_events, sse_of_events

    events = response_events(response_body("gpt-4o", [message_item("a long answer " * 5)]))
    upstream.push(SSEReply(sse_of_events(events), pauses={4: 30.0}))  # stalls after 5 events
    caught: list[LoopCatcher] = []

    def wrap(app: Any) -> LoopCatcher:
        caught.append(LoopCatcher(app))
        return caught[0]

    lines: list[str] = []
    with GatewayServer(settings_for(upstream), wrap=wrap) as server:
        draining = server.app.state.gateway.draining

        def read() -> None:
            body = {"model": "gpt-4o", "input": "Hi", "stream": True}
            with httpx.stream(
                "POST", f"{server.base_url}/responses", json=body, timeout=10
            ) as response:
                lines.extend(response.iter_lines())

        reader = threading.Thread(target=read)
        reader.start()
        wait_until(lambda: len(lines) >= 10, 5, "the first events")
        loop = caught[0].loop
        assert loop is not None
        loop.call_soon_threadsafe(draining.begin, 0.3)
        reader.join(10)
        draining.started = draining.expired = False
    data = [orjson.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert data[-1]["type"] == "error"
    assert data[-1]["code"] == "gateway_shutting_down"
    assert data[-1]["sequence_number"] == data[-2]["sequence_number"] + 1
