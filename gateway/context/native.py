"""Provider-native context management at the gateway: which of honour, polyfill or off a
request's ``context_management`` gets (``plan``), and the answer's account of what the
gateway applied itself (``with_applied_edits``, ``applied_events``, ``applied_chunks``).

Anthropic's edits (``pipelines.native``) reach the gateway in a Messages request's or a
chat request's ``context_management``:

- on ``/v1/messages`` to Claude, the upstream applies them: ``honour``. The request goes
  up with them as sent, and Anthropic's answer, with its ``applied_edits`` and any
  ``compaction`` block, is relayed as it came;
- on ``/v1/messages`` to an OpenAI-compatible model (a Claude model behind an
  OpenAI-compatible router included), and on ``/v1/chat/completions`` to any model (the
  chat API has no such field), the upstream cannot: ``polyfill``. The pipeline applies
  them (stage ``native_edits``), the field does not go up, and the answer carries
  ``context_management.applied_edits`` as Anthropic's would: on the message (Messages),
  in the ``message_delta`` event (a Messages stream), at the completion's top level (chat),
  in a last chunk before ``[DONE]`` (a chat stream).

A ``polyfill`` request whose edits the API would refuse is refused (400, naming the
field); an ``honour`` one goes up as it is, and the upstream's 400 comes back.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, Final

import orjson

from gateway.errors import InvalidRequest
from gateway.http.sse import event_data
from pipelines import Policy
from pipelines.budget import BUDGET_FLOOR
from pipelines.native import NativeEditError, NativePlan, parse_edits, stepped_back

__all__ = [
    "FIELD",
    "applied_chunks",
    "applied_events",
    "plan",
    "planned_policy",
    "with_applied_edits",
    "without_field",
]

FIELD: Final = "context_management"


def plan(
    body: Mapping[str, Any],
    policy: Policy,
    *,
    upstream_applies: bool,
    upstream: str,
) -> NativePlan | None:
    """What the pipeline does about ``body``'s Anthropic ``context_management``:
    ``honour`` when the upstream (named ``upstream`` for the report) applies it itself,
    ``polyfill`` otherwise; ``None`` when the body has none or the policy says ``off``."""
    management = body.get(FIELD)
    if management is None or policy.native == "off":
        return None
    if upstream_applies:
        try:
            edits = parse_edits(management)
        except NativeEditError:
            return None  # the upstream's 400 says what is wrong
        reason = f"{upstream} applies context_management itself; the request goes up with it"
        return NativePlan("honour", edits, reason)
    try:
        edits = parse_edits(management)
    except NativeEditError as exc:
        raise InvalidRequest(str(exc), code="invalid_request_error", param=exc.param) from exc
    reason = f"{upstream} has no context_management; the gateway applies the edits itself"
    return NativePlan("polyfill", edits, reason)


def planned_policy(policy: Policy, native: NativePlan | None, *, blocks: bool) -> Policy:
    """``policy`` stepped back from what the client delegated (``pipelines.native``).
    A client that cannot take compaction blocks (``blocks`` false: the chat API) and asks
    for compaction gets the gateway's own, from the client's trigger on: its budget capped
    so that the policy's ``trigger`` falls there."""
    if native is None:
        return policy
    compact = native.edits.compact
    if compact is None or blocks:
        return stepped_back(policy, native.edits)
    cap = max(BUDGET_FLOOR, math.ceil(compact.trigger / policy.trigger))
    capped = replace(policy, max_input=min(policy.max_input or cap, cap))
    return stepped_back(capped, replace(native.edits, compact=None))


def without_field(request: dict[str, Any]) -> dict[str, Any]:
    """``request`` without ``context_management``, for an upstream that has none."""
    if FIELD not in request:
        return request
    return {key: value for key, value in request.items() if key != FIELD}


def with_applied_edits(body: bytes, edits: Sequence[Mapping[str, Any]]) -> bytes:
    """An answer's JSON (a Messages message or a chat completion) with
    ``context_management.applied_edits``; as it is when there are none or it is not an
    object."""
    if not edits:
        return body
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    if not isinstance(answer, dict):
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
    template: dict[str, Any] = {}
    async for chunk in chunks:
        data = event_data(chunk).strip()
        if data == b"[DONE]" and edits:
            yield b"data: " + orjson.dumps(_last_chunk(template, edits)) + b"\n\n"
        elif not template and data.startswith(b"{"):
            try:
                found = orjson.loads(data)
            except orjson.JSONDecodeError:
                found = None
            if isinstance(found, dict):
                template = found
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
        try:
            data = orjson.loads(line[5:])
        except orjson.JSONDecodeError:
            return event
        if not isinstance(data, dict) or data.get("type") != kind:
            return event
        data[FIELD] = {"applied_edits": list(edits)}
        lines[index] = b"data: " + orjson.dumps(data)
        return b"\n".join(lines)
    return event
