"""The error the configuration raises, below every settings module and the loader."""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """The configuration cannot be used; the message says where and why."""
