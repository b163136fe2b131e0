"""CPU instructions per small request, the gateway's and the bare relay's, under callgrind.

    python -m bench.instructions [--requests 200] [--warm 50] [--baseline DIR] [--only TEXT]

Wall-clock figures on a shared host move by a third from run to run; instructions do not
(from one run to the next they agree within a few tenths of a percent), so a change to
what the gateway does per request is judged by them. Each figure is one run of this file
under valgrind's callgrind (``--one``, in a process of its own): the application driven
straight over ASGI in that process (no server, no socket: uvicorn's share of a request is
the same for both targets and is left out), its upstream an ``httpx.MockTransport``
answering as ``bench/peers_upstream.py`` does. The requests are ``bench.small``'s: one
user message on ``gpt-4.1`` ending with a new numbered turn, with the headers httpx sends,
not streamed and streamed. The gateway is built as ``contextgate serve`` builds it
(default settings and pipeline, in-memory store, logging at ``warning``), started and
warmed; the bare relay is ``bench/passthrough.py``'s. Each is sent ``--warm`` requests,
then the ``--requests`` measured ones. The gateway's overload probe is stopped: a timer,
whose ticks the valgrind-slowed clock would count against the requests.

Only what runs inside ``operator.call`` is counted (``--toggle-collect``; nothing on the
path calls it): each measured request runs the event loop through it, from the request's
arrival until

- *up to the answer* / *up to its first byte*: the step of the loop in which the
  application sent the answer's last body bytes, or a stream's first ones (what the
  client waits for);
- *all its work*: the application has returned and every task it left (the ledger's
  entry, the conversation's record) is done: all the CPU a request costs the process,
  which the next request on a busy gateway waits behind.

With ``--baseline DIR`` the gateway served from the checkout in DIR (with DIR/.venv's
interpreter when there is one) is measured too. Run with ``--one`` (and ``--target``,
``--stream``, ``--upto``) without valgrind, it prints the wall time per request.
"""

from __future__ import annotations

import argparse
import asyncio
import operator
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import httpx
import orjson

from tests.mock_upstream import chat_completion, recorded_stream

ROOT: Final = Path(__file__).resolve().parents[1]
KEY: Final = "sk-bench"
MODEL: Final = "gpt-4.1"
"""As ``bench.peers_targets`` sends them (not imported: a baseline checkout runs this file
with its own ``bench`` package on the path)."""
UPSTREAM = "http://upstream.test/v1"
STREAM = "e2aad469b71d1d4894ff833ea147020a9d875eb7ce644a0ff355581690a4cbfd.bin"
App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


def upstream() -> httpx.MockTransport:
    """The mock upstream: a fixed completion, or a recorded stream event by event."""
    completion = orjson.dumps(chat_completion())
    events = recorded_stream(STREAM)

    async def streamed() -> AsyncIterator[bytes]:
        for event in events:
            yield event
            # Each event comes in a read of its own, as from a socket: the application
            # relays the first one and waits for the next in another turn of the loop.
            await asyncio.sleep(0)

    async def handle(request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        if b'"stream":true' in body:
            headers = {"content-type": "text/event-stream"}
            return httpx.Response(200, headers=headers, content=streamed())
        return httpx.Response(200, headers={"content-type": "application/json"}, content=completion)

    return httpx.MockTransport(handle)


def gateway_app() -> tuple[Any, Callable[[], Awaitable[None]]]:
    """contextgate as ``contextgate serve`` builds it, and what to call once it has started."""
    for name in list(os.environ):
        if name.startswith(("CONTEXTGATE_", "REDIS", "OTEL_", "OPENAI_")):
            del os.environ[name]
    from gateway.app import create_app
    from gateway.config import load_settings
    from gateway.telemetry.logs import configure_logging

    settings = load_settings(environ={"CONTEXTGATE_UPSTREAM_BASE_URL": UPSTREAM})
    configure_logging("warning")
    app = create_app(settings, transport=upstream())
    gateway = app.state.gateway

    async def started() -> None:
        gateway.shedder.stop()
        gateway.warm()
        await asyncio.wait((gateway._warming,))  # as the benchmark's servers wait for it
        if not gateway.warmed:
            raise RuntimeError("the gateway's warm-up failed")

    return app, started


def bare_app() -> tuple[Any, Callable[[], Awaitable[None]]]:
    """``bench/passthrough.py``'s relay."""
    from bench.passthrough import build

    async def started() -> None:
        pass

    return build(UPSTREAM, transport=upstream()), started


def scope(body: bytes) -> dict[str, Any]:
    """An HTTP/1.1 request as uvicorn hands it over, with the headers httpx sends."""
    headers = [
        (b"host", b"127.0.0.1:8080"),
        (b"accept", b"*/*"),
        (b"accept-encoding", b"gzip, deflate"),
        (b"connection", b"keep-alive"),
        (b"user-agent", f"python-httpx/{httpx.__version__}".encode()),
        (b"content-type", b"application/json"),
        (b"authorization", f"Bearer {KEY}".encode()),
        (b"content-length", str(len(body)).encode()),
    ]
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "server": ("127.0.0.1", 8080),
        "client": ("127.0.0.1", 50000),
        "scheme": "http",
        "method": "POST",
        "root_path": "",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "headers": headers,
        "state": {},
    }


