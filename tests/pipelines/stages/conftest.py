"""Running one stage over a request, through the real runner."""

from __future__ import annotations

from typing import Any

from pipelines import CompactResult, Pipeline, Policy, Stage, StoreError


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
