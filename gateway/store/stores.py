"""The gateway's stores, whichever backend: objects, conversation records, the ledger,
namespaces.

``Stores.build`` picks Redis when ``redis_url`` is set (and only then imports its client),
else memory. Namespaces keep callers apart: in passthrough mode a caller's namespace is a
keyed hash (HMAC under the store's secret) of the upstream key it sends, so a ref written
for one key is not found with another, and neither the key nor a public hash of it is ever
stored.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar

from gateway.config import Settings
from gateway.store.conversations import ConversationRecords, MemoryConversations
from gateway.store.ledger import Ledger, MemoryLedger
from gateway.store.memory import MemoryStore
from pipelines import ConversationState, OffloadStore, StoreError

if TYPE_CHECKING:
    from gateway.store.redis import RedisBackend

__all__ = ["ANONYMOUS", "UNRESOLVED", "Deadlined", "Stores"]

T = TypeVar("T")

ANONYMOUS: Final = "anonymous"
"""The namespace of callers that send no key (a gateway with its own upstream key)."""
UNRESOLVED: Final = "unresolved"
"""The namespace while the shared secret cannot be read: nothing is stored under it, as
the store that holds the secret is the one that is down."""


class _Guarded:
    """A store that refuses the ``unresolved`` namespace: without the secret, callers
    cannot be told apart, so nothing may be written or read for them."""

    __slots__ = ("inner",)

    def __init__(self, inner: OffloadStore) -> None:
        self.inner = inner

    async def put(self, namespace: str, content: bytes, *, ttl: int) -> str:
        if namespace == UNRESOLVED:
            raise StoreError("the store's secret cannot be read; callers cannot be told apart")
        return await self.inner.put(namespace, content, ttl=ttl)

    async def get(self, namespace: str, ref: str) -> bytes | None:
        if namespace == UNRESOLVED:
            raise StoreError("the store's secret cannot be read; callers cannot be told apart")
        return await self.inner.get(namespace, ref)

    async def touch(self, namespace: str, ref: str, ttl: int) -> bool:
        if namespace == UNRESOLVED:
            return False
        return await _touch(self.inner, namespace, ref, ttl)


class _GuardedRecords:
    __slots__ = ("inner",)

    def __init__(self, inner: ConversationRecords) -> None:
        self.inner = inner

    async def get(self, namespace: str, conversation: str) -> ConversationState | None:
        return None if namespace == UNRESOLVED else await self.inner.get(namespace, conversation)

    async def put(self, namespace: str, conversation: str, state: ConversationState) -> None:
        if namespace != UNRESOLVED:
            await self.inner.put(namespace, conversation, state)

    async def checkpoint(self, namespace: str, conversation: str) -> bytes | None:
        if namespace == UNRESOLVED:
            return None
        return await self.inner.checkpoint(namespace, conversation)

    async def keep_checkpoint(self, namespace: str, conversation: str, data: bytes) -> None:
        if namespace != UNRESOLVED:
            await self.inner.keep_checkpoint(namespace, conversation, data)

    async def lock(self, namespace: str, conversation: str, seconds: float) -> str | None:
        if namespace == UNRESOLVED:
            raise StoreError("no namespace while the store's secret cannot be read")
        return await self.inner.lock(namespace, conversation, seconds)

    async def unlock(self, namespace: str, conversation: str, token: str) -> None:
        await self.inner.unlock(namespace, conversation, token)


class Deadlined:
    """An offload store whose operations for one request share one time budget: a Redis
    that answers, but slowly, cannot hold a request with many offloads for many
    timeouts; once the time is used up, the rest of the content stays in place. Only
    time spent in the store counts (not, say, a summary the request waited for)."""

    __slots__ = ("_left", "inner")

    def __init__(self, inner: OffloadStore, seconds: float) -> None:
        self.inner = inner
        self._left = seconds

    async def put(self, namespace: str, content: bytes, *, ttl: int) -> str:
        return await self._within(self.inner.put(namespace, content, ttl=ttl))

    async def get(self, namespace: str, ref: str) -> bytes | None:
        return await self._within(self.inner.get(namespace, ref))

    async def touch(self, namespace: str, ref: str, ttl: int) -> bool:
        return await self._within(_touch(self.inner, namespace, ref, ttl))

    async def _within(self, operation: Coroutine[Any, Any, T]) -> T:
        if self._left <= 0:
            operation.close()
            raise StoreError(_USED_UP)
        started = time.monotonic()
        try:
            async with asyncio.timeout(self._left):
                return await operation
        except TimeoutError as exc:
            raise StoreError(_USED_UP) from exc
        finally:
            self._left -= time.monotonic() - started


_USED_UP: Final = "the store's time for this request is used up"


async def _touch(store: object, namespace: str, ref: str, ttl: int) -> bool:
    touch = getattr(store, "touch", None)
    return bool(await touch(namespace, ref, ttl)) if touch is not None else False


@dataclass(slots=True)
class Stores:
    objects: OffloadStore
    conversations: ConversationRecords
    ledger: Ledger
    redis: RedisBackend | None
    _secret: bytes | None

    @classmethod
    def build(cls, settings: Settings) -> Stores:
        store, inspector = settings.store, settings.inspector
        bounds = {
            "max_requests": inspector.requests_per_conversation,
            "max_details": inspector.detailed_requests,
            "max_conversations": inspector.conversations_per_namespace,
            "ttl": inspector.ttl,
        }
        if settings.redis_url:
            # Imported here: the Redis client is some 10 MB a memory-only gateway never needs.
            from gateway.store.ledger_redis import RedisLedger
            from gateway.store.redis import RedisBackend, RedisConversations, RedisStore

            backend = RedisBackend(settings.redis_url, store)
            return cls(
                _Guarded(RedisStore(backend)),
                _GuardedRecords(RedisConversations(backend)),
                RedisLedger(backend, **bounds),
                backend,
                None,
            )
        secret = store.secret.encode() if store.secret else secrets.token_bytes(32)
        objects = MemoryStore(
            max_bytes=store.memory_max_bytes,
            max_object_bytes=min(store.max_object_bytes, store.memory_max_bytes),
            secret=secret,
        )
        ledger = MemoryLedger(max_bytes=inspector.memory_max_bytes, **bounds)
        records = MemoryConversations(max_bytes=store.memory_records_bytes)
        return cls(objects, records, ledger, None, secret)

    def for_request(self) -> OffloadStore:
        """The objects store as one request's pipeline uses it: with Redis, all its
        operations together bounded by the store timeout."""
        if self.redis is None:
            return self.objects
        return Deadlined(self.objects, self.redis.settings.timeout)

    async def secret(self) -> bytes:
        """The store's secret, which replicas share (``StoreError`` when Redis, which
        holds it, cannot be read)."""
        secret = self._secret if self.redis is None else await self.redis.secret()
        assert secret is not None
        return secret

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