class Exchange:
    """One request's ASGI conversation: its body, then (as uvicorn does once the answer is
    complete) a disconnect; the answer's status. With ``stop_at`` (``first`` or ``last``),
    the loop is stopped once the answer's first body bytes, or its end, have been sent."""

    def __init__(self, body: bytes, loop: asyncio.AbstractEventLoop, stop_at: str = "") -> None:
        self.body = body
        self.loop = loop
        self.stop_at = stop_at
        self.sent_body = False
        self.status = 0
        self.complete: asyncio.Future[None] = loop.create_future()

    async def receive(self) -> dict[str, Any]:
        if not self.sent_body:
            self.sent_body = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await asyncio.shield(self.complete)
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif message["type"] == "http.response.body":
            last = not message.get("more_body", False)
            if last and not self.complete.done():
                self.complete.set_result(None)
            if (self.stop_at == "first" and message.get("body")) or (self.stop_at and last):
                self.stop_at = ""
                self.loop.stop()


async def lifespan(app: App) -> tuple[asyncio.Task[None], asyncio.Queue[dict[str, Any]]]:
    """The application started as a server starts it; the task and queue to shut it down."""
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    await inbox.put({"type": "lifespan.startup"})
    task = asyncio.create_task(app({"type": "lifespan"}, inbox.get, outbox.put))
    message = await outbox.get()
    if message["type"] != "lifespan.startup.complete":
        raise RuntimeError(f"the application did not start: {message}")
    return task, inbox


TURNS: Final = 3
"""Turns of the loop after the application returns, for the tasks it left."""


