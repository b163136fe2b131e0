"""Redis deployments other than one server, for tests: a Sentinel-managed primary with one
replica, and a three-node Redis Cluster. Each runs redis-server processes of its own on
free loopback ports in a temporary directory, and is gone afterwards."""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import redis

SERVICE = "cg-primary"
"""The name the sentinel monitors the primary under."""

_BOOT_SECONDS = 10.0
_SYNC_SECONDS = 30.0
"""A backstop: with ``_REPLICATION`` a replica is in sync well within a second, even with
both cores busy."""
_REPLICATION = "repl-diskless-sync yes\nrepl-diskless-sync-delay 0\nrepl-diskless-load swapdb\n"
"""For every server that may be a primary or a replica (a failover swaps them): a full
sync streams the snapshot over the socket as soon as it is asked for (Redis waits 5 s
for more replicas by default, and before 7.0 wrote it to disk first), and the replica
loads it from the socket, not from a temporary file it would first fsync on its only
thread."""


def free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports: each bound until all are, since one
    released could be handed out again (two servers told the same port, one fails)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]


def _binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not on PATH")
    return binary


def wait_for(condition: Callable[[], bool], seconds: float, what: str) -> None:
    """Poll ``condition`` (errors count as not yet) until true, or fail naming ``what``."""
    deadline = time.monotonic() + seconds
    while True:
        with contextlib.suppress(redis.RedisError, OSError):
            if condition():
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


class _Processes:
    """redis-server processes started from configuration files in one temporary directory."""

    def __init__(self) -> None:
        self.binary = _binary()
        self.dir = Path(tempfile.mkdtemp(prefix="cg-redis-"))
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self._clients: dict[int, redis.Redis] = {}

    def client(self, port: int) -> redis.Redis:
        """A plain client of one server, every call bounded: one per port, closed by
        ``stop`` (clients left to the garbage collector close their sockets whenever it
        runs, and a socket it finds open is a warning in whichever test is running)."""
        found = self._clients.get(port)
        if found is None:
            found = self._clients[port] = redis.Redis(
                port=port, socket_timeout=2, socket_connect_timeout=2
            )
        return found

    def start(self, port: int, config: str, *args: str) -> None:
        path = self.dir / f"{port}.conf"
        path.write_text(
            f"port {port}\nbind 127.0.0.1\nsave ''\nappendonly no\ndir {self.dir}\n"
            f"logfile {self.dir / f'{port}.log'}\n{config}"
        )
        self.processes[port] = subprocess.Popen(
            [self.binary, str(path), *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def ping(self, port: int) -> None:
        wait_for(lambda: bool(self.client(port).ping()), _BOOT_SECONDS, f"redis on port {port}")

    def log(self, port: int, lines: int = 20) -> str:
        """The last ``lines`` of a server's log, to say why it did not get ready."""
        path = self.dir / f"{port}.log"
        text = path.read_text(errors="replace") if path.exists() else "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        for found in self._clients.values():
            found.close()
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)


class SentinelDeployment:
    """A primary, one replica of it, and one sentinel (quorum 1) watching them."""

    def __init__(self, processes: _Processes) -> None:
        self._processes = processes
        self.primary, self.replica, self.sentinel = free_ports(3)

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.sentinel}/{SERVICE}/0"

    def client(self, port: int) -> redis.Redis:
        return self._processes.client(port)

    def start(self) -> None:
        # The replica is started once the primary answers: a replica that finds the port
        # closed tries again only at its next once-a-second replication tick.
        self._processes.start(self.primary, _REPLICATION)
        self._processes.ping(self.primary)
        self._processes.start(self.replica, f"{_REPLICATION}replicaof 127.0.0.1 {self.primary}\n")
        self._processes.ping(self.replica)
        try:
            wait_for(self._replica_in_sync, _SYNC_SECONDS, "the replica to sync")
        except RuntimeError as exc:
            raise RuntimeError(
                f"{exc}; its log ends:\n{self._processes.log(self.replica)}"
            ) from None
        self._processes.start(
            self.sentinel,
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary} 1\n"
            f"sentinel down-after-milliseconds {SERVICE} 1000\n"
            f"sentinel failover-timeout {SERVICE} 5000\n",
            "--sentinel",
        )
        self._processes.ping(self.sentinel)
        wait_for(self._sentinel_sees_replica, _BOOT_SECONDS, "the sentinel to see the replica")

    def _replica_in_sync(self) -> bool:
        info = self.client(self.replica).info("replication")
        return info.get("master_link_status") == "up"

    def _sentinel_sees_replica(self) -> bool:
        replicas = self.client(self.sentinel).sentinel_slaves(SERVICE)
        return any(
            r["port"] == self.replica and not r["is_sdown"] and not r["is_disconnected"]
            for r in replicas
        )

    def primary_port(self) -> int:
        """The port of the primary, as the sentinel names it."""
        _, port = self.client(self.sentinel).sentinel_get_master_addr_by_name(SERVICE)
        return int(port)

    def fail_over(self, seconds: float = 20.0) -> int:
        """Once the replica has everything the primary has written, have the sentinel
        promote it, and wait until the old primary has been turned into its replica (the
        sentinel does that some seconds later, closing its clients' connections); the new
        primary's port."""
        old = self.primary_port()
        # Compared by offsets rather than with WAIT, which waits only for the writes as of
        # its own connection's last write or, with none, its connection's start: a client
        # connected before the gateway wrote would be told the replica has them at once.
        replica = self.client(self.replica if old == self.primary else self.primary)
        written = self.client(old).info("replication")["master_repl_offset"]
        wait_for(
            lambda: replica.info("replication")["slave_repl_offset"] >= written,
            seconds,
            "the replica to have the primary's writes",
        )
        # Refused (NOGOODSLAVE) until the sentinel has pinged the replica: ask again.
        sentinel = self.client(self.sentinel)
        wait_for(
            lambda: bool(sentinel.execute_command("SENTINEL", "FAILOVER", SERVICE)),
            seconds,
            "the sentinel to accept the failover",
        )
        wait_for(lambda: self.primary_port() != old, seconds, "the sentinel to promote")
        new = self.primary_port()
        wait_for(
            lambda: (
                self.client(new).info("replication")["role"] == "master"
                and self.client(old).info("replication")["role"] == "slave"
            ),
            seconds,
            "the old primary to become a replica",
        )
        return new


