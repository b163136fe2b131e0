"""Anthropic's ``compact_20260112`` made by the gateway for an upstream that cannot: the
compaction block it answers with, and what a block it made stands for when the client
sends it back.

When a Messages request that asks for compaction reaches its trigger, the gateway
compacts it with its own pipeline, under a policy that cuts deep
(``compaction_policy``): the span becomes the 11-field summary (notes naming the refs of
what was removed when summaries are off or fail), the protected tail stays. The
messages that came out, all but the system prompt, are the *checkpoint*: stored in the
offload store (tagged as one), in the caller's namespace, for ``offload-ttl`` (renewed at
each use), with the conversation's identity. The client gets a ``compaction`` block at
the head of the answer (``block``): its ``content`` the summary, readable; its
``encrypted_content`` the checkpoint's ref and the gateway's signature of the ref, the
content and the caller's namespace (an HMAC under the store's secret, which replicas
share), so nobody can make one the gateway did not, for another key, or with another
summary.

When the block comes back (``expanded``), everything before it is dropped, as the API
drops it, and the checkpoint's messages take its place, so the model reads what it read
when the compaction was made, followed by the rest of that answer and what came since;
the conversation keeps its identity. A block whose signature does not hold (forged,
another key's, its summary changed, a provider's own on a polyfilled route) is refused
with a 400 that says so. A signed block whose checkpoint is gone (past ``offload-ttl``,
or the store unavailable) is left out when the client still sent the history it
replaced (compacted again), and stands for its summary, which quotes the task and the
latest request, when the client dropped it: the session goes on rather than stop. A
block the gateway did not make, on a route where the provider compacts (honour), is the
provider's own: left alone.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, replace
from typing import Any, Final

import orjson

from gateway.codecs.json_body import json_dict
from gateway.errors import InvalidRequest
from pipelines import Policy, StoreError
from pipelines.budget import BUDGET_FLOOR
from pipelines.cache_break import without_markers
from pipelines.messages import SYSTEM_TURN, Message, message_text
from pipelines.ports import OffloadStore
from pipelines.stage import REF_PATTERN

__all__ = [
    "MARK",
    "Expanded",
    "block",
    "compaction_policy",
    "expanded",
    "latest_block",
]

MARK: Final = "contextgate.compaction.v1:"
"""What the ``encrypted_content`` of a compaction block the gateway made begins with."""
_DEEP: Final = 0.8
"""The utilisation a compaction runs the pipeline at: full compaction (``trigger``),
short of the emergency's deterministic shortening, so that a summary model is asked."""
_CHECKPOINT_TAG: Final = b"contextgate.checkpoint.v1\n"
"""What a stored checkpoint begins with: no other object of the store is taken for one."""
_QUOTED: Final = 2_000
"""Characters of the task and of the latest request a compaction's summary quotes."""
_LEAST_TARGET: Final = 0.05
"""The least ``target`` a policy takes."""
_GATEWAY_TEXTS: Final = ("[Recalled context:", "[Context note:")


def compaction_policy(policy: Policy, tokens: int, trigger: int) -> Policy:
    """``policy`` for compacting a request of ``tokens`` now, whose client compacts from
    ``trigger`` tokens: a budget the request fills to 80% (full compaction), aiming for a
    quarter of the request or half the trigger, whichever is less, so that the next
    requests do not compact again at once; the verbatim tail half of that aim."""
    budget = max(BUDGET_FLOOR, int(tokens / _DEEP) + 1)
    aim = max(_LEAST_TARGET, min(tokens / 4, trigger / 2) / budget)
    return replace(
        policy,
        max_input=budget,
        prepare=0.7,
        light=0.7,
        trigger=0.7,
        emergency=0.95,
        target=round(aim, 4),
        tail_ratio=round(min(policy.tail_ratio, aim / 2), 4),
    )


def latest_block(messages: Sequence[Message]) -> tuple[int, int] | None:
    """Where the latest ``compaction`` block is: its message's index and its part's."""
    for index in range(len(messages) - 1, -1, -1):
        content = messages[index].get("content")
        if messages[index].get("role") != "assistant" or not isinstance(content, list):
            continue
        for part_index in range(len(content) - 1, -1, -1):
            part = content[part_index]
            if isinstance(part, dict) and part.get("type") == "compaction":
                return index, part_index
    return None


