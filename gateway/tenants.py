"""Tenants by gateway key: keys are only ever held as hashes (``contextgate hash-key``)."""

from __future__ import annotations

import hashlib
from typing import Final

from gateway.settings import Settings, TenantSettings

__all__ = ["HASH_PREFIX", "Tenants", "hash_key"]

HASH_PREFIX: Final = "sha256:"


def hash_key(key: str) -> str:
    """The form a gateway key is stored in, in the configuration."""
    return HASH_PREFIX + hashlib.sha256(key.encode()).hexdigest()


class Tenants:
    """Gateway key hashes to tenants."""

    __slots__ = ("_by_hash",)

    def __init__(self, settings: Settings) -> None:
        self._by_hash: dict[str, TenantSettings] = {
            key: tenant for tenant in settings.tenants for key in tenant.keys
        }

    def __bool__(self) -> bool:
        return bool(self._by_hash)

    def of(self, credential: str | None) -> TenantSettings | None:
        return self._by_hash.get(hash_key(credential)) if credential else None
