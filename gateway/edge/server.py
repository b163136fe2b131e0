"""The HTTP server: uvicorn's, with the gateway's drain, accept loop, refusals and warm-up,
and without the parts of uvicorn a gateway process never runs.

``DrainingServer`` is uvicorn's ``Server``: on SIGTERM it starts the drain
(``gateway.edge.drain``) before uvicorn's own shutdown; once its sockets listen it takes
waiting connections in at once (``gateway.edge.accept``), shows the shedder its accept
queue and warms the gateway (``Gateway.warm``); given the shedder, its httptools protocol
refuses overload as requests are read (``gateway.edge.refusal``).

Two parts of uvicorn are loaded only when used:

- **Its command line.** ``uvicorn/__init__.py`` imports ``uvicorn.main`` for ``uvicorn.run``:
  click, the reloaders (watchfiles) and the worker supervisor (multiprocessing), 34
  modules and 2.4 MB that a server made from ``uvicorn.config`` and ``uvicorn.server``
  never calls. Where nothing has imported uvicorn yet, this module registers the package
  with those two names and a module ``__getattr__`` that runs the package's own
  ``__init__`` when anything asks for another name (``uvicorn.run``, ``__version__``):
  what a program that imports uvicorn afterwards sees is uvicorn as it is.
- **Its WebSocket protocol** (``websockets``, 20 modules), which only the Responses
  WebSocket (``gateway.routes.responses_socket``) needs: with ``ws="auto"`` the server
  is given ``FirstUpgrade``, which loads the protocol uvicorn's ``auto`` picks at the
  first upgrade (once, some milliseconds on the event loop) and hands the connection to
  it.
"""

from __future__ import annotations

import importlib.util
import sys


def _uvicorn_without_its_command_line() -> None:
    if "uvicorn" in sys.modules:
        return
    spec = importlib.util.find_spec("uvicorn")
    if spec is None or spec.loader is None:  # pragma: no cover - not installed: import fails
        return
    loader = spec.loader
    package = importlib.util.module_from_spec(spec)

    def rest(name: str) -> object:
        # The package's own __init__, once; from then on its names are its attributes.
        del package.__dict__["__getattr__"]
        loader.exec_module(package)
        return getattr(package, name)

    package.__dict__["__getattr__"] = rest
    sys.modules["uvicorn"] = package
    from uvicorn.config import Config
    from uvicorn.server import Server

    # What the package's __init__ gives the modules that import from it
    # (``uvicorn.lifespan.on``: ``from uvicorn import Config``).
    package.__dict__.update(Config=Config, Server=Server)


_uvicorn_without_its_command_line()

import asyncio  # noqa: E402
import socket  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from typing import Any, Final  # noqa: E402

from uvicorn.config import Config  # noqa: E402
from uvicorn.server import Server  # noqa: E402

from gateway.edge.accept import EagerAccept  # noqa: E402
from gateway.edge.drain import Draining  # noqa: E402
from gateway.edge.overload import Shedder  # noqa: E402
from gateway.edge.refusal import first_request_refusal, refusing_protocol  # noqa: E402

__all__ = ["Config", "DrainingServer", "FirstUpgrade"]

_BACKSTOP: Final = 5.0
"""Seconds uvicorn waits past the grace period before cancelling what is left itself."""


class FirstUpgrade(asyncio.Protocol):
    """uvicorn's WebSocket protocol for ``ws="auto"``, loaded at the first upgrade: uvicorn
    makes its protocol for each upgraded connection by calling the class it was given,
    and this one returns the protocol ``auto`` picks (websockets', else wsproto's)."""

    _protocol: Any = None

    def __new__(cls, **kwargs: Any) -> Any:
        if cls._protocol is None:
            from uvicorn.protocols.websockets.auto import AutoWebSocketsProtocol

            cls._protocol = AutoWebSocketsProtocol
        return cls._protocol(**kwargs)


class DrainingServer(Server):
    """uvicorn's server, which on SIGTERM (or SIGINT) starts the gateway's drain before
    its own shutdown; uvicorn's limit is set a little past the grace period, as a backstop.
    Given the gateway's shedder, its httptools protocol refuses overload as requests are
    read (``gateway.edge.refusal``)."""

    def __init__(
        self,
        config: Config,
        draining: Draining,
        grace: float,
        shedder: Shedder | None = None,
        warm: Callable[[], None] | None = None,
    ) -> None:
        """``warm``: called once the port is open (``Gateway.warm``)."""
        config.timeout_graceful_shutdown = int(grace + _BACKSTOP)
        self._refusing: type[asyncio.Protocol] | None = None
        if shedder is not None and config.http in ("auto", "httptools"):
            self._refusing = refusing_protocol(shedder)
            if self._refusing is not None:
                config.http = self._refusing
        if config.ws == "auto":
            config.ws = FirstUpgrade
        super().__init__(config)
        self._draining = draining
        self._grace = grace
        self._shedder = shedder
        self._warm = warm
        self._accept: EagerAccept | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's start-up; then every waiting connection is taken in at once
        (``gateway.edge.accept``), the shedder reports the accept queue
        (``gateway.edge.overload``) and what is loaded lazily is warmed."""
        await super().startup(sockets)
        listening = [sock for server in self.servers for sock in server.sockets]
        config = self.config

        def protocol(loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Protocol:
            # What uvicorn's own start-up builds for the connections its servers accept.
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config,
                server_state=self.server_state,
                app_state=self.lifespan.state,
                _loop=loop,
            )

        # The first request of a new connection refused as it is accepted: where the
        # protocol refuses (httptools), so that both answer alike.
        first = None
        if self._shedder is not None and config.http is self._refusing:
            first = first_request_refusal(self._shedder, self.server_state, protocol)
        self._accept = EagerAccept(listening, protocol, config.ssl, first)
        if self._shedder is not None:
            self._shedder.listen_on(listening)
        if self._warm is not None and not self.should_exit:
            self._warm()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._draining.begin(self._grace)
        if self._accept is not None:
            self._accept.close()
        # uvicorn closes a WebSocket at once (1012); the gateway's connections end their
        # response in flight and close themselves first (gateway.routes.responses_socket).
        for server in self.servers:
            server.close()
        await self._draining.sockets_closed(self._grace + 1)
        await super().shutdown(sockets)

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn raises the signal again once it has shut down, so the process dies of
        it; a signal answered by a complete graceful shutdown ends the process with 0."""
        with super().capture_signals():
            try:
                yield
            finally:
                self._captured_signals.clear()