def is_ours(part: Mapping[str, Any]) -> bool:
    encrypted = part.get("encrypted_content")
    return isinstance(encrypted, str) and encrypted.startswith(MARK)


@dataclass(frozen=True, slots=True)
class Expanded:
    """A request with the gateway's latest compaction block replaced by its checkpoint."""

    body: dict[str, Any]
    conversation: str | None = None
    """The conversation the checkpoint was made in (its identity does not change with the
    history the block replaced); ``None`` when no block of the gateway's was expanded."""
    fallback: bool = False
    """Whether the checkpoint was gone (expired, or the store unavailable) and the block's
    summary stood in for it."""


async def expanded(
    body: dict[str, Any],
    store: OffloadStore | None,
    namespace: str,
    secret: bytes | None,
    *,
    ttl: int,
    ours_only: bool,
) -> Expanded:
    """``body`` with what precedes its latest compaction block replaced by the checkpoint
    that block stands for, when the gateway made it (its signature checked under
    ``secret``, the store's: ``None`` when it cannot be read). A block the gateway did
    not make is refused when ``ours_only`` (the upstream could not read it), else left
    alone. A signed block whose checkpoint is gone (expired, or the store down) is left
    out when the client still sent the history it replaced, which the pipeline then
    compacts again, and stands for its summary when the client dropped that history."""
    messages = body.get("messages") or []
    found = latest_block(messages)
    if found is None:
        return Expanded(body)
    index, part_index = found
    turn = messages[index]
    part = turn["content"][part_index]
    content = part.get("content")
    if content is None:
        return Expanded(body)  # a failed compaction: a no-op, as the API treats it
    if not is_ours(part):
        if ours_only:
            raise _refused("was not made by this gateway")
        return Expanded(body)
    ref = _ref(part)
    _check_signature(part, ref, namespace, secret)
    checkpoint = await _checkpoint(ref, content, store, namespace, ttl)
    rest = [p for i, p in enumerate(turn["content"]) if i != part_index]
    after: list[Message] = []
    if rest or turn.get("tool_calls"):
        after.append({**turn, "content": rest or None})
    system = [m for m in messages[:index] if _is_system_prompt(m)]
    if checkpoint is not None:
        kept, conversation = checkpoint
        new = {**body, "messages": [*system, *kept, *after, *messages[index + 1 :]]}
        return Expanded(new, conversation)
    if any(not _is_system_prompt(m) for m in messages[:index]):
        # Gone, but the client sent the history it replaced: that history again.
        new = {**body, "messages": [*messages[:index], *after, *messages[index + 1 :]]}
    else:
        new = {**body, "messages": [*system, _recalled(content), *after, *messages[index + 1 :]]}
    return Expanded(new, None, fallback=True)


async def block(
    request: Mapping[str, Any],
    store: OffloadStore | None,
    namespace: str,
    secret: bytes,
    *,
    ttl: int,
    removed: int,
    conversation: str,
) -> dict[str, Any]:
    """The compaction block for ``request``, the pipeline's compaction of
    ``conversation`` (``removed`` tokens less than it had): its checkpoint stored, the
    block naming it, signed with ``secret`` for ``namespace``. ``StoreError`` when the
    store does not take it (then there is no compaction)."""
    if store is None:
        raise StoreError("no offload store")
    messages = request.get("messages") or []
    start = 0
    while start < len(messages) and _is_system_prompt(messages[start]):
        start += 1
    kept = without_markers(messages[start:])  # the gateway's markers are placed anew
    content = _summary(kept, removed)
    data = _CHECKPOINT_TAG + orjson.dumps(
        {"content": content, "messages": kept, "conversation": conversation}
    )
    ref = await store.put(namespace, data, ttl=ttl)
    signature = _signature(secret, namespace, ref, content)
    return {
        "type": "compaction",
        "content": content,
        "encrypted_content": f"{MARK}{ref}.{signature}",
    }


def _signature(secret: bytes, namespace: str, ref: str, content: str) -> str:
    """The gateway's signature of a block naming ``ref`` with ``content``, for
    ``namespace``: only this gateway makes it, only for this key."""
    message = b"\0".join((b"compaction", namespace.encode(), ref.encode(), content.encode()))
    mac = hmac.new(secret, message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac[:18]).decode()


