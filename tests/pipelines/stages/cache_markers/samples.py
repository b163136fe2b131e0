"""Conversations and helpers shared by the cache_markers tests."""

from __future__ import annotations

from typing import Any

import orjson

from pipelines import ConversationState, Pipeline
from pipelines.stages.cache_markers import CacheMarkers

MARK = {"type": "ephemeral"}
HOUR = {"type": "ephemeral", "ttl": "1h"}
POLICY = "You are the airline's agent. Follow the booking policy to the letter. " * 100
CLAUDE, QWEN = "claude-sonnet-4-5", "qwen-max"


def call(n: int) -> dict[str, Any]:
    return {"id": f"c{n}", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}


def tool(name: str, words: int = 20) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": name, "description": "Looks it up. " * words, "parameters": {}},
    }


def history(turns: int = 3, system: str | None = POLICY, output: int = 1) -> list[dict[str, Any]]:
    """A system prompt (about 1,300 tokens) and ``turns`` exchanges, each with a tool call
    whose output repeats its line ``output`` times (about 6 tokens a line)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for n in range(turns):
        messages.append({"role": "user", "content": f"Question {n}: what about flight {n}?"})
        messages.append({"role": "assistant", "content": None, "tool_calls": [call(n)]})
        content = f"flight {n}: on time\n" * output
        messages.append({"role": "tool", "tool_call_id": f"c{n}", "content": content})
        messages.append({"role": "assistant", "content": f"Flight {n} is on time."})
    messages.append({"role": "user", "content": "And the next one?"})
    return messages


async def run(
    messages: list[dict[str, Any]],
    model: str = CLAUDE,
    *,
    state: ConversationState | None = None,
    stages: list[Any] | None = None,
    now: float = 1_000.0,
    **fields: Any,
) -> Any:
    request = {"model": model, "messages": messages, **fields}
    pipeline = Pipeline(stages=stages or [CacheMarkers()])
    return await pipeline.compact(request, state=state, now=now)


def details(result: Any) -> dict[str, Any]:
    """What the stage reported for the request of ``result``."""
    return stage_details(result.report)


def stage_details(report: Any) -> dict[str, Any]:
    stage = report.stage("cache_markers")
    assert stage is not None
    assert stage.error is None
    return stage.details  # type: ignore[no-any-return]


def marked(messages: list[dict[str, Any]]) -> list[int]:
    return [i for i, m in enumerate(messages) if "cache_control" in orjson.dumps(m).decode()]


async def breaks_of(
    requests: list[dict[str, Any]], gaps: list[float] | None = None
) -> list[str | None]:
    """The cache_break each request of a conversation records, sent in turn."""
    pipeline = Pipeline(stages=[CacheMarkers()])
    state, now, causes = None, 1_000.0, []
    for index, request in enumerate(requests):
        now += gaps[index] if gaps else 5.0
        result = await pipeline.compact(request, state=state, now=now)
        causes.append(result.report.cache_break)
        state = ConversationState.from_json(result.state.answered(at=now).to_json())
    return causes


def grow(request: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """The next request of the conversation: one exchange more, with ``changes``."""
    messages = [*request["messages"], {"role": "assistant", "content": "Done."}]
    messages.append({"role": "user", "content": "Thanks, one more thing."})
    return {**request, "messages": messages, **changes}


REPLAYED = 60
"""Trajectories the replays run."""
