"""Where the Responses route's time goes beside the chat route's, step by step, in this
process: the same history as a chat request and as a Responses request
(``bench.overhead_responses.Size``), each step of the route's work timed alone, the two
routes alternating request by request; medians of CPU time (``time.process_time``: on a
shared machine, wall time counts the other processes' turns too).

    python -m bench.responses_breakdown [--requests 60] [--profile]

The steps are the routes' own calls, in their order: reading the body (the chat codec's
``parse_chat_request``; for Responses ``orjson.loads``, then ``from_body``, whose work is
the codec's ``chat_messages``), the pipeline (``Pipeline.compact`` with the default policy
and stages, the conversation's record carried from request to request, as the gateway
does), and the body sent up (``orjson.dumps`` of the pipeline's request; for Responses
``to_request`` first: the codec's ``response_items`` and a comparison of the items it
gives with those received, each also timed alone); then each whole route through the
gateway's application in this process, its upstream mocked. In the pipeline, the token
counter's cache key (``TokenCounter.key``) is counted, and timed over every message: a
chat message's key hashes its fields, but a Responses message holds its items (a list),
so its key is the hash of its JSON, items included. ``--profile`` adds the pipeline's
profile (cProfile, by own time) on each route's messages at 100K tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from unittest.mock import patch

import httpx
import orjson
from litestar.testing import AsyncTestClient

from bench.overhead import history
from bench.overhead_responses import Size, headers_for
from bench.responses_upstream import Answers
from gateway import create_app
from gateway.codecs.openai import parse_chat_request
from gateway.codecs.responses import from_body, response_items, to_request
from gateway.config import Settings, UpstreamSettings
from gateway.store import MemoryStore
from pipelines import CompactResult, ConversationState, Pipeline, Policy, TokenCounter


@dataclass
class Steps:
    """Milliseconds of each step, one value per request."""

    times: dict[str, list[float]] = field(default_factory=dict)

    def add(self, name: str, started: float) -> float:
        now = time.process_time()
        self.times.setdefault(name, []).append((now - started) * 1000)
        return now

    def median(self, name: str) -> float:
        return statistics.median(self.times[name])


@contextmanager
def counting_keys() -> Iterator[list[int]]:
    """``TokenCounter.key`` counted while the block runs (one element: the calls)."""
    original: Callable[[Any], Any] = TokenCounter.key
    calls = [0]

    def key(value: Any) -> Any:
        calls[0] += 1
        return original(value)

    with patch.object(TokenCounter, "key", staticmethod(key)):
        yield calls


class Route:
    """One route's requests through a pipeline of its own, the conversation's record
    carried from request to request on a simulated clock, as the gateway does."""

    def __init__(self) -> None:
        self.pipeline, self.policy = Pipeline(store=MemoryStore()), Policy()
        self.state: ConversationState | None = None
        self.now = 1_000_000.0
        self.steps = Steps()
        self.changed = False
        self.messages = 0
        self.keys = 0
        """``TokenCounter.key`` calls in the pipeline, for the last request counted."""

    async def compact(self, request: dict[str, Any], count: bool) -> CompactResult:
        if count:
            with counting_keys() as calls:
                result = await self.pipeline.compact(
                    request, policy=self.policy, state=self.state, now=self.now
                )
            self.keys, self.messages = calls[0], len(request["messages"])
        else:
            result = await self.pipeline.compact(
                request, policy=self.policy, state=self.state, now=self.now
            )
        self.state, self.now = result.state.answered(at=self.now), self.now + 30
        self.changed = result.changed
        return result

    async def chat(self, raw: bytes, record: bool, count: bool = False) -> None:
        """The chat route's steps on ``raw``."""
        steps = self.steps if record else Steps()
        started = time.process_time()
        request = parse_chat_request(raw)
        mark = steps.add("read", started)
        result = await self.compact(request, count)
        mark = steps.add("pipeline", mark)
        orjson.dumps(result.request)
        steps.add("sent up", mark)

    async def responses(self, raw: bytes, record: bool, count: bool = False) -> None:
        """The Responses route's steps on ``raw``; then, untimed as route steps, the parts
        of ``to_request`` alone."""
        steps = self.steps if record else Steps()
        started = time.process_time()
        body = orjson.loads(raw)
        mark = steps.add("loads", started)
        inbound = from_body(body)
        mark = steps.add("chat_messages", mark)
        result = await self.compact(inbound.chat, count)
        mark = steps.add("pipeline", mark)
        if not result.changed:
            return  # the body as received goes up
        sent = to_request(result.request, inbound.native)
        mark = steps.add("to_request", mark)
        orjson.dumps(sent)
        steps.add("dumps", mark)
        mark = time.process_time()
        items = response_items(result.request["messages"])
        mark = steps.add("response_items", mark)
        _ = items != inbound.native["input"]
        steps.add("comparison", mark)


