"""Running one stage over a request, through the real runner."""

from __future__ import annotations

from typing import Any

from pipelines import CompactResult, Pipeline, Policy, Stage, StoreError
from pipelines.compact_json import compact_json


class FailingStore:
    """A store that never acknowledges a write."""

    async def put(self, namespace: str, content: bytes, *, ttl: int) -> str:
        raise StoreError("down")

    async def get(self, namespace: str, ref: str) -> bytes | None:
        return None


async def run_stage(
    stage: Stage, messages: list[dict[str, Any]], model: str = "gpt-4o", **policy: Any
) -> CompactResult:
    request = {"model": model, "messages": messages}
    return await Pipeline(stages=[stage]).compact(request, policy=Policy(**policy))


class BoundaryProbe:
    """Stands in for cache_markers: keeps what it was given and the compaction boundary
    the stages before it named."""

    name = "cache_markers"

    def __init__(self) -> None:
        self.seen: list[tuple[Any, Any]] = []

    async def __call__(self, conversation: Any, ctx: Any) -> Any:
        self.seen.append((conversation, ctx.boundary))
        return conversation


def probed(probe: BoundaryProbe) -> list[Stage]:
    """The default stages with ``probe`` in cache_markers' place."""
    from pipelines.stages import DEFAULT_STAGES

    return [probe if s.name == "cache_markers" else type(s)() for s in DEFAULT_STAGES]


def as_filtered(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` as the filter sends a small one: a JSON tool output without its
    insignificant whitespace (``compact-json``), anything else as it is."""
    content = message.get("content")
    if message.get("role") != "tool" or not isinstance(content, str):
        return message
    return {**message, "content": compact_json(content)}


def boundary_at(probe: BoundaryProbe, received: list[dict[str, Any]]) -> int:
    """Where the boundary the probe saw is in the conversation it saw, checking that the
    messages after it are the received history's tail, untouched (but for the filter's
    lossless compact JSON)."""
    conversation, boundary = probe.seen[-1]
    messages = conversation.messages
    index = next(i for i, m in enumerate(messages) if m is boundary)
    tail = messages[index + 1 :]
    assert list(tail) == [as_filtered(m) for m in received[len(received) - len(tail) :]]
    return index