def _ref(part: Mapping[str, Any]) -> str:
    """The ref a block of the gateway's names; a 400 when it names none."""
    ref = str(part["encrypted_content"])[len(MARK) :].partition(".")[0]
    if not REF_PATTERN.fullmatch(ref) or not isinstance(part.get("content"), str):
        raise _refused("was not made by this gateway")
    return ref


def _check_signature(
    part: Mapping[str, Any], ref: str, namespace: str, secret: bytes | None
) -> None:
    """A 400 unless the block naming the checkpoint ``ref`` is the gateway's, for this
    key, with the summary it made (forged, another key's, its content changed, or signed
    under a secret the store no longer has: a gateway without a configured
    ``store.secret`` makes a new one when it restarts). Not checked while the secret
    cannot be read (the store is down): the checkpoint cannot be read either, and what
    the block then brings in is the client's own text."""
    if secret is None:
        return
    signature = str(part["encrypted_content"])[len(MARK) :].partition(".")[2]
    expected = _signature(secret, namespace, ref, str(part["content"]))
    if not hmac.compare_digest(signature.encode(), expected.encode()):
        raise _refused(
            "was not made by this gateway for this key, or its content was changed (or the"
            " gateway's store secret changed since it was made: configure store.secret)"
        )


async def _checkpoint(
    ref: str, content: str, store: OffloadStore | None, namespace: str, ttl: int
) -> tuple[list[Message], str | None] | None:
    """The messages and conversation of the checkpoint ``ref`` names, renewed; ``None``
    when it is gone (expired, or the store unavailable)."""
    if store is None:
        return None
    try:
        data = await store.get(namespace, ref)
    except StoreError:
        return None
    checkpoint = _parsed(data) if data is not None else None
    if checkpoint is None or checkpoint.get("content") != content:
        return None
    touch = getattr(store, "touch", None)
    if touch is not None:
        with suppress(StoreError):  # read now; renewed on a later request
            await touch(namespace, ref, ttl)
    conversation = checkpoint.get("conversation")
    return checkpoint["messages"], conversation if isinstance(conversation, str) else None


def _parsed(data: bytes) -> dict[str, Any] | None:
    """A stored checkpoint, when ``data`` is one (its tag, an object, messages that are
    objects)."""
    if not data.startswith(_CHECKPOINT_TAG):
        return None
    checkpoint = json_dict(data[len(_CHECKPOINT_TAG) :])
    if checkpoint is None:
        return None
    messages = checkpoint.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        return None
    return checkpoint


def _recalled(content: str) -> Message:
    """What stands for a checkpoint that is gone: the block's summary, as recalled
    context."""
    return {
        "role": "user",
        "content": "[Recalled context: the summary of earlier messages of this conversation,"
        " which were compacted. This is not a new request.]\n" + content,
    }


def _refused(why: str) -> InvalidRequest:
    return InvalidRequest(
        f"The compaction block in messages {why}. Send back the compaction blocks this"
        " gateway returned, as they came, or the history they replaced.",
        code="invalid_request_error",
        param="messages",
    )


def _is_system_prompt(message: Message) -> bool:
    return message.get("role") in ("system", "developer") and not message.get(SYSTEM_TURN)


def _summary(messages: Sequence[Message], removed: int) -> str:
    """The compaction's readable content: the task (the first user message), the summary
    and notes the pipeline wrote, and the latest request; enough to go on from should the
    checkpoint be gone."""
    users = [message_text(m) for m in messages if m.get("role") == "user"]
    written = [text for text in users if text.startswith(_GATEWAY_TEXTS)]
    own = [text for text in users if text and not text.startswith(_GATEWAY_TEXTS)]
    head = (
        f"[contextgate compaction: {removed:,} tokens of earlier conversation were"
        " compacted; the gateway keeps what the model saw after it.]"
    )
    parts = [head]
    if own:
        parts.append("The task: " + _clipped(own[0]))
    parts.extend(written)
    if len(own) > 1:
        parts.append("The latest request: " + _clipped(own[-1]))
    return "\n\n".join(parts)


def _clipped(text: str) -> str:
    """``text`` up to ``_QUOTED`` characters, its middle cut."""
    if len(text) <= _QUOTED:
        return text
    half = _QUOTED // 2
    return f"{text[:half]}\n[... {len(text) - _QUOTED:,} characters ...]\n{text[-half:]}"
