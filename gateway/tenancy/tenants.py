"""Tenants by gateway key, and what each may do.

Gateway keys are only ever held as hashes (``contextgate hash-key``). A ``Profile`` is
what the gateway knows of a kind of caller: a tenant's, resolved once from its settings
over the deployment's, or the one every passthrough caller shares.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Final

from gateway.config import LimitSettings, Settings
from pipelines import Policy, PolicyBounds

__all__ = ["HASH_PREFIX", "Profile", "Tenants", "hash_key"]

HASH_PREFIX: Final = "sha256:"


def hash_key(key: str) -> str:
    """The form a gateway key is stored in, in the configuration."""
    return HASH_PREFIX + hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Profile:
    """What callers of one tenant (or of passthrough mode) may do, and with what."""

    tenant: str | None
    """The tenant's name; ``None`` in passthrough mode."""
    upstream_api_key: str | None
    """Sent to the OpenAI-compatible upstream instead of the caller's key; ``None``: the
    caller's own goes."""
    anthropic_api_key: str | None
    """Sent to Anthropic; ``None``: in passthrough mode the caller's own goes, with a
    tenant Anthropic models are refused."""
    models: tuple[str, ...]
    """Globs of the model names allowed."""
    policy: Policy
    """The policy a request starts from, before its header."""
    bounds: PolicyBounds
    """What the policy header may change."""
    limits: LimitSettings

    def allows(self, model: str) -> bool:
        return any(fnmatchcase(model, glob) for glob in self.models)


class Tenants:
    """Gateway key hashes to tenant profiles, and the passthrough profile."""

    __slots__ = ("_by_hash", "passthrough")

    def __init__(self, settings: Settings) -> None:
        bounds = settings.policy_bounds()
        self.passthrough = Profile(
            None,
            settings.upstream.api_key,
            settings.anthropic.api_key,
            ("*",),
            settings.default_policy(),
            bounds,
            settings.limits,
        )
        self._by_hash: dict[str, Profile] = {}
        for tenant in settings.tenants:
            profile = Profile(
                tenant.name,
                tenant.upstream_api_key or settings.upstream.api_key,
                tenant.anthropic_api_key or settings.anthropic.api_key,
                tenant.models,
                settings.tenant_policy(tenant),
                settings.tenant_bounds(tenant, bounds),
                tenant.limits or settings.limits,
            )
            self._by_hash.update(dict.fromkeys(tenant.keys, profile))

    def __bool__(self) -> bool:
        return bool(self._by_hash)

    def of(self, credential: str | None) -> Profile | None:
        return self._by_hash.get(hash_key(credential)) if credential else None
