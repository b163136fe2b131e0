"""Running one stage over a request, through the real runner."""

from __future__ import annotations

from typing import Any

from pipelines import CompactResult, Pipeline, Policy, Stage


async def run_stage(
    stage: Stage, messages: list[dict[str, Any]], model: str = "gpt-4o", **policy: Any
) -> CompactResult:
    request = {"model": model, "messages": messages}
    return await Pipeline(stages=[stage]).compact(request, policy=Policy(**policy))
