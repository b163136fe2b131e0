"""contextgate's HTTP gateway: the server around ``pipelines`` (docs/ARCHITECTURE.md).

The package's face, for code that embeds the gateway rather than running ``contextgate
serve``::

    from gateway import create_app, load_settings

    app = create_app(load_settings("contextgate.yaml"))

The names load on first use, so that importing one part of the gateway (its errors, its
codecs) does not load the server.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:  # the names below, for type checkers; loaded lazily at run time
    from gateway.app import create_app
    from gateway.config import Settings, load_settings
    from gateway.errors import GatewayError

__all__ = ["GatewayError", "Settings", "create_app", "load_settings"]

_HOMES: Final = {
    "create_app": "gateway.app",
    "Settings": "gateway.config",
    "load_settings": "gateway.config",
    "GatewayError": "gateway.errors",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'gateway' has no attribute {name!r}")
    return getattr(import_module(home), name)
