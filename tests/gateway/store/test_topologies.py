"""Reading ``redis_url``: the Sentinel and Cluster forms taken apart, bad ones refused at
start-up with a message saying what is wrong."""

from __future__ import annotations

import pytest

from gateway.config import ConfigError, Settings
from gateway.store.topologies import RedisTopology


def test_a_sentinel_url_names_its_sentinels_service_and_database() -> None:
    topology = RedisTopology.parse(
        "redis+sentinel://:p%40ss@s1:26380,s2/cg-primary/2?sentinel_password=watch"
    )
    assert topology.kind == "sentinel"
    assert topology.nodes == (("s1", 26380), ("s2", 26379))
    assert (topology.service, topology.db) == ("cg-primary", 2)
    assert (topology.username, topology.password) == (None, "p@ss")
    assert topology.sentinel_password == "watch"
    assert not topology.tls


def test_a_cluster_url_lists_nodes_to_discover_the_rest_from() -> None:
    topology = RedisTopology.parse("rediss+cluster://app:secret@n1:7000,[::1]:7001")
    assert topology.kind == "cluster"
    assert topology.nodes == (("n1", 7000), ("::1", 7001))
    assert (topology.username, topology.password) == ("app", "secret")
    assert topology.tls


def test_a_single_server_url_is_left_to_redis_py() -> None:
    assert RedisTopology.parse("redis://localhost:6379/0").kind == "single"
    assert RedisTopology.parse("rediss://cache:6380/1").tls


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://localhost:6379", "must start with one of"),
        ("redis+sentinel://s1:26379", "ends in /<service name>"),
        ("redis+sentinel://s1:26379/svc/zero", "ends in /<service name>"),
        ("redis+cluster://n1:7000/3", "only database 0"),
        ("redis+cluster://n1:port", "is not host"),
        ("redis+cluster://n1:7000?read_from_replicas=1", "unknown option"),
    ],
)
def test_unusable_urls_stop_the_gateway_at_start_up(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings(redis_url=url)
