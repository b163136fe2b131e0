"""Settings of the offload store, and what ``redis_url`` names: one server, a primary found
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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal
from urllib.parse import parse_qs, unquote

import msgspec

from gateway.config.errors import ConfigError

__all__ = ["RedisTopology", "StoreSettings"]


class StoreSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The offload store (Redis when ``redis_url`` is set, else memory)."""

    secret: str | None = None
    """Key of the refs' HMAC, shared by every replica (``CONTEXTGATE_STORE_SECRET``); at
    least 32 characters. ``None``: one is created in Redis on first start (or, in memory,
    per process)."""
    timeout: float = 0.25
    """Seconds one store operation may take before the request goes on without it."""
    max_object_bytes: int = 16 * 1024 * 1024
    """Largest object stored; larger content stays where it is."""
    memory_max_bytes: int = 6 * 1024 * 1024
    """Bytes the in-memory store may hold (without Redis); it also caps an object's size
    there. docs/DEPLOY.md, "Sizing memory"."""
    memory_records_bytes: int = 2 * 1024 * 1024
    """Bytes the in-memory conversation records and prepared checkpoints may hold together
    (without Redis): a record takes about 1 KB, a summarised one 10-30 KB."""
    breaker_failures: int = 3
    """Consecutive failures after which the store is not asked for ``breaker_cooldown``."""
    breaker_cooldown: float = 5.0
    max_connections: int = 256
    """Redis connections per gateway process; past it, calls wait (within the timeout)."""

    def __post_init__(self) -> None:
        if self.secret is not None and len(self.secret) < 32:
            raise ConfigError("store.secret must be at least 32 characters")
        if not 0 < self.timeout <= 30:
            raise ConfigError("store.timeout must be in (0, 30] seconds")
        if not 1_024 <= self.max_object_bytes <= 512 * 1024 * 1024:
            raise ConfigError("store.max_object_bytes must be between 1 KiB and 512 MiB")
        if self.memory_max_bytes < 1_024 or self.memory_records_bytes < 1_024:
            raise ConfigError(
                "store.memory_max_bytes and store.memory_records_bytes must be at least 1 KiB"
            )
        if not 1 <= self.max_connections <= 10_000:
            raise ConfigError("store.max_connections must be between 1 and 10000")
        if self.breaker_failures < 1 or self.breaker_cooldown <= 0:
            raise ConfigError("store.breaker_failures must be >= 1, breaker_cooldown > 0")


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
