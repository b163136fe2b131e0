"""The configuration: typed settings per feature, and the YAML loader
(``gateway.config.loader`` says where settings come from)."""

from gateway.config.errors import ConfigError
from gateway.config.inspector import InspectorSettings
from gateway.config.loader import load_settings
from gateway.config.settings import Settings
from gateway.config.store import RedisTopology, StoreSettings
from gateway.config.tenants import LimitSettings, TenantSettings
from gateway.config.upstream import AnthropicSettings, UpstreamSettings

__all__ = [
    "AnthropicSettings",
    "ConfigError",
    "InspectorSettings",
    "LimitSettings",
    "RedisTopology",
    "Settings",
    "StoreSettings",
    "TenantSettings",
    "UpstreamSettings",
    "load_settings",
]