class ClusterDeployment:
    """Three primaries sharing the 16384 slots, no replicas."""

    def __init__(self, processes: _Processes) -> None:
        self._processes = processes
        ports = free_ports(6)
        self.ports, self.bus_ports = ports[:3], ports[3:]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in self.ports[:2])

    def client(self, port: int) -> redis.Redis:
        return self._processes.client(port)

    def start(self) -> None:
        for port, bus_port in zip(self.ports, self.bus_ports, strict=True):
            self._processes.start(
                port,
                f"cluster-enabled yes\ncluster-port {bus_port}\n"
                f"cluster-config-file nodes-{port}.conf\ncluster-node-timeout 2000\n",
            )
        for port in self.ports:
            self._processes.ping(port)
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *(f"127.0.0.1:{port}" for port in self.ports),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=_BOOT_SECONDS,
        )
        wait_for(self._ready, _BOOT_SECONDS, "the cluster to be ok on every node")

    def _ready(self) -> bool:
        return all(
            self.client(port).execute_command("CLUSTER", "INFO").decode().count("cluster_state:ok")
            for port in self.ports
        )

    def pause(self, port: int) -> None:
        """SIGSTOP one node: its connections stay open and nothing answers. Resume it
        within ``cluster-node-timeout`` (2 s) or the others mark it failed."""
        self._processes.processes[port].send_signal(signal.SIGSTOP)

    def resume(self, port: int) -> None:
        self._processes.processes[port].send_signal(signal.SIGCONT)

    def keys_by_node(self, pattern: str) -> dict[int, int]:
        """How many keys matching ``pattern`` each node holds."""
        return {
            port: sum(1 for _ in self.client(port).scan_iter(pattern, count=1_000))
            for port in self.ports
        }


@contextlib.contextmanager
def sentinel_deployment() -> Iterator[SentinelDeployment]:
    processes = _Processes()
    try:
        deployment = SentinelDeployment(processes)
        deployment.start()
        yield deployment
    finally:
        processes.stop()


@contextlib.contextmanager
def cluster_deployment() -> Iterator[ClusterDeployment]:
    processes = _Processes()
    try:
        deployment = ClusterDeployment(processes)
        deployment.start()
        yield deployment
    finally:
        processes.stop()
