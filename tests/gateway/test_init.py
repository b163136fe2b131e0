"""The package's face: ``from gateway import ...`` gives the names an embedder needs, and
importing one part of the gateway does not load the server."""

from __future__ import annotations

import subprocess
import sys

import pytest

import gateway
from gateway.app import create_app
from gateway.config import Settings, load_settings
from gateway.errors import GatewayError


def test_the_face_names_the_app_its_settings_and_the_error_base() -> None:
    assert gateway.create_app is create_app
    assert gateway.Settings is Settings
    assert gateway.load_settings is load_settings
    assert gateway.GatewayError is GatewayError
    assert sorted(gateway.__all__) == sorted(
        ["GatewayError", "Settings", "create_app", "load_settings"]
    )


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Gateway'"):
        _ = gateway.Gateway  # type: ignore[attr-defined]


def test_importing_the_errors_loads_neither_the_server_nor_its_framework() -> None:
    code = (
        "import sys, gateway.errors, gateway.codecs.openai;"
        "server = ('gateway.app', 'gateway.runtime', 'litestar');"
        "print(sorted(m for m in server if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
