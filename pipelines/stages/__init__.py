"""The stages, in the one order they run (docs/ARCHITECTURE.md, "The pipeline").

``DEFAULT_STAGES`` is the only place the order is written. A policy may disable or
parameterise a stage, never reorder it. ``PassThrough`` stands in for a stage under its
name (to measure a pipeline without it), so reports and headers still speak of all eleven.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pipelines.conversation import Conversation
from pipelines.stage import Stage, StageContext
from pipelines.stages.cache_markers import CacheMarkers
from pipelines.stages.compress import Compress
from pipelines.stages.filter import Filter
from pipelines.stages.guard_inbound import GuardInbound
from pipelines.stages.guard_outbound import GuardOutbound
from pipelines.stages.media import Media
from pipelines.stages.native_edits import NativeEdits
from pipelines.stages.normalize import Normalize
from pipelines.stages.summarize import Summarize
from pipelines.stages.thinking import Thinking
from pipelines.stages.ttl_prune import TtlPrune

__all__ = ["DEFAULT_STAGES", "STAGE_NAMES", "PassThrough"]


@dataclass(frozen=True, slots=True)
class PassThrough:
    """A stage that returns the conversation unchanged."""

    name: str

    async def __call__(self, conversation: Conversation, ctx: StageContext) -> Conversation:
        return conversation


DEFAULT_STAGES: Final[tuple[Stage, ...]] = (
    GuardInbound(),
    NativeEdits(),
    Thinking(),
    Media(),
    Filter(),
    TtlPrune(),
    Compress(),
    Summarize(),
    Normalize(),
    CacheMarkers(),
    GuardOutbound(),
)

STAGE_NAMES: Final = tuple(stage.name for stage in DEFAULT_STAGES)
