"""contextgate's context pipeline as a plain library (it never imports the gateway).

result = await pipelines.compact(request, model="gpt-4o", policy=Policy(trigger=0.6))
result.request   # the request to send upstream
result.report    # what every stage did, tokens before and after
"""

from pipelines.budget import Budget
from pipelines.cache_break import BREAK_CAUSES, observed_break
from pipelines.catalog import ModelCatalog, ModelInfo, ModelPrice
from pipelines.conversation import Conversation
from pipelines.errors import PipelineError, PolicyError, RequestRejected, StoreError
from pipelines.pipeline import CompactResult, Pipeline, compact
from pipelines.policy import Policy, PolicyBounds
from pipelines.ports import OffloadStore, Summarizer
from pipelines.report import Report, StageReport
from pipelines.session import ConversationState, conversation_id
from pipelines.stage import Stage, StageContext
from pipelines.stages import DEFAULT_STAGES, STAGE_NAMES
from pipelines.tokens import TokenCounter, encoding, estimate_tokens

__all__ = [
    "BREAK_CAUSES",
    "DEFAULT_STAGES",
    "STAGE_NAMES",
    "Budget",
    "CompactResult",
    "Conversation",
    "ConversationState",
    "ModelCatalog",
    "ModelInfo",
    "ModelPrice",
    "OffloadStore",
    "Pipeline",
    "PipelineError",
    "Policy",
    "PolicyBounds",
    "PolicyError",
    "Report",
    "RequestRejected",
    "Stage",
    "StageContext",
    "StageReport",
    "StoreError",
    "Summarizer",
    "TokenCounter",
    "compact",
    "conversation_id",
    "encoding",
    "estimate_tokens",
    "observed_break",
]
