"""Per-tenant request rate and concurrency limits, shared by every replica through Redis.

The rate is a generic cell rate (GCRA): each request moves a "theoretical arrival time"
on by ``60 / requests_per_minute`` seconds, and a request is admitted while that time is
less than a minute ahead of now, so a burst of the whole minute's allowance is accepted and
then requests are admitted evenly; ``Retry-After`` is exact. Concurrency is a sorted set
of leases, one per request in progress, each expiring after ``LEASE_SECONDS`` in case its
replica dies before releasing it. One script checks both atomically, on Redis's clock.

Keys (one hash slot per limited caller): ``cg:{l:<id>}:rate`` and ``cg:{l:<id>}:busy``,
where ``<id>`` is the tenant's name or a hash of the passthrough namespace.

Without Redis the same arithmetic runs in the process. When Redis cannot be asked (down,
slow, circuit open) the request is admitted and counted as a fail-open: limits protect
the upstream from a tenant, they must not turn a store outage into an outage.
"""

from __future__ import annotations

import math
import secrets
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from gateway.config import LimitSettings
from gateway.errors import RateLimited
from gateway.telemetry.metrics import Metrics
from pipelines import StoreError

if TYPE_CHECKING:
    from gateway.store.redis import RedisBackend

__all__ = ["LEASE_SECONDS", "Lease", "Limiter"]

LEASE_SECONDS: Final = 900
"""Longest a request holds a concurrency slot when its replica never releases it."""

_MAX_KEPT: Final = 10_000
"""In-process arrival times kept before the past ones are dropped."""

_ADMIT: Final = """
local now_s = redis.call('TIME')
local now = tonumber(now_s[1]) * 1000 + math.floor(tonumber(now_s[2]) / 1000)
local rpm, busy_max, lease = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[4])
if busy_max > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  if redis.call('ZCARD', KEYS[2]) >= busy_max then
    return {0, 1000, 'concurrency'}
  end
end
if rpm > 0 then
  local interval = 60000 / rpm
  local tat = tonumber(redis.call('GET', KEYS[1]) or now)
  if tat < now then tat = now end
  local wait = tat + interval - 60000 - now
  if wait > 0 then return {0, math.ceil(wait), 'rate'} end
  redis.call('SET', KEYS[1], tostring(tat + interval), 'PX', math.ceil(tat + interval - now))
end
if busy_max > 0 then
  redis.call('ZADD', KEYS[2], now + lease, ARGV[3])
  redis.call('PEXPIRE', KEYS[2], lease)
end
return {1, 0, ''}
"""


@dataclass(slots=True)
class Lease:
    """A concurrency slot held by one request; ``release`` gives it back (once)."""

    limiter: Limiter
    key: str
    member: str
    released: bool = field(default=False)

    async def release(self) -> None:
        if not self.released:
            self.released = True
            await self.limiter.release(self)


class Limiter:
    """Admits requests within their caller's ``LimitSettings``."""

    __slots__ = ("_admit", "_backend", "_busy", "_metrics", "_prune_over", "_rates")

    def __init__(self, backend: RedisBackend | None, metrics: Metrics) -> None:
        self._backend, self._metrics = backend, metrics
        self._admit = backend.client.register_script(_ADMIT) if backend is not None else None
        """Sent by its hash (EVALSHA), the text only when Redis does not know it yet."""
        self._rates: dict[str, float] = {}
        """In-process arrival times (ms) when there is no Redis."""
        self._prune_over = _MAX_KEPT
        """Entries in ``_rates`` past which the past arrival times are dropped."""
        self._busy: dict[str, set[str]] = {}

    async def admit(self, key: str, tenant: str, limits: LimitSettings) -> Lease | None:
        """A lease when ``limits`` cap concurrency (``None`` otherwise, or when Redis could
        not be asked), or ``RateLimited`` with ``Retry-After``."""
        rpm, busy_max = limits.requests_per_minute or 0, limits.concurrency or 0
        if not rpm and not busy_max:
            return None
        member = secrets.token_hex(8)
        if self._backend is None or self._admit is None:
            admitted, wait_ms, which = self._admit_here(key, rpm, busy_max, member)
        else:
            script = self._admit
            keys = [f"cg:{{l:{key}}}:rate", f"cg:{{l:{key}}}:busy"]
            args: list[str | int] = [rpm, busy_max, member, LEASE_SECONDS * 1000]
            try:
                result = await self._backend.run(
                    lambda: script(keys=keys, args=args), "limit_admit"
                )
            except StoreError:
                self._metrics.limiter_fail_open.inc()
                return None
            admitted, wait_ms = bool(result[0]), int(result[1])
            which = result[2].decode() if isinstance(result[2], bytes) else str(result[2])
        if not admitted:
            self._metrics.rate_limited.labels(tenant, which).inc()
            seconds = max(1, math.ceil(wait_ms / 1000))
            what = (
                f"{busy_max} requests at once"
                if which == "concurrency"
                else f"{rpm} requests per minute"
            )
            raise RateLimited(
                f"This gateway key is over its limit of {what}; retry after {seconds} s.",
                headers={"retry-after": str(seconds)},
            )
        return Lease(self, key, member) if busy_max else None

    async def release(self, lease: Lease) -> None:
        if self._backend is None:
            busy = self._busy.get(lease.key)
            if busy is not None:
                busy.discard(lease.member)
                if not busy:
                    del self._busy[lease.key]
            return
        backend = self._backend
        try:
            await backend.run(
                lambda: backend.client.zrem(f"cg:{{l:{lease.key}}}:busy", lease.member),
                "limit_release",
            )
        except StoreError:
            self._metrics.limiter_fail_open.inc()

    def _admit_here(self, key: str, rpm: int, busy_max: int, member: str) -> tuple[bool, int, str]:
        busy = self._busy.get(key, ())
        if busy_max and len(busy) >= busy_max:
            return False, 1_000, "concurrency"
        now = time.monotonic() * 1000
        if len(self._rates) > self._prune_over:
            self._rates = {k: at for k, at in self._rates.items() if at > now}
            # Past arrival times go; with more keys than that still ahead of their time,
            # the next pass waits until there are twice as many (not one per admission).
            self._prune_over = max(_MAX_KEPT, 2 * len(self._rates))
        if rpm:
            interval = 60_000 / rpm
            arrival = max(self._rates.get(key, now), now)
            wait = arrival + interval - 60_000 - now
            if wait > 0:
                return False, math.ceil(wait), "rate"
            self._rates[key] = arrival + interval
        if busy_max:
            self._busy.setdefault(key, set()).add(member)
        return True, 0, ""
