"""Written by ``python -m gateway.codecs.messages.derive`` from the installed
``anthropic`` SDK's request types: do not edit (a test derives them again)."""

from typing import Final

ROLES: Final = frozenset({"assistant", "system", "user"})
"""The roles of ``messages`` the SDK knows."""
BLOCK_FIELDS: Final = {
    "text": (("text", str),),
    "image": (("source", dict),),
    "tool_use": (("id", str), ("input", dict), ("name", str)),
    "tool_result": (("tool_use_id", str),),
    "thinking": (("signature", str), ("thinking", str)),
    "redacted_thinking": (("data", str),),
}
"""The fields the SDK requires of a block of each kind the codec converts, with their
types (other fields, and other kinds of block, are the API's to check)."""
SOURCE_FIELDS: Final = {"base64": (("data", str), ("media_type", str)), "url": (("url", str),)}
"""The fields an image's ``base64`` or ``url`` source requires."""
SYSTEM_BLOCKS: Final = frozenset({"text"})
"""The block kinds the top-level ``system`` takes."""
TURN_BLOCKS: Final = {
    "text": (("text", str),),
    "tool_addition": (("tool", dict),),
    "tool_removal": (("tool", dict),),
}
"""The block kinds a mid-conversation system message takes, with their required fields."""
THINKING_KINDS: Final = frozenset({"adaptive", "between_tools", "disabled", "enabled"})
"""The kinds of ``thinking`` setting the SDK knows."""
CUSTOM_TOOL: Final = (("input_schema", dict), ("name", str))
"""The fields a custom tool requires."""
COUNTED: Final = frozenset(
    {
        "billing_policy",
        "cache_control",
        "compaction",
        "context_management",
        "mcp_servers",
        "messages",
        "model",
        "output_config",
        "speed",
        "system",
        "thinking",
        "tool_choice",
        "tools",
        "user_profile_id",
        "workspace_id",
    }
)
"""The fields Anthropic's ``count_tokens`` takes (it refuses the rest), beta ones
included: a field that changes the count (``context_management``, a top-level
``cache_control``, ...) is not dropped. The SDK sends ``betas`` as a header."""
