"""Provider-native context management at the gateway: what a request's
``context_management`` gets (``plan`` for Anthropic's edits and on-demand compaction,
``responses_plan`` for the Responses API's; ``preferred`` under the policy's
``native=prefer``), the policy stepped back for it (``planned_policy``), and the answer's
account of what the gateway applied itself (``with_applied_edits``, ``applied_events``,
``applied_chunks``). ``gateway.context.native_request`` runs these for one request.

Anthropic's edits (``pipelines.native``) reach the gateway in a Messages request's or a
chat request's ``context_management``:

- on ``/v1/messages`` to Claude, the upstream applies them: ``honour``. The request goes
  up with them as sent, and Anthropic's answer, with its ``applied_edits`` and any
  ``compaction`` block, is relayed as it came;
- on ``/v1/messages`` to an OpenAI-compatible model (a Claude model behind an
  OpenAI-compatible router included), and on ``/v1/chat/completions`` to any model (the
  chat API has no such field), the upstream cannot: ``polyfill``. The gateway applies
  them (stage ``native_edits``; a compaction in ``native_request``), the field does not go
  up (``without_field``), and the answer carries ``context_management.applied_edits`` as
  Anthropic's would: on the message (Messages), in the ``message_delta`` event (a
  Messages stream), at the completion's top level (chat), in a last chunk before
  ``[DONE]`` (a chat stream);
- with ``native=prefer``, a request that asks no compaction of its own to a provider
  that compacts server-side gets the provider's (``preferred_field``, after the client's
  own edits). With ``native=off`` there is no plan.

A ``polyfill`` request whose edits the API would refuse is refused (400, naming the
field); an ``honour`` one goes up as it is, for the upstream's 400.
"""

from __future__ import annotations

import math
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, Final

import orjson

from gateway.codecs.json_body import json_dict
from gateway.context.restore import RESTORE_TOOL_NAME
from gateway.errors import InvalidRequest
from gateway.http.sse import event_data, event_json
from pipelines import Policy, PolicyError
from pipelines.budget import BUDGET_FLOOR
from pipelines.native import (
    COMPACT,
    Compact,
    NativeEditError,
    NativeEdits,
    NativePlan,
    on_demand,
    parse_edits,
    stepped_back,
)
from pipelines.policy import BOUNDS, PolicyBounds

__all__ = [
    "COMPACT_BETA",
    "FIELD",
    "applied_chunks",
    "applied_events",
    "compacts_server_side",
    "plan",
    "planned_policy",
    "preferred",
    "preferred_field",
    "responses_plan",
    "with_applied_edits",
    "without_field",
]

FIELD: Final = "context_management"
ON_DEMAND: Final = "compaction"
"""A Messages request's on-demand compaction (beta ``compact-2026-09-04``)."""
_COMPACTING: Final = re.compile(
    r"claude-(?:(?:opus|sonnet)-4-(?:[6-9]|[1-9]\d)|[a-z]+-(?:[5-9]|[1-9]\d))(?![0-9])"
)
_MAX_INPUT: Final = int(BOUNDS["max_input"][1])
COMPACT_BETA: Final = "compact-2026-01-12"
MIN_PROVIDER_TRIGGER: Final = 50_000
"""The least trigger a provider's compaction takes (Anthropic's ``compact_20260112``):
below it, ``prefer`` leaves compaction to the gateway."""


def plan(
    body: Mapping[str, Any],
    policy: Policy,
    *,
    upstream_applies: bool,
    upstream: str,
    blocks: bool = True,
) -> NativePlan | None:
    """What the pipeline does about ``body``'s Anthropic ``context_management`` (and,
    where the client takes compaction blocks, ``blocks``, its on-demand ``compaction``):
    ``honour`` when the upstream (named ``upstream`` for the report) applies it itself,
    ``polyfill`` otherwise; ``None`` when the body has none or the policy says ``off``."""
    management, asked = body.get(FIELD), body.get(ON_DEMAND) if blocks else None
    if (management is None and asked is None) or policy.native == "off":
        return None
    try:
        edits = parse_edits(management)
        now = on_demand(asked)
    except NativeEditError as exc:
        if upstream_applies:
            return None  # the upstream's 400 says what is wrong
        raise InvalidRequest(str(exc), code="invalid_request_error", param=exc.param) from exc
    if now is not None:
        edits = replace(edits, compact=now)
    if upstream_applies:
        reason = f"{upstream} applies context_management itself; the request goes up with it"
        return NativePlan("honour", edits, reason)
    reason = f"{upstream} has no context_management; the gateway applies the edits itself"
    return NativePlan("polyfill", edits, reason, host_tools=frozenset({RESTORE_TOOL_NAME}))


