"""An OpenAI Responses client, an OpenAI-compatible Responses upstream behind: its
requests <-> the pipeline's chat form, and what the gateway reads of its answers. No I/O.

- ``items``: ``instructions`` and ``input`` items as chat messages and back, each item the
  pipeline left alone as it came;
- ``request``: ``parse_request`` (checks, the split for the pipeline), ``to_request``;
- ``answers``: usage in chat form, a stream's error event.
"""

from gateway.codecs.responses.answers import chat_usage, error_event, response_of
from gateway.codecs.responses.items import (
    StoredItems,
    chat_messages,
    pairing_key,
    response_items,
    stored_items,
)
from gateway.codecs.responses.request import (
    InboundRequest,
    from_body,
    input_items,
    parse_request,
    to_request,
)

__all__ = [
    "InboundRequest",
    "StoredItems",
    "chat_messages",
    "chat_usage",
    "error_event",
    "from_body",
    "input_items",
    "pairing_key",
    "parse_request",
    "response_items",
    "response_of",
    "stored_items",
    "to_request",
]
