"""The Redis backend: offloaded objects and conversation records shared by every replica.
Redis is one server, a primary found through Sentinel, or a cluster
(``gateway.config.store.RedisTopology`` reads which from ``redis_url``).

Every operation is bounded by ``store.timeout`` (socket timeouts, no client retries, and an
``asyncio`` deadline around the call), so a slow or dead Redis costs a request at most
that long. After ``breaker_failures`` failures in a row a circuit breaker stops asking
for ``breaker_cooldown`` seconds, then lets one request try; while it is open, writes fail
at once (stages keep content in place) and reads find nothing. Failures are counted, in
all and by operation, for ``/readyz`` and the metrics, and in ``REQUEST_FAILURES`` for the
request they happened in.

Keys (Redis Cluster and Valkey compatible):

- ``cg:o:<namespace id>:<ref>``: an object; one byte of format (``r`` raw, ``z`` zlib) and
  the bytes. Objects are read and written one at a time, so they carry no hash tag and
  spread over the cluster.
- ``cg:{c:<namespace id>:<conversation>}:state``: a conversation's record, under a hash
  tag so that what goes with it lands in the same slot: ``...:checkpoint``, the latest
  checkpoint prepared for it, and ``...:lock``, its summary lock (``SET NX PX`` with a
  random token; released only by its holder, else it expires).
- ``cg:secret``: the refs' HMAC key when the configuration gives none: created once by
  whichever replica gets there first (``SET NX``), read by the others.

A write is acknowledged by Redis before its ref is returned. A resent history brings the
same objects back every turn; re-confirming each would cost a round trip per object per
request. Instead ``cg:epoch``, a random value set once, is read with the conversation
record at the start of each request: while it is unchanged Redis has not lost data, and
objects this process stored (within half their TTL, at most an hour) are taken as still
there without asking. A missing or changed epoch (a restart without persistence, a flush),
or any failure, forgets them all; then an object is confirmed with ``EXPIRE`` (which also
renews its TTL) and sent again only if it is gone. In a cluster each node can lose its
keys on its own while the epoch lives on one of them, so there the epoch vouches for
nothing and known objects are always confirmed; with Sentinel, a change of primary
forgets them too (the replica promoted may lack the last writes). Redis must not evict
keys on its own (``maxmemory-policy noeviction``): an evicted object would be gone
whatever the gateway did.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import zlib
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

from redis.exceptions import RedisClusterException, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.breaker import CircuitBreaker
from gateway.config import StoreSettings
from gateway.store.refs import make_ref
from gateway.store.shared import REQUEST_FAILURES, namespace_id
from gateway.store.topologies import RedisClient, RedisTopology, connect
from gateway.telemetry.tracing import trace_redis
from pipelines import ConversationState, StoreError

__all__ = [
    "RedisBackend",
    "RedisConversations",
    "RedisStore",
]

T = TypeVar("T")

SECRET_KEY: Final = "cg:secret"
EPOCH_KEY: Final = "cg:epoch"
_CONFIRMED_FOR: Final = 2.0
"""Seconds an epoch confirmation vouches for the objects this process knows of: one
request's worth (each request confirms it with its conversation record's read)."""
_KNOWN_FOR: Final = 3_600.0
_RAW, _ZLIB = b"r", b"z"
_KNOWN_REFS: Final = 8_192
_RECORD_TTL: Final = 86_400
_UNLOCK: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisBackend:
    """The Redis client, its deadline and circuit breaker, and the shared secret."""

    __slots__ = (
        "_configured",
        "_connected",
        "_secret",
        "_secret_confirmed",
        "_secret_lock",
        "breaker",
        "client",
        "confirmed_at",
        "epoch",
        "failed",
        "failures",
        "known",
        "settings",
        "trusts_epoch",
    )

    def __init__(self, url: str, settings: StoreSettings) -> None:
        self.settings = settings
        topology = RedisTopology.parse(url)
        self._connected = connect(topology, settings, on_new_primary=self.forget)
        self.client: RedisClient = self._connected.client
        trace_redis(self.client)
        self.trusts_epoch = topology.kind != "cluster"
        """Whether one epoch vouches for every object: not in a cluster, where each node
        can lose its keys on its own while the epoch lives on one of them."""
        self.breaker = CircuitBreaker(settings.breaker_failures, settings.breaker_cooldown)
        self.failures = 0
        """Operations that failed (timeouts, refused connections, errors) or were refused
        by the open circuit."""
        self.failed: Counter[str] = Counter()
        """The same, by operation (``object_put``, ``record_get``, ...)."""
        self._configured = settings.secret is not None
        self._secret = settings.secret.encode() if settings.secret else None
        self._secret_confirmed = self._configured
        """Whether Redis is known to hold the secret we use: after any failure (Redis may
        have restarted empty) it is published again before the next write."""
        self._secret_lock = asyncio.Lock()
        self.known: OrderedDict[str, float] = OrderedDict()
        """Object keys this process stored, with until when that knowledge is trusted."""
        self.epoch: bytes | None = None
        """The value of ``cg:epoch`` last seen: a Redis that lost its data has none (or
        another), and everything in ``known`` is forgotten."""
        self.confirmed_at = 0.0
        """When the epoch was last confirmed (monotonic)."""

    def trusted(self, key: str) -> bool:
        """Whether ``key`` is known to be stored, as of an epoch confirmed just now."""
        if not self.trusts_epoch:
            return False
        now = time.monotonic()
        until = self.known.get(key)
        return until is not None and until > now and now - self.confirmed_at < _CONFIRMED_FOR

    def remember(self, key: str, ttl: int) -> None:
        self.known[key] = time.monotonic() + min(ttl / 2, _KNOWN_FOR)
        self.known.move_to_end(key)
        if len(self.known) > _KNOWN_REFS:
            self.known.popitem(last=False)

    def confirm_epoch(self, seen: bytes | None) -> bool:
        """Record the epoch read from Redis; False when Redis has none (to be set)."""
        if seen is None:
            self.known.clear()
            return False
        if seen != self.epoch:
            self.known.clear()
            self.epoch = seen
        self.confirmed_at = time.monotonic()
        return True

    async def new_epoch(self) -> None:
        """Put an epoch in a Redis that has none (a new or restarted one)."""
        mine = secrets.token_urlsafe(16).encode()

        async def create() -> Any:
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.set(EPOCH_KEY, mine, nx=True)
                pipe.get(EPOCH_KEY)
                return (await pipe.execute())[1]

        self.confirm_epoch(await self.run(create, "epoch"))

    async def run(
        self,
        operation: Callable[[], Awaitable[T]],
        what: str,
        *,
        breaker: CircuitBreaker | None = None,
    ) -> T:
        """``operation`` (named ``what`` in the failure counts) within the deadline and the
        breaker; ``StoreError`` otherwise. A part with a ``breaker`` of its own (the
        ledger, written after the answers) neither trips the requests' breaker nor makes
        the process forget what it knows is stored when it fails."""
        own = breaker is not None
        breaker = breaker or self.breaker
        if not breaker.allow():
            self._failed(what)
            raise StoreError("the store is unavailable (circuit open)")
        try:
            async with asyncio.timeout(self.settings.timeout):
                result = await operation()
        # RedisClusterException (no node reachable, a slot not covered) is not a RedisError.
        except (RedisError, RedisClusterException, OSError, TimeoutError) as exc:
            slow = isinstance(exc, TimeoutError | RedisTimeoutError)
            breaker.failure(slow=slow)
            self._failed(what)
            if not own:
                self.forget()
            raise StoreError(f"the store did not answer: {type(exc).__name__}") from exc
        except asyncio.CancelledError:
            breaker.release()
            raise
        breaker.success()
        return result

    def forget(self) -> None:
        """Trust nothing learnt from Redis so far (after a failure, or a failover to a
        replica that may lack the last writes): known objects are confirmed again, and
        the secret is published again before the next write."""
        self.known.clear()
        self.confirmed_at = 0.0
        self._secret_confirmed = self._configured

    def _failed(self, what: str) -> None:
        self.failures += 1
        self.failed[what] += 1
        seen = REQUEST_FAILURES.get()
        if seen is not None:
            seen[0] += 1

    async def secret(self) -> bytes:
        """The refs' HMAC key: configured, or shared through Redis. A replica that has
        one puts it back when Redis lost it, and adopts the one Redis holds otherwise, so
        that replicas agree again after a Redis restart."""
        if self._secret is not None and self._secret_confirmed:
            return self._secret
        async with self._secret_lock:
            if self._secret is None or not self._secret_confirmed:
                mine = self._secret or secrets.token_urlsafe(32).encode()

                async def fetch() -> bytes | None:
                    # Read first: SET is refused by a Redis at maxmemory even when the key
                    # is there, and the common case is that it is.
                    value = await self.client.get(SECRET_KEY)
                    if isinstance(value, bytes) and value:
                        return value
                    async with self.client.pipeline(transaction=False) as pipe:
                        pipe.set(SECRET_KEY, mine, nx=True)
                        pipe.get(SECRET_KEY)
                        _, value = await pipe.execute()
                    return value if isinstance(value, bytes) else None

                found = await self.run(fetch, "secret")
                if not found:
                    raise StoreError("the store holds no secret")
                self._secret, self._secret_confirmed = found, True
        assert self._secret is not None
        return self._secret

    async def ping(self) -> bool:
        try:
            await self.run(self.client.ping, "ping")
        except StoreError:
            return False
        return True

    async def aclose(self) -> None:
        await self._connected.aclose()


class RedisStore:
    """``pipelines.OffloadStore`` on Redis."""

    __slots__ = ("backend", "compress_over")

    def __init__(self, backend: RedisBackend, *, compress_over: int = 10_240) -> None:
        self.backend, self.compress_over = backend, compress_over

    async def put(self, namespace: str, content: bytes, *, ttl: int) -> str:
        cap = self.backend.settings.max_object_bytes
        if len(content) > cap:
            raise StoreError(f"object of {len(content):,} bytes is over the {cap:,} cap")
        ref = make_ref(await self.backend.secret(), namespace, content)
        key = f"cg:o:{namespace_id(namespace)}:{ref}"
        client, backend = self.backend.client, self.backend
        if backend.trusted(key):
            return ref  # stored by us, and Redis has not lost data since (epoch confirmed)
        if key in backend.known and await backend.run(
            lambda: client.expire(key, ttl), "object_touch"
        ):
            backend.remember(key, ttl)
            return ref
        compressed = len(content) > self.compress_over
        payload = _ZLIB + zlib.compress(content, 1) if compressed else _RAW + content

        async def store() -> None:
            async with client.pipeline(transaction=False) as pipe:
                pipe.set(key, payload, ex=ttl, nx=True)
                pipe.expire(key, ttl)  # renews it if it was already there
                await pipe.execute()

        await backend.run(store, "object_put")
        backend.remember(key, ttl)
        return ref

    async def touch(self, namespace: str, ref: str, ttl: int) -> bool:
        """Whether ``ref`` is still stored (known, or confirmed with ``EXPIRE``, which also
        renews it)."""
        key = f"cg:o:{namespace_id(namespace)}:{ref}"
        backend, client = self.backend, self.backend.client
        if backend.trusted(key):
            return True
        if await backend.run(lambda: client.expire(key, ttl), "object_touch"):
            backend.remember(key, ttl)
            return True
        return False

    async def get(self, namespace: str, ref: str) -> bytes | None:
        key = f"cg:o:{namespace_id(namespace)}:{ref}"
        client = self.backend.client
        stored = await self.backend.run(lambda: client.get(key), "object_get")
        if not isinstance(stored, bytes) or not stored:
            return None
        kind, body = stored[:1], stored[1:]
        return zlib.decompress(body) if kind == _ZLIB else body


class RedisConversations:
    """Conversation records on Redis; a record that cannot be read counts as absent, one
    that cannot be written is dropped (the conversation is then treated as cold)."""

    __slots__ = ("backend",)

    def __init__(self, backend: RedisBackend) -> None:
        self.backend = backend

    @classmethod
    def key(cls, namespace: str, conversation: str) -> str:
        return cls._key(namespace, conversation, "state")

    async def get(self, namespace: str, conversation: str) -> ConversationState | None:
        """The record; in the same round trip, the epoch that lets this request trust the
        objects this process knows are stored (``RedisBackend.trusted``)."""
        key, backend = self.key(namespace, conversation), self.backend

        async def read() -> Any:
            async with backend.client.pipeline(transaction=False) as pipe:
                pipe.get(key)
                pipe.get(EPOCH_KEY)
                return await pipe.execute()

        try:
            data, epoch = await backend.run(read, "record_get")
            if not backend.confirm_epoch(epoch if isinstance(epoch, bytes) else None):
                await backend.new_epoch()
            return ConversationState.from_json(data) if isinstance(data, bytes) else None
        except (StoreError, ValueError, TypeError):
            return None

    async def put(self, namespace: str, conversation: str, state: ConversationState) -> None:
        key, client = self.key(namespace, conversation), self.backend.client
        data = state.to_json()
        try:
            await self.backend.run(lambda: client.set(key, data, ex=_RECORD_TTL), "record_put")
        except StoreError:
            return

    @staticmethod
    def _key(namespace: str, conversation: str, what: str) -> str:
        return f"cg:{{c:{namespace_id(namespace)}:{conversation}}}:{what}"

    async def checkpoint(self, namespace: str, conversation: str) -> bytes | None:
        key, client = self._key(namespace, conversation, "checkpoint"), self.backend.client
        try:
            data = await self.backend.run(lambda: client.get(key), "checkpoint_get")
        except StoreError:
            return None
        return data if isinstance(data, bytes) else None

    async def keep_checkpoint(self, namespace: str, conversation: str, data: bytes) -> None:
        key, client = self._key(namespace, conversation, "checkpoint"), self.backend.client
        try:
            await self.backend.run(lambda: client.set(key, data, ex=_RECORD_TTL), "checkpoint_put")
        except StoreError:
            return

    async def lock(self, namespace: str, conversation: str, seconds: float) -> str | None:
        key, client = self._key(namespace, conversation, "lock"), self.backend.client
        token = secrets.token_hex(8)
        milliseconds = max(1, int(seconds * 1000))
        taken = await self.backend.run(
            lambda: client.set(key, token, nx=True, px=milliseconds), "lock"
        )
        return token if taken else None

    async def unlock(self, namespace: str, conversation: str, token: str) -> None:
        key, client = self._key(namespace, conversation, "lock"), self.backend.client
        try:
            await self.backend.run(lambda: client.eval(_UNLOCK, 1, key, token), "unlock")
        except StoreError:
            return
