"""Claude's thinking binding, for the routes that send a request to Claude (a chat
client's and a Messages client's alike).

Models that bind thinking blocks to the prompt before them refuse a request whose thinking
blocks go back behind a prefix that changed, as compaction changes it. Under the beta
``THINKING_BINDING_BETA`` a request may ask the API to drop such blocks instead:
``sends_thinking`` says whether a request sends thinking back at all (only then is the
binding asked for), ``unbinding`` gives the ``thinking`` setting that asks it, and
``with_beta`` adds the beta to the request's headers. No I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = ["THINKING_BINDING_BETA", "sends_thinking", "unbinding", "with_beta"]

THINKING_BINDING_BETA: Final = "thinking-binding-controls-2026-08-01"
"""The beta under which a request may ask the API to drop thinking blocks whose prefix
changed instead of refusing the request (``thinking.block_binding``)."""


def unbinding(thinking: Any) -> dict[str, Any] | None:
    """The ``thinking`` setting ``thinking`` (``None``: the client gave none) with thinking
    blocks whose prefix changed since the model wrote them dropped by the API rather than
    refused (``block_binding.prefix_mismatch_behavior: "drop_block"``); ``None`` to leave
    the request as it is: thinking turned off, or a ``block_binding`` of the client's own.
    Models that bind thinking to its prefix think adaptively by default, so giving the
    setting where the client gave none changes nothing else."""
    binding = {"prefix_mismatch_behavior": "drop_block"}
    if thinking is None:
        return {"type": "adaptive", "block_binding": binding}
    if not isinstance(thinking, Mapping) or thinking.get("type") not in ("adaptive", "enabled"):
        return None
    if thinking.get("block_binding") is not None:
        return None
    return {**thinking, "block_binding": binding}


def sends_thinking(chat: Mapping[str, Any]) -> bool:
    """Whether chat request ``chat`` sends thinking blocks back (an assistant message's
    ``thinking_blocks``, or thinking parts in its content)."""
    for message in chat.get("messages") or ():
        if message.get("role") != "assistant":
            continue
        if message.get("thinking_blocks"):
            return True
        content = message.get("content")
        if isinstance(content, list) and any(
            isinstance(part, Mapping) and part.get("type") in ("thinking", "redacted_thinking")
            for part in content
        ):
            return True
    return False


def with_beta(headers: Mapping[str, str], beta: str) -> dict[str, str]:
    """``headers`` (lower-case names) with ``beta`` among their ``anthropic-beta`` values."""
    betas = [b.strip() for b in headers.get("anthropic-beta", "").split(",") if b.strip()]
    if beta not in betas:
        betas.append(beta)
    return {**headers, "anthropic-beta": ",".join(betas)}
