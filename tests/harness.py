"""Running the real gateway on a loopback socket for tests, and a private redis-server."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn

from gateway.app import create_app
from gateway.config import Settings
from gateway.edge.server import DrainingServer


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class GatewayServer:
    """The gateway app under uvicorn, on a thread, bound to a free loopback port."""

    def __init__(self, settings: Settings, *, wrap: Callable[[Any], Any] | None = None) -> None:
        """``wrap``: an ASGI middleware put around the app (a test's recorder)."""
        self.app = create_app(settings)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        served = wrap(self.app) if wrap is not None else self.app
        config = uvicorn.Config(
            served, log_level="warning", lifespan="on", ws_max_size=settings.max_body_bytes
        )
        gateway = self.app.state.gateway
        self.warmed: list[bool] = []
        """Whether the server had started (its port open) each time it warmed the gateway."""

        def warm() -> None:
            self.warmed.append(self._server.started)
            gateway.warm()

        self._server = DrainingServer(
            config, gateway.draining, min(settings.shutdown_grace, 2), gateway.shedder, warm
        )
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def protocol(self) -> type[Any]:
        """The HTTP protocol class the server runs."""
        protocol: type[Any] = self._server.config.http_protocol_class
        return protocol

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def __enter__(self) -> GatewayServer:
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the gateway did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(10)
        self._sock.close()


class RedisServer:
    """A redis-server of our own on a free port, which a test may kill, pause, resume
    and start again (on the same port, empty, as after a crash without persistence)."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not on PATH; install it or set REDIS_URL")
        self.binary = binary
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._workdir = tempfile.TemporaryDirectory()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self._workdir.name,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), 0.2),
            ):
                return
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL: gone at once, everything it held lost."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(10)

    def pause(self) -> None:
        """SIGSTOP: connections stay open and nothing answers."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            self.process.wait(10)
        self._workdir.cleanup()


@contextlib.contextmanager
def private_redis() -> Iterator[str]:
    """A redis-server of our own on a free port, gone afterwards."""
    with redis_server() as server:
        yield server.url


@contextlib.contextmanager
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    try:
        server.start()
        yield server
    finally:
        server.stop()


def redis_from_env() -> str | None:
    return os.environ.get("REDIS_URL") or None


class ServeProcess:
    """``contextgate serve`` as its own process (a replica), with a YAML configuration,
    on a free loopback port; stopped with SIGTERM. Its stderr (the JSON log) goes to a
    file, so that a long test never blocks it on a full pipe; ``log()`` reads it."""

    def __init__(
        self,
        config: str,
        workdir: str,
        *args: str,
        env: dict[str, str] | None = None,
        ready_within: float = 30.0,
    ) -> None:
        """``args`` are added to ``contextgate serve``'s; ``env`` to this process's
        environment, which goes without its ``CONTEXTGATE_*``, ``REDIS*`` and ``OTEL_*``
        variables. Entering waits ``ready_within`` seconds at most for it to listen."""
        self.port = free_port()
        self.ready_within = ready_within
        path = os.path.join(workdir, f"contextgate-{self.port}.yaml")
        with open(path, "w") as file:
            file.write(config)
        inherited = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("CONTEXTGATE_", "REDIS", "OTEL_"))
        }
        self._log = os.path.join(workdir, f"contextgate-{self.port}.log")
        with open(self._log, "wb") as stderr:  # the process keeps its own descriptor
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gateway.cli",
                    "serve",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--config",
                    path,
                    *args,
                ],
                env={**inherited, **(env or {})},
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def __enter__(self) -> ServeProcess:
        """Once it listens and has warmed (``/readyz`` says ``"warm": true``): the warm-up
        loads the encoding in the background, which a test that reads the process's memory
        or times its requests would otherwise measure."""
        deadline = time.monotonic() + self.ready_within
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.sendall(
                        b"GET /readyz HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n\r\n"
                    )
                    answer = b"".join(iter(lambda: sock.recv(4096), b""))
                if b'"warm":true' in answer:
                    return self
            except OSError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                errors = self.log()
                self.stop()
                raise RuntimeError(f"the gateway process did not start: {errors[-2000:]}")
            time.sleep(0.1)

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log(self) -> str:
        """What the process wrote to stderr so far."""
        with open(self._log, "rb") as stderr:
            return stderr.read().decode()

    def kill(self) -> None:
        """SIGKILL: the replica dies at once, its connections broken, nothing cleaned up."""
        self.process.kill()
        self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


class Replicas:
    """``count`` ``contextgate serve`` processes with one configuration (naming one Redis,
    they are the replicas of one deployment), started at once and stopped on exit.
    ``revive()`` replaces the ones that died (a test killed them) with new processes."""

    READY_WITHIN = 90.0
    """Seconds each may take to listen: several starting at once on a small, busy
    machine share its cores (three took 25 s on two)."""

    def __init__(self, config: str, workdir: str, count: int) -> None:
        self.config, self.workdir = config, workdir
        self.processes = [self._started() for _ in range(count)]

    def _started(self) -> ServeProcess:
        return ServeProcess(self.config, self.workdir, ready_within=self.READY_WITHIN)

    def __enter__(self) -> Replicas:
        try:
            for process in self.processes:
                process.__enter__()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __getitem__(self, index: int) -> ServeProcess:
        return self.processes[index]

    def __iter__(self) -> Iterator[ServeProcess]:
        return iter(self.processes)

    def revive(self) -> None:
        dead = [i for i, p in enumerate(self.processes) if p.process.poll() is not None]
        for index in dead:
            self.processes[index] = self._started()
        for index in dead:
            self.processes[index].__enter__()

    def stop(self) -> None:
        for process in self.processes:
            process.stop()
