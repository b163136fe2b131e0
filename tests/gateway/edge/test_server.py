"""The server (``gateway.edge.server``): uvicorn's, with its command line and its WebSocket
protocol loaded only when something uses them. Each check runs in a new interpreter, where
nothing has imported uvicorn or websockets yet."""

from __future__ import annotations

import subprocess
import sys


def _run(code: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return done.stdout.split()


def test_the_server_leaves_uvicorns_command_line_unloaded_until_asked_for() -> None:
    """The server loads neither click, the reloaders nor multiprocessing; a program that
    asks uvicorn for anything else (``uvicorn.run``, its version) gets uvicorn whole."""
    shown = _run(
        "import sys\n"
        "from importlib.metadata import version\n"
        "import gateway.cli, gateway.edge.server\n"  # the command's (httpx's own left out)
        "unused = ('click', 'watchfiles', 'multiprocessing', 'uvicorn.main')\n"
        "print(sum(m in sys.modules for m in unused))\n"
        "import uvicorn\n"
        "from uvicorn import Config, Server\n"
        "print(uvicorn.run.__module__, Config.__module__, Server.__module__)\n"
        "print(uvicorn.__version__ == version('uvicorn'))\n"
    )
    assert shown == ["0", "uvicorn.main", "uvicorn.config", "uvicorn.server", "True"]


def test_a_uvicorn_imported_first_is_left_as_it_is() -> None:
    """Where uvicorn was imported before the server module, it is the package itself."""
    shown = _run(
        "import sys, uvicorn\n"
        "from gateway.edge import server\n"
        "print('uvicorn.main' in sys.modules, server.Server is uvicorn.Server)\n"
    )
    assert shown == ["True", "True"]


def test_the_websocket_protocol_is_loaded_at_the_first_upgrade() -> None:
    """With ``ws="auto"`` the server's WebSocket protocol is loaded when the first
    connection is upgraded, and it is the one uvicorn's ``auto`` picks."""
    shown = _run(
        "import asyncio, sys\n"
        "from gateway.edge.drain import Draining\n"
        "from gateway.edge.server import Config, DrainingServer\n"
        "async def app(scope, receive, send): pass\n"
        "async def main():\n"
        "    config = Config(app, lifespan='off')\n"
        "    DrainingServer(config, Draining(), 1.0)\n"
        "    config.load()\n"
        "    print('websockets' in sys.modules)\n"
        "    from uvicorn.server import ServerState\n"
        "    protocol = config.ws_protocol_class(\n"
        "        config=config, server_state=ServerState(), app_state={}\n"
        "    )\n"
        "    from uvicorn.protocols.websockets.auto import AutoWebSocketsProtocol\n"
        "    print('websockets' in sys.modules, type(protocol) is AutoWebSocketsProtocol)\n"
        "asyncio.run(main())\n"
    )
    assert shown == ["False", "True", "True"]