def measure(args: argparse.Namespace) -> None:
    """Send the requests, the measured ones run inside ``operator.call``."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    app, started = gateway_app() if args.target == "gateway" else bare_app()
    shutdown, inbox = loop.run_until_complete(lifespan(app))
    loop.run_until_complete(started())
    head = orjson.dumps({"model": MODEL, "stream": args.stream, "messages": []})[:-2]
    resident = set(asyncio.all_tasks(loop))

    def settle() -> None:
        """Run the loop until no task but the long-lived ones has work left."""
        for _ in range(3):
            pending = [t for t in asyncio.all_tasks(loop) if t not in resident]
            if pending:
                loop.run_until_complete(asyncio.wait(pending, timeout=5))
            one_turn()

    def one_turn() -> None:
        """One turn of the loop (what was ready runs)."""
        loop.call_soon(loop.stop)
        loop.run_forever()

    def answered(exchange: Exchange) -> asyncio.Task[None]:
        """The request until the loop is stopped at its answer (or first byte)."""
        task = loop.create_task(app(scope(exchange.body), exchange.receive, exchange.send))
        loop.run_forever()
        return task

    def whole(exchange: Exchange) -> None:
        """The request, and the tasks it left (the ledger's entry, the conversation's
        record: each done within ``TURNS`` turns of the loop, which ``measure`` checks)."""
        task = loop.create_task(app(scope(exchange.body), exchange.receive, exchange.send))
        loop.run_until_complete(task)
        for _ in range(TURNS):
            one_turn()

    elapsed = 0.0
    stop_at = "" if args.upto == "all" else "first" if args.stream else "last"
    for turn in range(args.warm + args.requests):
        message = orjson.dumps({"role": "user", "content": f"And what about request {turn}?"})
        exchange = Exchange(head + message + b"]}", loop, stop_at)
        measured = turn >= args.warm
        began = time.perf_counter()
        if args.upto == "all":
            operator.call(whole, exchange) if measured else whole(exchange)
            left = [t for t in asyncio.all_tasks(loop) if t not in resident]
            if left:
                raise RuntimeError(f"tasks left after {TURNS} turns: {left}")
        else:
            task = operator.call(answered, exchange) if measured else answered(exchange)
            loop.run_until_complete(task)
            settle()
        if measured:
            elapsed += time.perf_counter() - began
        if exchange.status != 200:
            raise RuntimeError(f"request {turn} answered {exchange.status}")

    inbox.put_nowait({"type": "lifespan.shutdown"})
    loop.run_until_complete(shutdown)
    loop.close()
    print(f"{elapsed / args.requests * 1e6:.0f} us per request (wall, without valgrind)")


RUNS: Final = (
    ("small request, up to the answer", False, "response"),
    ("small request, all its work", False, "all"),
    ("stream, up to its first byte", True, "response"),
    ("stream, all its work", True, "all"),
)


def callgrind(
    target: str, stream: bool, upto: str, requests: int, warm: int, checkout: Path
) -> float:
    """Instructions per request of one run under callgrind (the gateway served from
    ``checkout``, with its virtualenv's interpreter when it has one)."""
    python = checkout / ".venv" / "bin" / "python"
    executable = str(python) if python.exists() else sys.executable
    env = {**os.environ, "PYTHONPATH": str(checkout if target == "gateway" else ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            "valgrind",
            "--tool=callgrind",
            "--collect-atstart=no",
            "--toggle-collect=_operator_call",
            f"--callgrind-out-file={tmp}/callgrind.out",
            executable,
            __file__,
            "--one",
            f"--target={target}",
            f"--upto={upto}",
            f"--requests={requests}",
            f"--warm={warm}",
            *(["--stream"] if stream else []),
        ]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"callgrind run failed ({done.returncode}): {done.stderr[-2000:]}")
    return int(found.group(1)) / requests


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--one", action="store_true", help="one run, as callgrind's child")
    parser.add_argument("--target", choices=("gateway", "bare"), default="gateway")
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--upto", choices=("response", "all"), default="response")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--warm", type=int, default=50)
    parser.add_argument(
        "--baseline", type=Path, help="also measure the gateway served from this checkout"
    )
    parser.add_argument("--only", help="only the runs whose name contains this")
    args = parser.parse_args()
    if args.one:
        measure(args)
        return
    columns = [("contextgate", "gateway", ROOT)]
    if args.baseline is not None:
        columns.append(("contextgate before", "gateway", args.baseline))
    columns.append(("bare relay", "bare", ROOT))
    print("| run | " + " | ".join(f"{name} (M)" for name, _, _ in columns) + " | ratio |")
    print("|---|" + "---:|" * (len(columns) + 1))
    for name, stream, upto in RUNS:
        if args.only and args.only not in name:
            continue
        figures = [
            callgrind(target, stream, upto, args.requests, args.warm, checkout)
            for _, target, checkout in columns
        ]
        ratios = " / ".join(f"{f / figures[-1]:.2f}" for f in figures[:-1])
        cells = " | ".join(f"{f / 1e6:.2f}" for f in figures)
        print(f"| {name} | {cells} | {ratios} |", flush=True)


if __name__ == "__main__":
    main()
