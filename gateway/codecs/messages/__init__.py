"""An Anthropic Messages client: its requests <-> the pipeline's chat form, whatever model
answers (Claude natively, ``chat_anthropic`` for the way back; an OpenAI-compatible model
through ``messages_openai``). No I/O.

- ``checks``: checking an inbound Messages body, derived from the anthropic SDK's types;
- ``request``: ``parse_request``, ``from_request`` (the split for the pipeline) and
  ``to_request`` (the Messages request again, for an Anthropic upstream);
- ``blocks``: the system prompt, turns and blocks as chat messages and parts.

Anthropic's error envelope and stream events are ``codecs.anthropic_envelopes``'s.
"""

from gateway.codecs.messages.checks import ROLES, THINKING_KINDS, TURN_BLOCKS, checked_body
from gateway.codecs.messages.request import (
    InboundRequest,
    from_request,
    parse_request,
    to_request,
)

__all__ = [
    "ROLES",
    "THINKING_KINDS",
    "TURN_BLOCKS",
    "InboundRequest",
    "checked_body",
    "from_request",
    "parse_request",
    "to_request",
]