def responses_plan(management: Any, policy: Policy) -> NativePlan | None:
    """What the pipeline does about a Responses request's ``context_management`` (a list
    of ``{"type": "compaction", "compact_threshold": n}``): the upstream's Responses API
    compacts itself, so ``honour``; ``None`` when there is none or the policy says
    ``off``. A list the API would refuse goes up as it is, for its 400."""
    if not isinstance(management, list) or not management or policy.native == "off":
        return None
    thresholds = [
        entry.get("compact_threshold")
        for entry in management
        if isinstance(entry, Mapping) and entry.get("type") == "compaction"
    ]
    if not thresholds:
        return None
    threshold = thresholds[0]
    trigger = threshold if isinstance(threshold, int) and threshold > 0 else None
    edits = NativeEdits(compact=Compact(trigger) if trigger is not None else Compact())
    reason = "the upstream's Responses API compacts itself; the request goes up with it"
    return NativePlan("honour", edits, reason, api="openai")


def compacts_server_side(model: str) -> bool:
    """Whether Anthropic compacts ``model``'s requests itself (``compact_20260112``):
    Claude Opus and Sonnet from 4.6, and every Claude from 5."""
    return _COMPACTING.match(model) is not None


def preferred(
    api: str,
    *,
    provider_compacts: bool,
    budget: int,
    policy: Policy,
    honoured: NativePlan | None = None,
) -> NativePlan | None:
    """With the policy's ``native=prefer``, for a request that asks no compaction of its
    own (none, or only edits the provider applies: ``honoured``, kept beside it): the
    provider's compaction, asked at the gateway's own ``trigger`` of the budget, when the
    provider compacts server-side and the client can send its compaction back (Messages
    to Claude, stateless Responses) and the trigger is at least the API's least
    (``MIN_PROVIDER_TRIGGER``)."""
    if policy.native != "prefer" or not provider_compacts:
        return None
    if honoured is not None and (honoured.mode != "honour" or honoured.edits.compact):
        return None
    trigger = int(policy.trigger * budget)
    if trigger < MIN_PROVIDER_TRIGGER:
        return None
    reason = (
        f"policy native=prefer: the provider is asked to compact from {trigger:,} input tokens"
        " instead of the gateway's own summary"
    )
    kept = honoured.edits if honoured is not None else NativeEdits()
    edits = replace(kept, compact=Compact(trigger))
    return NativePlan("prefer", edits, reason, api="openai" if api == "responses" else "anthropic")


def preferred_field(native: NativePlan, sent: Any = None) -> Any:
    """The ``context_management`` that asks the provider for ``native``'s compaction, in
    the plan's API (Anthropic's edit, or the Responses API's list), after the client's own
    (``sent``, the edits the provider applies for it)."""
    compact = native.edits.compact
    assert compact is not None
    if native.api == "openai":
        own = list(sent) if isinstance(sent, list) else []
        return [*own, {"type": "compaction", "compact_threshold": compact.trigger}]
    trigger = {"type": "input_tokens", "value": compact.trigger}
    edits = sent.get("edits") if isinstance(sent, Mapping) else None
    own = list(edits) if isinstance(edits, list) else []
    return {**(sent or {}), "edits": [*own, {"type": COMPACT, "trigger": trigger}]}


def planned_policy(
    policy: Policy, native: NativePlan | None, *, blocks: bool, bounds: PolicyBounds | None = None
) -> Policy:
    """``policy`` stepped back from what the client delegated (``pipelines.native``),
    within ``bounds`` (the caller's: a key the configuration locks keeps its value, a
    bounded one stays in its range). A client that cannot take compaction blocks
    (``blocks`` false: the chat API) and asks for compaction gets the gateway's own, from
    the client's trigger on: its budget capped so that the policy's ``trigger`` falls
    there."""
    if native is None:
        return policy
    compact = native.edits.compact
    if compact is None or blocks:
        stepped = stepped_back(policy, native.edits)
    else:
        cap = min(max(BUDGET_FLOOR, math.ceil(compact.trigger / policy.trigger)), _MAX_INPUT)
        capped = replace(policy, max_input=min(policy.max_input or cap, cap))
        stepped = stepped_back(capped, replace(native.edits, compact=None))
    return _within(stepped, policy, bounds) if bounds is not None else stepped


