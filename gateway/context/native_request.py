"""One request's provider-native context management, as ``context.compaction.compact``
runs it (``docs/DECISIONS.md``, "Provider-native context management"): the plan (honour,
polyfill, prefer; ``native_request``, from ``context.native``) and the policy stepped back
for it; on the Messages route the gateway's latest compaction block expanded into its
checkpoint (``context.compaction_block``); whether the client's compaction is due
(``compaction_due``, against ``edited_tokens``) and, once the pipeline made it, its block
(``compaction_block_for``) and the conversation's record taking the checkpoint as the
history sent (``checkpointed``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Literal

from opentelemetry import trace

from gateway.context.call import Call, Services, Target
from gateway.context.compaction_block import block, expanded, latest_block
from gateway.context.native import (
    compacts_server_side,
    plan,
    planned_policy,
    preferred,
    responses_plan,
)
from gateway.providers.anthropic import AnthropicUpstream
from pipelines import CompactResult, Policy, StoreError
from pipelines.budget import Budget
from pipelines.cache_break import without_markers
from pipelines.native import Compact, NativePlan

__all__ = [
    "checkpointed",
    "compaction_block_for",
    "compaction_due",
    "edited_tokens",
    "native_request",
]


async def native_request(
    services: Services,
    call: Call,
    api: Literal["messages", "chat", "responses"] | None,
    body: dict[str, Any],
    management: Any,
    policy: Policy,
    target: Target | None,
    history_seen: bool,
    dry_run: bool,
) -> tuple[NativePlan | None, Policy, dict[str, Any], str | None]:
    """The request's native context management (``gateway.context.native``): its plan,
    the policy stepped back from what it delegates, and on the Messages route the body
    with the gateway's latest compaction block expanded into its checkpoint, with the
    conversation that checkpoint was made in."""
    if api is None:
        return None, policy, body, None
    native = _native_plan(services, api, body, management, policy, target, history_seen)
    bounds = call.caller.profile.bounds
    policy = planned_policy(policy, native, blocks=api != "chat", bounds=bounds)
    if native is not None and not dry_run:
        _note_native(services, native)
    if api != "messages" or latest_block(body.get("messages") or ()) is None:
        return native, policy, body, None
    try:
        secret: bytes | None = await services.stores.secret()
    except StoreError:
        secret = None
    found = await expanded(
        body,
        services.stores.for_request(),
        call.caller.namespace,
        secret,
        ttl=policy.offload_ttl,
        ours_only=native is not None and native.polyfilled,
    )
    if found.fallback:
        trace.get_current_span().set_attribute("contextgate.compaction.checkpoint", "gone")
    return native, policy, found.body, found.conversation


def _native_plan(
    services: Services,
    api: str,
    body: Mapping[str, Any],
    management: Any,
    policy: Policy,
    target: Target | None,
    history_seen: bool,
) -> NativePlan | None:
    """What the request's native context management asks of the gateway, or what the
    policy's ``native=prefer`` asks of the provider (``gateway.context.native``)."""
    model = str(body.get("model", ""))
    provider = target.provider if target is not None else services.upstream_for(model)
    anthropic = isinstance(provider, AnthropicUpstream)
    if api == "responses":
        native = responses_plan(management, policy)
    else:
        upstream = "Anthropic" if anthropic else "the upstream"
        applies = api == "messages" and anthropic
        native = plan(
            body, policy, upstream_applies=applies, upstream=upstream, blocks=api == "messages"
        )
    if policy.native != "prefer":
        return native
    compacts = (api == "messages" and anthropic and compacts_server_side(model)) or (
        api == "responses" and history_seen
    )
    budget = Budget.for_request(services.pipeline.catalog.lookup(model), policy, body)
    tokens = budget.input_tokens
    asked = preferred(
        api, provider_compacts=compacts, budget=tokens, policy=policy, honoured=native
    )
    return asked or native


def _note_native(services: Services, native: NativePlan) -> None:
    """Count the request's native edits and name them on its span, apart from the
    gateway's own stages."""
    edits = native.edits.kinds if native.api == "anthropic" else ("compaction",)
    for edit in edits:
        services.metrics.native_edits.labels(edit=edit, mode=native.mode).inc()
    span = trace.get_current_span()
    span.set_attribute("contextgate.native.mode", native.mode)
    span.set_attribute("contextgate.native.edits", list(edits))


def checkpointed(result: CompactResult) -> CompactResult:
    """``result`` whose record takes the history as it went up (the checkpoint's) for the
    history as received: the client's next request, the block expanded into its
    checkpoint, continues that one."""
    sent = without_markers(result.request.get("messages") or [])
    tokens = result.report.tokens_after
    state = result.state.standing_for(sent, sent_tokens=tokens, cold=True)
    # Cuts index the history as received, which the checkpoint replaces: made again.
    fresh = {"media_cut": 0, "soft_cut": 0, "archive_cut": 0, "compacted_cut": 0}
    state = state.with_cuts(**fresh, compacted_pins=(), checkpoint=None)
    return replace(result, state=state)


def compaction_due(native: NativePlan | None, result: CompactResult) -> Compact | None:
    """The client's ``compact_20260112`` when the gateway makes it and this request is
    over its trigger (once the client's other edits are applied)."""
    if native is None or not native.polyfilled or native.edits.compact is None:
        return None
    edit = native.edits.compact
    return edit if edited_tokens(result) >= edit.trigger else None


def edited_tokens(result: CompactResult) -> int:
    """The request's tokens once the client's other edits are applied: what its
    compaction trigger is compared with, as the API applies the edits in turn (the
    client's request: without the tools the gateway added)."""
    report = result.report
    stage = report.stage("native_edits")
    cleared = stage.tokens_before - stage.tokens_after if stage is not None else 0
    return report.received_tokens - cleared


async def compaction_block_for(
    services: Services, namespace: str, conversation: str, policy: Policy, result: CompactResult
) -> dict[str, Any] | None:
    """The compaction block for ``result``; ``None`` when its checkpoint could not be
    stored (the request goes on compacted, the client keeps its history)."""
    removed = result.report.tokens_before - result.report.tokens_after
    try:
        return await block(
            result.request,
            services.stores.for_request(),
            namespace,
            await services.stores.secret(),
            ttl=policy.offload_ttl,
            removed=removed,
            conversation=conversation,
        )
    except StoreError:
        return None
