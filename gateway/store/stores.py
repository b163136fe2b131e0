"""The gateway's stores, whichever backend: objects, conversation records, namespaces.

``Stores.build`` picks Redis when ``redis_url`` is set, else memory. Namespaces keep
callers apart: in passthrough mode a caller's namespace is a keyed hash (HMAC under the
store's secret) of the upstream key it sends, so a ref written for one key is not found
with another, and neither the key nor a public hash of it is ever stored.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Final

from gateway.settings import Settings
from gateway.store.conversations import ConversationRecords, MemoryConversations
from gateway.store.memory import MemoryStore
from gateway.store.redis import RedisBackend, RedisConversations, RedisStore
from pipelines import OffloadStore, StoreError

__all__ = ["ANONYMOUS", "Stores"]

ANONYMOUS: Final = "anonymous"
"""The namespace of callers that send no key (a gateway with its own upstream key)."""
UNRESOLVED: Final = "unresolved"
"""The namespace while the shared secret cannot be read: nothing is stored under it, as
the store that holds the secret is the one that is down."""


@dataclass(slots=True)
class Stores:
    objects: OffloadStore
    conversations: ConversationRecords
    redis: RedisBackend | None
    _secret: bytes | None

    @classmethod
    def build(cls, settings: Settings) -> Stores:
        store = settings.store
        if settings.redis_url:
            backend = RedisBackend(settings.redis_url, store)
            return cls(RedisStore(backend), RedisConversations(backend), backend, None)
        secret = store.secret.encode() if store.secret else secrets.token_bytes(32)
        objects = MemoryStore(
            max_bytes=store.memory_max_bytes,
            max_object_bytes=store.max_object_bytes,
            secret=secret,
        )
        return cls(objects, MemoryConversations(), None, secret)

    async def namespace_of(self, credential: str | None) -> str:
        """The namespace of a caller presenting ``credential`` (its upstream key)."""
        if not credential:
            return ANONYMOUS
        try:
            secret = self._secret if self.redis is None else await self.redis.secret()
        except StoreError:
            return UNRESOLVED
        assert secret is not None
        digest = hmac.new(secret, b"namespace\0" + credential.encode(), hashlib.sha256)
        return "key:" + digest.hexdigest()[:32]

    async def status(self) -> str:
        """``memory``, ``redis``, or ``redis-unreachable``."""
        if self.redis is None:
            return "memory"
        return "redis" if await self.redis.ping() else "redis-unreachable"

    async def aclose(self) -> None:
        if self.redis is not None:
            await self.redis.aclose()
