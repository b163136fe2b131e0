"""The ``context_restore`` tool as the model sees it, and when a request gets it.

``RESTORE_TOOL`` is the function tool the gateway appends to a conversation's tools
(``with_restore_tool``, which refuses requests it cannot be added to); ``has_refs`` tells
whether an outgoing body names any offloaded object, which is when a conversation that
brings no tools of its own first gets it (``gateway.context.compaction``).
"""

from __future__ import annotations

import re
from typing import Any, Final

from gateway.store import REF_PATTERN

__all__ = ["RESTORE_TOOL", "RESTORE_TOOL_NAME", "has_refs", "with_restore_tool"]

RESTORE_TOOL_NAME: Final = "context_restore"

RESTORE_TOOL: Final[dict[str, Any]] = {
    "type": "function",
    "function": {
        "name": RESTORE_TOOL_NAME,
        "description": (
            "Restore content that was removed from earlier in this conversation to save"
            " space. Placeholders in the conversation name it by a ref such as"
            " ctx_AbC123...; pass that ref. Large content comes back in line ranges: pass"
            " start_line (and end_line) to read further. Use this instead of guessing what"
            " removed content said."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "ref": {"type": "string", "description": "The ref, starting with ctx_."},
                "start_line": {"type": "integer", "minimum": 1},
                "end_line": {"type": "integer", "minimum": 1},
                "start_char": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "Where to go on inside a very long line.",
                },
            },
            "required": ["ref"],
            "additionalProperties": False,
        },
    },
}


_REF_BYTES: Final = re.compile(REF_PATTERN.pattern.encode())


def has_refs(body: bytes) -> bool:
    """Whether an outgoing request body names any offloaded object (searched as bytes: a
    resent history is large, and decoding it on every request to look is waste)."""
    return b"ctx_" in body and _REF_BYTES.search(body) is not None


def with_restore_tool(request: dict[str, Any]) -> dict[str, Any] | None:
    """``request`` with the restore tool appended to its tools, or ``None`` when it cannot
    be: the request uses the legacy ``functions`` field, asks for several choices (``n``),
    or defines a tool of that name."""
    if request.get("functions") is not None:
        return None
    n = request.get("n")
    if isinstance(n, int) and n > 1:
        return None
    tools = request.get("tools") or []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and function.get("name") == RESTORE_TOOL_NAME:
            return None
    return {**request, "tools": [*tools, RESTORE_TOOL]}
