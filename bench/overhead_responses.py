"""The Responses route's overhead beside the chat route's: the same histories sent as chat
requests and as Responses requests (over HTTP, JSON and streamed, and over the Responses
WebSocket), each straight to a mock upstream and through contextgate, all interleaved in
one run, so that what the gateway adds on each route is read under the same noise.

    python -m bench.overhead_responses [--requests 200] [--runs 3] [--output docs/BENCHMARKS.md]

Histories (``bench.overhead.history``, the tau-bench airline trajectories): one message
and about 20K tokens on gpt-4o, resent unchanged; about 100K tokens on gpt-4.1 (1M window),
each request the history and a new numbered user message, as the chat overhead's 120K
warm row. At none of them is compaction due (under 0.4 of the budget, the same policy on
both routes); what the default policy does anyway (at 20K and 100K: JSON tool outputs
compacted, a ``prompt_cache_key``) it must do on both routes alike: the gateway's
``x-contextgate-actions`` are read on both, printed and written. The Responses form is
``bench.responses_sessions.convert`` without the reasoning items a chat history has no
counterpart of: ``instructions``, user and assistant ``message`` items, a
``function_call`` per tool call and a ``function_call_output`` per tool message.

Per history, every round sends, in an order shuffled round by round, to the mock and to
the gateway: the chat request and the Responses request, each answered as JSON and as a
stream (SSE), and the Responses request as a ``response.create`` on a WebSocket (the
``websockets`` asyncio client; one connection to the mock and one to the gateway, each
kept for the whole run and carrying every message). Timed from the send to each event
(to the whole answer for JSON): a stream's first event, its last (``response.completed``
on the WebSocket, ``[DONE]`` for chat) and every one between. The mock
(``bench/responses_upstream.py``) paces a stream's 34 events ``--stream-interval``
apart, so that each crosses the gateway on its own.

Overhead = median through the gateway less median direct; per event, for each event's
position, the same, then their mean. The ratio compares the Responses route's overhead
with the chat route's for the same history: a JSON answer with a JSON answer, a stream's
(SSE or WebSocket) events with the chat stream's. With ``--runs`` above 1, the mock and
the gateway are started afresh for each run; the table gives the medians of the runs'
figures, their ratio, and each run's ratio.

The mock (``python -m bench.responses_upstream``) and the gateway (``contextgate serve``)
each run in their own process on loopback; this process is the client (httpx and
websockets on one asyncio loop, keep-alive).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx
import orjson
from websockets.asyncio.client import ClientConnection, connect

from bench.overhead import answers, free_port, history, process
from bench.report import publish
from bench.responses_sessions import convert
from pipelines import TokenCounter

ROOT = Path(__file__).resolve().parent.parent
START, END = "<!-- overhead-responses:start -->", "<!-- overhead-responses:end -->"
HEADING = "## Overhead of the Responses route (HTTP and WebSocket)"
KINDS: Final = ("chat", "responses", "chat_stream", "responses_stream", "socket")
"""What each round sends to each path: the chat request and the Responses request as JSON
and as SSE, and the Responses request over the WebSocket."""
PATHS: Final = ("direct", "gateway")
STREAMED: Final = frozenset({"chat_stream", "responses_stream", "socket"})
COMPLETED: Final = '{"type":"response.completed"'
WARMUP: Final = 5
Item = dict[str, Any]
Messages = list[dict[str, Any]]


def responses_form(messages: Sequence[Mapping[str, Any]]) -> tuple[str | None, list[Item]]:
    """``messages`` as a Responses client sends them (``instructions`` and ``input``):
    ``convert`` without its reasoning items."""
    conversion = convert(messages)
    items = [item for item in conversion.items if item.get("type") != "reasoning"]
    return conversion.instructions, items


def turn(number: int) -> dict[str, Any]:
    """The new user message of a numbered request."""
    return {"role": "user", "content": f"And what about reservation number {number}?"}


@dataclass(frozen=True)
class Size:
    """One history, and the requests of each kind that carry it."""

    name: str
    model: str
    messages: Messages
    numbered: bool
    """Each request adds a new numbered user message to the history."""
    instructions: str | None = field(init=False)
    items: list[Item] = field(init=False)

    def __post_init__(self) -> None:
        instructions, items = responses_form(self.messages)
        object.__setattr__(self, "instructions", instructions)
        object.__setattr__(self, "items", items)

    def chat(self, number: int, stream: bool) -> bytes:
        messages = [*self.messages, turn(number)] if self.numbered else self.messages
        return orjson.dumps({"model": self.model, "messages": messages, "stream": stream})

    def responses(self, number: int) -> dict[str, Any]:
        items = self.items
        if self.numbered:
            items = [*items, *responses_form([turn(number)])[1]]
        body: dict[str, Any] = {"model": self.model}
        if self.instructions is not None:
            body["instructions"] = self.instructions
        return body | {"input": items, "store": False}

    def bodies(self, number: int) -> dict[str, bytes]:
        """Each kind's request for round ``number`` (the WebSocket's: its message)."""
        responses = self.responses(number)
        return {
            "chat": self.chat(number, False),
            "responses": orjson.dumps(responses | {"stream": False}),
            "chat_stream": self.chat(number, True),
            "responses_stream": orjson.dumps(responses | {"stream": True}),
            "socket": orjson.dumps({"type": "response.create", **responses}),
        }


def headers_for(kind: str) -> dict[str, str]:
    """A request's headers: each kind its own session, so its own conversation record in
    the gateway (the WebSocket's, at its handshake)."""
    return {
        "content-type": "application/json",
        "authorization": "Bearer sk-bench",
        "session-id": f"bench-{kind}",
    }


@dataclass
class Seen:
    """What the gateway said it did to a kind's requests (its ``x-contextgate-*``)."""

    actions: set[str] = field(default_factory=set)
    tokens: str = ""


class Paths:
    """The client's side of every path: one HTTP client, a WebSocket per path."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        bases: Mapping[str, str],
        sockets: Mapping[str, ClientConnection],
    ) -> None:
        self.client, self.bases, self.sockets = client, bases, sockets
        self.seen: dict[str, Seen] = {kind: Seen() for kind in KINDS}

    async def send(self, kind: str, path: str, body: bytes) -> list[float]:
        """Milliseconds from the send to each event of the answer (to the whole answer
        for JSON)."""
        if kind == "socket":
            return await socket_events(self.sockets[path], body.decode())
        route = "chat/completions" if kind.startswith("chat") else "responses"
        url = f"{self.bases[path]}/{route}"
        headers = headers_for(kind)
        started = time.perf_counter()
        if kind in STREAMED:
            async with self.client.stream("POST", url, content=body, headers=headers) as answer:
                check(answer, url)
                times = await sse_events(answer, started)
        else:
            answer = await self.client.post(url, content=body, headers=headers)
            times = [(time.perf_counter() - started) * 1000]
            check(answer, url)
        if path == "gateway":
            seen = self.seen[kind]
            found = answer.headers.get("x-contextgate-actions", "")
            seen.actions.update(a.strip() for a in found.split(",") if a.strip())
            seen.tokens = answer.headers.get("x-contextgate-tokens", seen.tokens)
        return times


def check(answer: httpx.Response, url: str) -> None:
    if answer.status_code != 200:
        raise RuntimeError(f"{url} answered {answer.status_code}")


def ended(pending: bytes, chunk: bytes) -> tuple[int, bytes]:
    """How many SSE events end in ``chunk`` (after ``pending``, the unended rest of the
    chunks before it), and the unended rest after it."""
    data = pending + chunk
    count = data.count(b"\n\n")
    return count, data[data.rindex(b"\n\n") + 2 :] if count else data


async def sse_events(answer: httpx.Response, started: float) -> list[float]:
    """Milliseconds from ``started`` to the end of each event of an SSE answer."""
    times: list[float] = []
    pending = b""
    async for chunk in answer.aiter_raw():
        count, pending = ended(pending, chunk)
        if count:
            times.extend([(time.perf_counter() - started) * 1000] * count)
    return times


async def socket_events(socket: ClientConnection, message: str) -> list[float]:
    """Milliseconds from sending ``message`` to each event, up to ``response.completed``."""
    times: list[float] = []
    started = time.perf_counter()
    await socket.send(message)
    while True:
        frame = await socket.recv()
        times.append((time.perf_counter() - started) * 1000)
        text = frame if isinstance(frame, str) else frame.decode()
        if text.startswith(COMPLETED):
            return times
        if text.startswith('{"type":"error"'):
            raise RuntimeError(f"the WebSocket answered {text[:300]}")


@dataclass
class Timings:
    """Every answer's event times, by kind and path."""

    events: dict[tuple[str, str], list[list[float]]] = field(default_factory=dict)

    def add(self, kind: str, path: str, times: list[float]) -> None:
        self.events.setdefault((kind, path), []).append(times)

    def at(self, kind: str, path: str) -> list[float]:
        """The median time to each event's position."""
        answers = self.events[(kind, path)]
        count = len(answers[0])
        if any(len(times) != count for times in answers):
            raise RuntimeError(f"{kind} {path}: answers with different numbers of events")
        return [statistics.median(times[k] for times in answers) for k in range(count)]


@dataclass(frozen=True)
class Figures:
    """One kind's figures at one size, in milliseconds: direct and through the gateway,
    to the first event and to the last (the whole answer for JSON), and the gateway's
    mean added latency over every event's position."""

    first: tuple[float, float]
    last: tuple[float, float]
    per_event: float
    events: int

    @property
    def added_first(self) -> float:
        return self.first[1] - self.first[0]

    @property
    def added_last(self) -> float:
        return self.last[1] - self.last[0]


def figures(timings: Timings, kind: str) -> Figures:
    direct, gateway = timings.at(kind, "direct"), timings.at(kind, "gateway")
    if len(direct) != len(gateway):
        raise RuntimeError(f"{kind}: {len(direct)} events direct, {len(gateway)} through")
    added = statistics.fmean(g - d for d, g in zip(direct, gateway, strict=True))
    return Figures((direct[0], gateway[0]), (direct[-1], gateway[-1]), added, len(direct))


async def measure_size(paths: Paths, size: Size, rounds: int, rng: random.Random) -> Timings:
    """``rounds`` rounds at ``size`` (after a few unrecorded ones); each round sends every
    kind to every path in a shuffled order, the same bodies to both paths."""
    pairs = [(kind, path) for kind in KINDS for path in PATHS]
    timings = Timings()
    for number in range(-WARMUP, rounds):
        bodies = size.bodies(number)
        rng.shuffle(pairs)
        for kind, path in pairs:
            times = await paths.send(kind, path, bodies[kind])
            if number >= 0:
                timings.add(kind, path, times)
    return timings


async def measure(
    mock_port: int, gateway_port: int, sizes: list[tuple[Size, int]], seed: int
) -> tuple[dict[str, dict[str, Figures]], dict[str, dict[str, Seen]]]:
    bases = {
        "direct": f"http://127.0.0.1:{mock_port}/v1",
        "gateway": f"http://127.0.0.1:{gateway_port}/v1",
    }
    rng = random.Random(seed)
    results: dict[str, dict[str, Figures]] = {}
    seen: dict[str, dict[str, Seen]] = {}
    async with (
        httpx.AsyncClient(timeout=120) as client,
        connect(
            f"ws://127.0.0.1:{mock_port}/v1/responses",
            additional_headers=headers_for("socket"),
            compression=None,
            max_size=None,
            proxy=None,
        ) as direct,
        connect(
            f"ws://127.0.0.1:{gateway_port}/v1/responses",
            additional_headers=headers_for("socket"),
            compression=None,
            max_size=None,
            proxy=None,
        ) as gateway,
    ):
        for size, rounds in sizes:
            paths = Paths(client, bases, {"direct": direct, "gateway": gateway})
            timings = await measure_size(paths, size, rounds, rng)
            results[size.name] = {kind: figures(timings, kind) for kind in KINDS}
            seen[size.name] = paths.seen
            print_size(size.name, results[size.name], paths.seen)
    return results, seen


def print_size(name: str, found: Mapping[str, Figures], seen: Mapping[str, Seen]) -> None:
    print(f"{name}:")
    for kind, f in found.items():
        actions = ", ".join(sorted(seen[kind].actions)) or "none"
        print(
            f"  {kind:17s} first {f.first[0]:7.2f} -> {f.first[1]:7.2f} (+{f.added_first:5.2f})"
            f"  last {f.last[0]:7.2f} -> {f.last[1]:7.2f} (+{f.added_last:5.2f})"
            f"  per event +{f.per_event:5.2f}  [{f.events} events; actions: {actions};"
            f" tokens: {seen[kind].tokens}]",
            flush=True,
        )


def run_once(
    sizes: list[tuple[Size, int]], interval: float, seed: int
) -> tuple[dict[str, dict[str, Figures]], dict[str, dict[str, Seen]]]:
    """One run: a fresh mock and gateway, every size measured."""
    mock_port, gateway_port = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("REDIS_URL", None)
    env.pop("CONTEXTGATE_CONFIG", None)
    mock_cmd = [
        sys.executable,
        "-m",
        "bench.responses_upstream",
        "--port",
        str(mock_port),
        "--stream-interval",
        str(interval),
    ]
    gateway_cmd = [sys.executable, "-m", "gateway.cli", "serve", "--port", str(gateway_port)]
    gateway_env = {**env, "CONTEXTGATE_UPSTREAM_BASE_URL": f"http://127.0.0.1:{mock_port}/v1"}
    with (
        process(mock_cmd, env, answers(f"http://127.0.0.1:{mock_port}/v1/models")),
        process(gateway_cmd, gateway_env, answers(f"http://127.0.0.1:{gateway_port}/healthz")),
    ):
        return asyncio.run(measure(mock_port, gateway_port, sizes, seed))


# -- the report ----------------------------------------------------------------------------

ROWS: Final = (
    # transport, measure, the chat kind, the Responses kind, which figure
    ("HTTP JSON", "whole answer", "chat", "responses", "last"),
    ("HTTP SSE", "first event", "chat_stream", "responses_stream", "first"),
    ("HTTP SSE", "last event", "chat_stream", "responses_stream", "last"),
    ("HTTP SSE", "per event (mean)", "chat_stream", "responses_stream", "per_event"),
    ("WebSocket", "first event", "chat_stream", "socket", "first"),
    ("WebSocket", "`response.completed`", "chat_stream", "socket", "last"),
    ("WebSocket", "per event (mean)", "chat_stream", "socket", "per_event"),
)
"""The table's rows at each size: what is compared with what."""


def added(found: Figures, which: str) -> float:
    if which == "first":
        return found.added_first
    if which == "last":
        return found.added_last
    return found.per_event


def direct_of(found: Figures, which: str) -> float:
    return found.first[0] if which == "first" else found.last[0]


def table(runs: list[dict[str, dict[str, Figures]]]) -> list[str]:
    """The table: for each size and row, the medians over the runs of each route's
    direct time and overhead, their ratio, and the ratio's range over the runs."""
    lines = [
        "| history | transport | measure | chat direct | chat added | Responses direct |"
        " Responses added | ratio | ratio, each run | within 10% |",
        "|---|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for name in runs[0]:
        for transport, what, chat, responses, which in ROWS:
            mine = [run[name][responses] for run in runs]
            theirs = [run[name][chat] for run in runs]
            ratios = [
                added(r, which) / added(c, which) if added(c, which) > 0 else float("nan")
                for r, c in zip(mine, theirs, strict=True)
            ]
            chat_added = statistics.median(added(c, which) for c in theirs)
            responses_added = statistics.median(added(r, which) for r in mine)
            ratio = responses_added / chat_added if chat_added > 0 else float("nan")
            holds = "yes" if ratio <= 1.10 else "no"
            each = ", ".join(f"{r:.2f}" for r in ratios)
            chat_direct = statistics.median(direct_of(c, which) for c in theirs)
            responses_direct = statistics.median(direct_of(r, which) for r in mine)
            direct_cells = (
                ("-", "-")
                if which == "per_event"
                else (f"{chat_direct:.2f}", f"{responses_direct:.2f}")
            )
            lines.append(
                f"| {name} | {transport} | {what} | {direct_cells[0]} | {chat_added:.2f} |"
                f" {direct_cells[1]} | {responses_added:.2f} | **{ratio:.2f}** | {each} |"
                f" {holds} |"
            )
    return lines


def actions(seen: Mapping[str, Seen]) -> str:
    """What the gateway said it did on each route, once when the routes agree."""
    chat = ", ".join(sorted(seen["chat"].actions | seen["chat_stream"].actions)) or "none"
    mine = ", ".join(sorted(seen["responses"].actions | seen["responses_stream"].actions))
    mine = mine or "none"
    return f"{chat} on both routes" if chat == mine else f"chat {chat}, Responses {mine}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=200, help="rounds per history")
    parser.add_argument("--runs", type=int, default=3, help="runs, each with fresh processes")
    parser.add_argument(
        "--stream-interval", type=float, default=0.001, help="seconds between streamed events"
    )
    parser.add_argument(
        "--breakdown", type=int, default=60, help="requests per route for the step breakdown"
    )
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "BENCHMARKS.md")
    args = parser.parse_args()
    n = args.requests

    counter = TokenCounter()
    mid, big = history(20_000, counter), history(100_000, counter)
    sizes = [
        (Size("1 message", "gpt-4o", [{"role": "user", "content": "Say hello."}], False), n),
        (Size(f"{counter.count_messages(mid) // 1000}K tokens", "gpt-4o", mid, False), n),
        (Size(f"{counter.count_messages(big) // 1000}K tokens", "gpt-4.1", big, True), n // 2),
    ]
    runs = []
    seen: dict[str, dict[str, Seen]] = {}
    for run in range(args.runs):
        print(f"run {run + 1} of {args.runs}", flush=True)
        found, seen = run_once(sizes, args.stream_interval, seed=run)
        runs.append(found)
    kb = {
        size.name: (len(size.bodies(0)["chat"]) / 1024, len(size.bodies(0)["responses"]) / 1024)
        for size, _ in sizes
    }
    rounds = ", ".join(f"{count} at {size.name}" for size, count in sizes)
    how = (
        f"`make bench` (`python -m bench.overhead_responses --requests {n} --runs"
        f" {args.runs} --stream-interval {args.stream_interval}`). {args.runs} runs, each"
        f" with a fresh mock and gateway; per run, rounds of every request to the mock and"
        f" to contextgate in a shuffled order ({rounds}); milliseconds, medians; added ="
        " through contextgate less direct; ratio = Responses added / chat added (medians"
        " of the runs), compared with the chat route's JSON answer for a JSON answer and"
        " with its SSE stream's events for a stream. Bodies (chat, Responses): "
        + "; ".join(f"{name} {c:.0f} KB, {r:.0f} KB" for name, (c, r) in kb.items())
        + ". What the gateway did (`x-contextgate-actions`): "
        + "; ".join(f"{name}: {actions(kinds)}" for name, kinds in seen.items())
        + "."
    )
    # Where the Responses route's time goes, at the histories where it is long.
    from bench import responses_breakdown

    long_sizes = [size for size, _ in sizes[1:]]
    breakdown = asyncio.run(responses_breakdown.measure(long_sizes, args.breakdown))
    extra = [
        "",
        "Where the time goes: each route's steps on the same histories, in one process"
        f" (`python -m bench.responses_breakdown --requests {args.breakdown}`, the two routes"
        " alternating; medians of CPU time, milliseconds):",
        "",
        *responses_breakdown.lines(breakdown),
    ]
    publish(args.output, (START, END), HEADING, how, [*table(runs), *extra])


if __name__ == "__main__":
    main()