def keys(messages: list[dict[str, Any]]) -> float:
    """Milliseconds for ``TokenCounter.key`` of every message."""
    key: Callable[[Any], Any] = TokenCounter.key
    started = time.process_time()
    for message in messages:
        key(message)
    return (time.process_time() - started) * 1000


@dataclass(frozen=True)
class Breakdown:
    """One history's steps, chat and Responses, in milliseconds (medians); the key calls
    per request in the pipeline, and the time of one key of every message."""

    name: str
    chat: dict[str, float]
    responses: dict[str, float]
    chat_keys: tuple[int, int, float]
    """Calls in the pipeline for one request, its messages, milliseconds for one key of
    every message."""
    responses_keys: tuple[int, int, float]
    changed: bool
    whole: tuple[float, float] = (0.0, 0.0)
    """The whole route in process (chat, Responses): milliseconds from the test client."""


async def whole(size: Size, requests: int) -> tuple[float, float]:
    """Median milliseconds of each whole route in this process: the gateway's application
    (``create_app``, default settings) with its upstream answered by an
    ``httpx.MockTransport`` (the benchmark mock's answers), called through Litestar's test
    client; chat and Responses alternating."""
    answers = Answers()

    def upstream(request: httpx.Request) -> httpx.Response:
        reply = answers.response if request.url.path.endswith("/responses") else answers.completion
        return httpx.Response(200, content=reply.body, headers={"content-type": "application/json"})

    settings = Settings(upstream=UpstreamSettings(base_url="http://upstream.bench/v1"))
    app = create_app(settings, transport=httpx.MockTransport(upstream))
    routes = [("chat", "/v1/chat/completions"), ("responses", "/v1/responses")]
    times: dict[str, list[float]] = {"chat": [], "responses": []}
    async with AsyncTestClient(app, base_url="http://gateway.bench") as client:
        for number in range(-3, requests):
            bodies = size.bodies(number)
            for kind, path in routes if number % 2 else routes[::-1]:
                started = time.process_time()
                answer = await client.post(path, content=bodies[kind], headers=headers_for(kind))
                if answer.status_code != 200:
                    raise RuntimeError(f"{path} answered {answer.status_code}")
                if number >= 0:
                    times[kind].append((time.process_time() - started) * 1000)
    return statistics.median(times["chat"]), statistics.median(times["responses"])


async def breakdown(size: Size, requests: int) -> Breakdown:
    """``requests`` requests of ``size`` on each route, alternating (after a few
    unrecorded ones), and the token counter's keys of each route's messages, alternating."""
    chat, responses = Route(), Route()
    for number in range(-3, requests):
        chat_raw = size.chat(number, False)
        responses_raw = orjson.dumps(size.responses(number) | {"stream": False})
        record, count = number >= 0, number == -1
        if number % 2:
            await chat.chat(chat_raw, record, count)
            await responses.responses(responses_raw, record, count)
        else:
            await responses.responses(responses_raw, record, count)
            await chat.chat(chat_raw, record, count)
    chat_messages = parse_chat_request(size.chat(0, False))["messages"]
    responses_messages = from_body(size.responses(0)).chat["messages"]
    chat_times, responses_times = [], []
    for _ in range(15):
        chat_times.append(keys(chat_messages))
        responses_times.append(keys(responses_messages))
    mine = {name: responses.steps.median(name) for name in responses.steps.times}
    return Breakdown(
        size.name,
        {name: chat.steps.median(name) for name in chat.steps.times},
        mine,
        (chat.keys, chat.messages, statistics.median(chat_times)),
        (responses.keys, responses.messages, statistics.median(responses_times)),
        chat.changed and responses.changed,
        await whole(size, requests),
    )


