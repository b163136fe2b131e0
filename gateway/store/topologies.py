"""How the gateway connects to Redis in the topology ``redis_url`` names
(``gateway.config.RedisTopology`` reads the URL): one server, a primary found through
Sentinel, or a Redis Cluster (Valkey too).

Every client is built the same way: socket and connect timeouts of ``store.timeout``, no
client-side retries, no background health checks, at most ``store.max_connections``
connections (per node in a cluster).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import BlockingConnectionPool
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.retry import Retry

from gateway.config import RedisTopology, StoreSettings

__all__ = ["RedisClient", "RedisTopology", "connect"]

RedisClient = aioredis.Redis | RedisCluster


@dataclass(frozen=True, slots=True)
class Connected:
    """A client and what closing it takes."""

    client: RedisClient
    aclose: Callable[[], Awaitable[None]]


def connect(
    topology: RedisTopology,
    settings: StoreSettings,
    on_new_primary: Callable[[], None] = lambda: None,
) -> Connected:
    """A client for ``topology``. With Sentinel, ``on_new_primary`` is called when the
    sentinels name another primary than the one connected to before (a failover)."""
    bounded: dict[str, Any] = {
        "socket_timeout": settings.timeout,
        "socket_connect_timeout": settings.timeout,
        "retry": Retry(NoBackoff(), 0),
        "health_check_interval": 0,
    }
    if topology.kind == "single":
        # A blocking pool: past ``max_connections`` a call waits for a free connection
        # (within its deadline) instead of failing at once, as the default pool does.
        pool = aioredis.BlockingConnectionPool.from_url(
            topology.url,
            max_connections=settings.max_connections,
            timeout=settings.timeout,
            retry_on_timeout=False,
            **bounded,
        )
        single = aioredis.Redis(connection_pool=pool)

        async def close_single() -> None:
            await single.aclose()
            await pool.disconnect()

        return Connected(single, close_single)
    credentials: dict[str, Any] = {"username": topology.username, "password": topology.password}
    if topology.kind == "cluster":
        cluster = RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in topology.nodes],
            max_connections=settings.max_connections,
            ssl=topology.tls,
            **credentials,
            **bounded,
        )
        return Connected(cluster, cluster.aclose)
    # redis-py's Sentinel classes carry no annotations.
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        list(topology.nodes),
        sentinel_kwargs={**bounded, "password": topology.sentinel_password, "ssl": topology.tls},
    )
    primary: aioredis.Redis = sentinel.master_for(
        topology.service,
        connection_pool_class=_BlockingSentinelPool,
        max_connections=settings.max_connections,
        timeout=settings.timeout,
        retry_on_timeout=False,
        db=topology.db,
        ssl=topology.tls,
        on_new_primary=on_new_primary,
        **credentials,
        **bounded,
    )

    async def close_sentinel() -> None:
        await primary.aclose()
        await sentinel.aclose()

    return Connected(primary, close_sentinel)


class _BlockingSentinelPool(SentinelConnectionPool, BlockingConnectionPool):
    """Sentinel's pool (connections go to the primary the sentinels name) with the
    blocking pool's wait for a free connection, and word of a change of primary."""

    def __init__(self, service_name: str, sentinel_manager: Sentinel, **kwargs: Any) -> None:
        self._on_new_primary: Callable[[], None] = kwargs.pop("on_new_primary")
        super().__init__(service_name, sentinel_manager, **kwargs)  # type: ignore[no-untyped-call]

    async def get_master_address(self) -> Any:
        before = self.master_address
        address = await super().get_master_address()  # type: ignore[no-untyped-call]
        if before is not None and address != before:
            self._on_new_primary()
        return address