def _within(stepped: Policy, policy: Policy, bounds: PolicyBounds) -> Policy:
    """``stepped`` with each key it changed from ``policy`` kept within ``bounds``: the
    configuration's value where the key is locked or its values listed, the range's edge
    where it is bounded; ``policy`` when that leaves no valid policy."""
    changes: dict[str, Any] = {}
    for name in (
        "prepare",
        "light",
        "trigger",
        "filter_tokens",
        "soft_ratio",
        "hard_ratio",
        "max_input",
    ):
        value, before = getattr(stepped, name), getattr(policy, name)
        if value == before:
            continue
        key = name.replace("_", "-")
        if key in bounds.locked or key in bounds.choices:
            changes[name] = before
        elif key in bounds.ranges and value is not None:
            low, high = bounds.ranges[key]
            clamped = type(value)(min(max(value, low), high))
            # Stepping back defers the gateway's work: a clamp that would bring it
            # earlier than the policy had it keeps the policy's value.
            later = before is not None and clamped >= before and name != "max_input"
            changes[name] = clamped if later or name == "max_input" else before
    if not changes:
        return stepped
    try:
        return replace(stepped, **changes)
    except PolicyError:
        return policy


def without_field(request: dict[str, Any]) -> dict[str, Any]:
    """``request`` without ``context_management``, for an upstream that has none."""
    if FIELD not in request:
        return request
    return {key: value for key, value in request.items() if key != FIELD}


def with_applied_edits(body: bytes, edits: Sequence[Mapping[str, Any]]) -> bytes:
    """An answer's JSON (a Messages message or a chat completion) with
    ``context_management.applied_edits``; as it is when there are none or it is not an
    object."""
    answer = json_dict(body) if edits else None
    if answer is None:
        return body
    answer[FIELD] = {"applied_edits": list(edits)}
    return orjson.dumps(answer)


async def applied_events(
    events: AsyncIterator[bytes], edits: Sequence[Mapping[str, Any]]
) -> AsyncIterator[bytes]:
    """A Messages stream with ``context_management.applied_edits`` in its
    ``message_delta`` event, where Anthropic's stream carries it."""
    async for event in events:
        if edits and b"message_delta" in event:
            event = _with_field(event, "message_delta", edits)
        yield event


async def applied_chunks(
    chunks: AsyncIterator[bytes], edits: Sequence[Mapping[str, Any]]
) -> AsyncIterator[bytes]:
    """A chat completions stream with a last chunk, before ``[DONE]``, that carries
    ``context_management.applied_edits`` (and no choices)."""
    template: dict[str, Any] | None = None
    async for chunk in chunks:
        if edits and event_data(chunk).strip() == b"[DONE]":
            yield b"data: " + orjson.dumps(_last_chunk(template or {}, edits)) + b"\n\n"
        elif template is None:
            template = event_json(chunk)
        yield chunk


def _last_chunk(template: Mapping[str, Any], edits: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    chunk = {key: template[key] for key in ("id", "object", "created", "model") if key in template}
    chunk.setdefault("object", "chat.completion.chunk")
    chunk["choices"] = []
    chunk[FIELD] = {"applied_edits": list(edits)}
    return chunk


def _with_field(event: bytes, kind: str, edits: Sequence[Mapping[str, Any]]) -> bytes:
    """The SSE ``event`` with ``context_management`` in its data when it is a ``kind``."""
    lines = event.split(b"\n")
    for index, line in enumerate(lines):
        if not line.startswith(b"data:"):
            continue
        data = json_dict(line[5:])
        if data is None or data.get("type") != kind:
            return event
        data[FIELD] = {"applied_edits": list(edits)}
        lines[index] = b"data: " + orjson.dumps(data)
        return b"\n".join(lines)
    return event
