"""Settings of the providers the gateway forwards to: the OpenAI-compatible upstream and
Anthropic."""

from __future__ import annotations

import re

import msgspec

from gateway.config.errors import ConfigError

__all__ = ["AnthropicSettings", "UpstreamSettings"]


class UpstreamSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The default OpenAI-compatible upstream."""

    base_url: str = "https://api.openai.com/v1"
    """Base URL ending in the API version, e.g. ``https://api.openai.com/v1``."""
    api_key: str | None = None
    """Key sent upstream instead of the caller's; ``None``: pass the caller's through."""
    connect_timeout: float = 10.0
    """Seconds to establish a connection."""
    read_timeout: float = 600.0
    """Seconds to wait for the next bytes of a response (reasoning models think long)."""
    write_timeout: float = 60.0
    """Seconds to send the request body."""
    pool_timeout: float = 10.0
    """Seconds to wait for a pooled connection."""
    max_connections: int | None = None
    """Open connections at most; ``None``: no cap, so streams never queue behind others."""
    max_keepalive_connections: int = 256
    """Idle connections kept for reuse."""
    pool_shards: int = 16
    """Independent connection pools the connections are spread over (see
    ``gateway.providers.openai.Upstream``); the limits above are totals across them."""
    keepalive_expiry: float = 30.0
    """Seconds an idle connection is kept."""
    max_error_body_bytes: int = 1_048_576
    """Largest upstream error body relayed; longer ones are cut."""

    def __post_init__(self) -> None:
        if not re.match(r"^https?://[^/\s]+", self.base_url):
            raise ConfigError(f"upstream.base_url must be an http(s) URL, got {self.base_url!r}")
        if self.api_key is not None and not self.api_key.isascii():
            raise ConfigError("upstream.api_key must be ASCII")
        for name in ("connect_timeout", "read_timeout", "write_timeout", "pool_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"upstream.{name} must be positive")
        if self.max_connections is not None and self.max_connections < 1:
            raise ConfigError("upstream.max_connections must be at least 1 or null")
        if not 1 <= self.pool_shards <= 256:
            raise ConfigError("upstream.pool_shards must be between 1 and 256")


class AnthropicSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The built-in Anthropic provider (``claude-*`` models)."""

    base_url: str = "https://api.anthropic.com"
    api_key: str | None = None
    """The Anthropic key (``CONTEXTGATE_ANTHROPIC_API_KEY``); ``None``: in passthrough
    mode the caller's own key goes, with tenants ``claude-*`` models are refused. The
    OpenAI upstream's key is never sent to Anthropic."""
    enabled: bool = True
    """``false``: ``claude-*`` models go to the OpenAI-compatible upstream like any other
    (a proxy that serves them in OpenAI form)."""
