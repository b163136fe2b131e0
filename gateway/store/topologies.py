"""How the gateway reaches Redis, read from ``redis_url``: one server, a primary found
through Sentinel, or a Redis Cluster (Valkey too).

URL forms (``rediss`` instead of ``redis`` for TLS throughout):

- ``redis://[[user]:password@]host[:port][/db]``: one server, as redis-py reads it
  (``unix://`` too).
- ``redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/<service>[/<db>]``:
  the sentinels (port 26379 unless given) and the name they monitor the primary under.
  The credentials are the primary's; sentinels that require a password of their own get
  it from ``?sentinel_password=...``.
- ``redis+cluster://[[user]:password@]host[:port][,host[:port]...]``: some of the
  cluster's nodes (port 6379 unless given); the rest are discovered. No database: a
  cluster has only 0.

Every client is built the same way: socket and connect timeouts of ``store.timeout``, no
client-side retries, no background health checks, at most ``store.max_connections``
connections (per node in a cluster).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal
from urllib.parse import parse_qs, unquote

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import BlockingConnectionPool
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.retry import Retry

if TYPE_CHECKING:
    from gateway.config.settings import StoreSettings

__all__ = ["RedisClient", "RedisTopology", "connect"]

RedisClient = aioredis.Redis | RedisCluster

_Kind = Literal["single", "sentinel", "cluster"]
_SCHEMES: Final[dict[str, tuple[_Kind, bool]]] = {
    "redis": ("single", False),
    "rediss": ("single", True),
    "unix": ("single", False),
    "redis+sentinel": ("sentinel", False),
    "rediss+sentinel": ("sentinel", True),
    "redis+cluster": ("cluster", False),
    "rediss+cluster": ("cluster", True),
}
_DEFAULT_PORTS: Final[dict[_Kind, int]] = {"sentinel": 26379, "cluster": 6379}


@dataclass(frozen=True, slots=True)
class RedisTopology:
    """A ``redis_url`` taken apart; ``parse`` refuses the forms the gateway cannot use."""

    kind: _Kind
    url: str
    tls: bool = False
    nodes: tuple[tuple[str, int], ...] = ()
    """Sentinels, or cluster nodes to start discovery from (empty for one server)."""
    service: str = ""
    """The primary's name in Sentinel."""
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None

    @classmethod
    def parse(cls, url: str) -> RedisTopology:
        """``url`` read, or ``ValueError`` saying what is wrong with it."""
        scheme = url.partition("://")[0].lower()
        if scheme not in _SCHEMES or "://" not in url:
            raise ValueError(
                f"redis_url must start with one of {', '.join(s + '://' for s in _SCHEMES)}"
            )
        kind, tls = _SCHEMES[scheme]
        if kind == "single":
            return cls("single", url, tls)
        # urlsplit cannot read a list of hosts, so the authority is split here.
        rest = url.partition("://")[2]
        authority, _, path_query = rest.partition("/")
        if "?" in authority:
            authority, _, query = authority.partition("?")
            path = ""
        else:
            path, _, query = path_query.partition("?")
        userinfo, at, hosts = authority.rpartition("@")
        username = password = None
        if at:
            user, colon, secret = userinfo.partition(":")
            username = unquote(user) or None
            password = unquote(secret) if colon else None
        nodes = tuple(_node(part, _DEFAULT_PORTS[kind]) for part in hosts.split(","))
        options = {name: values[-1] for name, values in parse_qs(query).items()}
        known = {"sentinel_password"} if kind == "sentinel" else set()
        if unknown := sorted(set(options) - known):
            raise ValueError(f"redis_url: unknown option {unknown[0]!r}")
        parts = [unquote(part) for part in path.split("/") if part]
        if kind == "cluster":
            if parts not in ([], ["0"]):
                raise ValueError("redis_url: a cluster has only database 0")
            return cls(kind, url, tls, nodes, username=username, password=password)
        if not 1 <= len(parts) <= 2 or (len(parts) == 2 and not parts[1].isdigit()):
            raise ValueError(
                "redis_url: a sentinel URL ends in /<service name> or /<service name>/<db>"
            )
        return cls(
            kind,
            url,
            tls,
            nodes,
            service=parts[0],
            db=int(parts[1]) if len(parts) == 2 else 0,
            username=username,
            password=password,
            sentinel_password=options.get("sentinel_password"),
        )


def _node(text: str, default_port: int) -> tuple[str, int]:
    host, colon, port = text.strip().rpartition(":")
    if not colon:
        host, port = port, str(default_port)
    host = host.removeprefix("[").removesuffix("]")
    if not host or not port.isdigit() or not 0 < int(port) < 65_536:
        raise ValueError(f"redis_url: {text!r} is not host[:port]")
    return host, int(port)


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