def lines(found: list[Breakdown]) -> list[str]:
    """The breakdown as a Markdown table."""
    out = [
        "| history | step | chat | Responses | Responses less chat |",
        "|---|---|---:|---:|---:|",
    ]
    for row in found:
        c, r = row.chat, row.responses
        read = r["loads"] + r["chat_messages"]
        sent = r.get("to_request", 0.0) + r.get("dumps", 0.0)
        steps = [
            (
                "read the body",
                c["read"],
                read,
                f" (loads {r['loads']:.2f}, `chat_messages` {r['chat_messages']:.2f})",
            ),
            ("the pipeline", c["pipeline"], r["pipeline"], ""),
            (
                "the body sent up",
                c["sent up"],
                sent,
                f" (`to_request` {r['to_request']:.2f}: alone, `response_items`"
                f" {r['response_items']:.2f} and the comparison {r['comparison']:.2f};"
                f" dumps {r['dumps']:.2f})"
                if "to_request" in r
                else " (the body as received)",
            ),
        ]
        for what, mine, theirs, detail in steps:
            out.append(
                f"| {row.name} | {what} | {mine:.2f} | {theirs:.2f}{detail} |"
                f" {theirs - mine:+.2f} |"
            )
        total_chat = sum(mine for _, mine, _, _ in steps)
        total_responses = sum(theirs for _, _, theirs, _ in steps)
        out.append(
            f"| {row.name} | **in all** | **{total_chat:.2f}** | **{total_responses:.2f}** |"
            f" **{total_responses - total_chat:+.2f}** |"
        )
        chat_whole, responses_whole = row.whole
        out.append(
            f"| {row.name} | *the whole route, through the application in process (its"
            f" upstream mocked)* | {chat_whole:.2f} | {responses_whole:.2f} |"
            f" {responses_whole - chat_whole:+.2f} |"
        )
        at_rate = []
        for calls, messages, every in (row.chat_keys, row.responses_keys):
            at_rate.append(calls * every / max(1, messages))
        out.append(
            f"| {row.name} | *in the pipeline: `TokenCounter.key`, its calls at the rate"
            f" measured over every message* | {at_rate[0]:.2f} ({row.chat_keys[0]} calls,"
            f" {1000 * row.chat_keys[2] / max(1, row.chat_keys[1]):.1f} µs each) |"
            f" {at_rate[1]:.2f} ({row.responses_keys[0]} calls,"
            f" {1000 * row.responses_keys[2] / max(1, row.responses_keys[1]):.1f} µs each) |"
            f" {at_rate[1] - at_rate[0]:+.2f} |"
        )
    return out


async def measure(sizes: list[Size], requests: int) -> list[Breakdown]:
    return [await breakdown(size, requests) for size in sizes]


async def profile(size: Size, requests: int, top: int = 15) -> None:
    """Print the pipeline's profile (cProfile, by own time) on each route's messages for
    ``requests`` requests of ``size``, the routes alternating."""
    routes = {"chat": Route(), "Responses": Route()}
    profiles = {name: cProfile.Profile() for name in routes}
    for number in range(-3, requests):
        requests_of = {
            "chat": parse_chat_request(size.chat(number, False)),
            "Responses": from_body(size.responses(number)).chat,
        }
        for name, route in routes.items():
            if number >= 0:
                profiles[name].enable()
            await route.compact(requests_of[name], count=False)
            if number >= 0:
                profiles[name].disable()
    for name, found in profiles.items():
        out = io.StringIO()
        pstats.Stats(found, stream=out).sort_stats("tottime").print_stats(top)
        print(f"== the pipeline on the {name} route's messages, {requests} requests of {size.name}")
        print(out.getvalue().strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument(
        "--profile", action="store_true", help="also profile the pipeline at 100K tokens"
    )
    args = parser.parse_args()
    counter = TokenCounter()
    sizes = [
        Size("20K tokens", "gpt-4o", history(20_000, counter), False),
        Size("100K tokens", "gpt-4.1", history(100_000, counter), True),
    ]
    for line in lines(asyncio.run(measure(sizes, args.requests))):
        print(line)
    if args.profile:
        asyncio.run(profile(sizes[-1], args.requests))


if __name__ == "__main__":
    main()
