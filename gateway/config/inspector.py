"""Settings of the context inspector: the ledger of what the gateway did to each
conversation's requests (``gateway.store.ledger``), its JSON API and its page."""

from __future__ import annotations

import msgspec

from gateway.config.errors import ConfigError

__all__ = ["InspectorSettings"]


class InspectorSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The ledger, ``GET /v1/context/conversations`` and the page at ``/ui/``."""

    enabled: bool = True
    """Keep the ledger and serve its JSON API; off, nothing is recorded and the API's
    routes answer 404 (the page too)."""
    ui: bool = True
    """Serve the page at ``/ui/``; off, ``/ui/`` is a 404 while the JSON API stays."""
    anonymous: bool = False
    """Keep and show the ledger of requests sent without a key (a gateway with its own
    upstream key and no tenants): they all share one namespace, so anyone who can reach
    the gateway could read them all. Off, such requests are not recorded."""
    requests_per_conversation: int = 200
    """Entries kept per conversation, the oldest dropped first."""
    detailed_requests: int = 5
    """The latest requests of a conversation whose detail (the messages the client sent
    beside those that went up) is kept; older entries keep their summary only."""
    conversations_per_namespace: int = 1_000
    """Conversations kept per namespace, the least recently active dropped first."""
    memory_max_bytes: int = 2 * 1024 * 1024
    """Bytes the in-memory ledger may hold in all (without Redis)."""
    ttl: int = 86_400
    """Seconds a conversation's ledger is kept after its last request."""

    def __post_init__(self) -> None:
        if not 1 <= self.requests_per_conversation <= 10_000:
            raise ConfigError("inspector.requests_per_conversation must be 1-10000")
        if not 0 <= self.detailed_requests <= self.requests_per_conversation:
            raise ConfigError("inspector.detailed_requests must be 0 to requests_per_conversation")
        if not 1 <= self.conversations_per_namespace <= 1_000_000:
            raise ConfigError("inspector.conversations_per_namespace must be 1-1000000")
        if self.memory_max_bytes < 1_048_576:
            raise ConfigError("inspector.memory_max_bytes must be at least 1 MiB")
        if not 60 <= self.ttl <= 30 * 86_400:
            raise ConfigError("inspector.ttl must be between 60 s and 30 days")
