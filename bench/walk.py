"""One request's walk through the gateway's modules, from its route to the upstream call.

    .venv/bin/python -m bench.walk [--api chat|messages] [--model gpt-4o|claude-sonnet-4]
                                   [--summaries] [--stops]

The gateway runs in this process (its upstream an ``httpx.MockTransport``); after one
request to warm it, a second request of the same conversation is traced with a profiler
from the moment its route handler is called until the provider is called. A *stop* is a
call from one of the gateway's modules into another (calls within a module are not stops;
the pipeline, ``pipelines/``, is one library call and not followed). The output is the
stops in order (``--stops``) and, per module, how many times the walk entered it:
docs/ARCHITECTURE.md's walk says at most twice.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import httpx2
import orjson
from litestar.testing import AsyncTestClient

from gateway import create_app
from gateway.config import AnthropicSettings, Settings, UpstreamSettings

ROOT = str(Path(__file__).resolve().parents[1] / "gateway") + "/"
HISTORY = [
    {"role": "system", "content": "You are a travel agent."},
    {"role": "user", "content": "Move my booking to the 24th."},
    {"role": "assistant", "content": "Done: HAT170 on the 24th."},
    {"role": "user", "content": "And the seat?"},
]


class Walk:
    """The stops of one traced request."""

    def __init__(self) -> None:
        self.on = False
        self.stops: list[tuple[str | None, str, str]] = []
        self._started_by: dict[int, str] = {}
        self._tasks: list[asyncio.Task[Any]] = []
        self._frames: dict[int, FrameType] = {}
        """Frames seen (held, so that their ids are not reused): a coroutine resumed is
        a call event again, not a new stop."""

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or not self.on:
            return
        callee = _module(frame)
        if callee is None or id(frame) in self._frames:
            return
        self._frames[id(frame)] = frame
        back = frame.f_back
        while back is not None and _module(back) is None:
            back = back.f_back
        if back is not None:
            caller = _module(back)
        else:  # the first frame of a task: the module that started the task
            task = asyncio.current_task()
            caller = self._started_by.get(id(task)) if task is not None else None
        if caller != callee:
            self.stops.append((caller, callee, frame.f_code.co_name))
        if callee.startswith("routes/") and frame.f_code.co_name in _HANDLERS:
            self.stops.clear()  # the walk starts at the route handler
            self.stops.append((None, callee, frame.f_code.co_name))

    def stop(self) -> None:
        self.on = False

    def task_factory(self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
        """Tasks as asyncio makes them, each noted with the gateway module starting it."""
        task = asyncio.Task(coro, loop=loop, **kwargs)
        if self.on:
            frame = sys._getframe(1)
            while frame is not None and _module(frame) is None:
                frame = frame.f_back  # type: ignore[assignment]
            if frame is not None:
                self._tasks.append(task)
                self._started_by[id(task)] = _module(frame) or ""
        return task


_HANDLERS = {"chat_completions", "messages"}


def _module(frame: FrameType) -> str | None:
    name = frame.f_code.co_filename
    return name[len(ROOT) :] if name.startswith(ROOT) else None


def _completion(model: str) -> dict[str, Any]:
    message = {"role": "assistant", "content": "12A."}
    return {
        "id": "chatcmpl-walk",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 40, "completion_tokens": 3, "total_tokens": 43},
    }


def _message(model: str) -> dict[str, Any]:
    return {
        "id": "msg_walk",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": "12A."}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 40, "output_tokens": 3},
    }


async def walk(api: str, model: str, *, summaries: bool) -> Walk:
    traced = Walk()

    def openai_side(request: httpx.Request) -> httpx.Response:
        traced.stop()
        body = orjson.loads(request.read())
        if body.get("response_format"):  # a summary request
            return httpx.Response(400, json={"error": {"message": "no structured output"}})
        return httpx.Response(200, json=_completion(model))

    def anthropic_side(request: httpx2.Request) -> httpx2.Response:
        traced.stop()
        return httpx2.Response(200, json=_message(model))

    settings = Settings(
        upstream=UpstreamSettings(base_url="http://upstream.walk/v1"),
        anthropic=AnthropicSettings(base_url="http://anthropic.walk"),
        summaries=summaries,
    )
    app = create_app(
        settings,
        transport=httpx.MockTransport(openai_side),
        anthropic_transport=httpx2.MockTransport(anthropic_side),
    )

    async def traced_app(scope: Any, receive: Any, send: Any) -> None:
        asyncio.get_running_loop().set_task_factory(traced.task_factory)
        if scope["type"] != "http" or not traced.on:
            await app(scope, receive, send)
            return
        sys.setprofile(traced.profile)
        try:
            await app(scope, receive, send)
        finally:
            sys.setprofile(None)

    headers = {"authorization": "Bearer sk-walk-0001"}
    if api == "chat":
        path, body = "/v1/chat/completions", {"model": model, "messages": HISTORY}
    else:
        path = "/v1/messages"
        body = {
            "model": model,
            "max_tokens": 256,
            "system": HISTORY[0]["content"],
            "messages": HISTORY[1:],
        }
        headers["anthropic-version"] = "2023-06-01"
    async with AsyncTestClient(traced_app, base_url="http://gateway.walk.local") as client:
        first = await client.post(path, json=body, headers=headers)
        first.raise_for_status()
        traced.on = True
        second = await client.post(path, json=body, headers=headers)
        traced.on = False
        second.raise_for_status()
    return traced


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--api", choices=["chat", "messages"], default="chat")
    parser.add_argument("--model", default="gpt-4o")
    parser.add_argument("--summaries", action="store_true")
    parser.add_argument("--stops", action="store_true", help="print every stop in order")
    args = parser.parse_args()
    traced = asyncio.run(walk(args.api, args.model, summaries=args.summaries))
    if args.stops:
        for caller, callee, name in traced.stops:
            print(f"{caller or '':28} -> {callee}:{name}")
        print()
    entered = Counter(callee for _, callee, _ in traced.stops)
    print(f"{len(traced.stops)} stops in {len(entered)} modules; entered most: ")
    for module, times in entered.most_common():
        print(f"  {times}  {module}")


if __name__ == "__main__":
    main()
