"""Settings of the teams sharing the gateway, and of the limits on what each may ask."""

from __future__ import annotations

import re
from typing import Any

import msgspec

from gateway.config.errors import ConfigError

__all__ = ["LimitSettings", "TenantSettings"]


class LimitSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How much one tenant (in passthrough mode, one upstream key) may ask at once, counted
    across replicas in Redis (in the process without Redis). Past a limit the answer is 429
    with ``Retry-After``; when Redis cannot be asked, the request goes on (fail-open)."""

    concurrency: int | None = None
    """Requests in progress at once, a stream until its last event; ``None``: no limit."""
    requests_per_minute: int | None = None
    """Requests started per minute; a burst of as many is allowed at once, then they are
    admitted evenly. ``None``: no limit."""

    def __post_init__(self) -> None:
        for name in ("concurrency", "requests_per_minute"):
            value = getattr(self, name)
            if value is not None and not 1 <= value <= 1_000_000:
                raise ConfigError(f"limits.{name} must be between 1 and 1000000, or null")


class TenantSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A team sharing the gateway: its gateway keys (as hashes), its upstream credentials,
    the models it may use, its policy and what its callers may tune, and its limits."""

    name: str
    """Lower-case letters, digits and dashes; names the tenant's namespace."""
    keys: tuple[str, ...]
    """Hashes of the tenant's gateway keys, as ``contextgate hash-key`` prints them."""
    upstream_api_key: str | None = None
    """The key sent to the OpenAI-compatible upstream for this tenant (by ``${ENV}``
    reference); ``None``: the global ``upstream.api_key``."""
    anthropic_api_key: str | None = None
    """The key sent to Anthropic for this tenant; ``None``: the global ``anthropic.api_key``."""
    models: tuple[str, ...] = ("*",)
    """Globs of the model names the tenant may use (``gpt-4o*``); others get 403. Summary
    models too."""
    policy: dict[str, Any] = msgspec.field(default_factory=dict)
    """The tenant's policy, by wire name, over the deployment's ``policy``."""
    bounds: dict[str, Any] = msgspec.field(default_factory=dict)
    """What the tenant's callers may tune with ``x-contextgate-policy``, within the
    deployment's ``bounds``: ``[low, high]`` for a numeric key, the values allowed for
    another, ``false`` for a key they may not set."""
    limits: LimitSettings | None = None
    """The tenant's limits; ``None``: the deployment's ``limits``."""

    def __post_init__(self) -> None:
        if not _TENANT_NAME.fullmatch(self.name):
            raise ConfigError(
                f"tenants: name {self.name!r} must be 1-64 lower-case letters, digits or dashes"
            )
        if not self.keys:
            raise ConfigError(f"tenants[{self.name}]: needs at least one key hash")
        for key in self.keys:
            if not _KEY_HASH.fullmatch(key):
                raise ConfigError(
                    f"tenants[{self.name}]: {key[:12]!r}... is not a key hash; store"
                    " `contextgate hash-key` output (sha256:<64 hex digits>), never the key"
                )
        for field in ("upstream_api_key", "anthropic_api_key"):
            value = getattr(self, field)
            if value is not None and (not value or not value.isascii()):
                raise ConfigError(f"tenants[{self.name}]: {field} must be a non-empty ASCII key")
        if not self.models or not all(self.models):
            raise ConfigError(f"tenants[{self.name}]: models must list at least one glob")


_TENANT_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
_KEY_HASH = re.compile(r"sha256:[0-9a-f]{64}")
