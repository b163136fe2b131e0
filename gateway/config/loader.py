"""Configuration: built-in defaults, then the YAML file, then the environment.

With no file at all the gateway serves: OpenAI upstream, in-memory store, the caller's
own key passed through. The YAML file (``--config`` or ``CONTEXTGATE_CONFIG``) may use
``${NAME}`` (or ``${NAME:-default}``) to pull secrets from the environment. Everything is
parsed into frozen structs and validated once at start-up; a bad file stops the gateway
with a message that names the field.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
import yaml

from gateway.config.errors import ConfigError
from gateway.config.settings import Settings
from pipelines import ModelInfo, ModelPrice

__all__ = ["load_settings"]


class _Loader(yaml.SafeLoader):
    """YAML with the 1.2 booleans only: ``mode: off`` is the string ``off``, not false."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _substitute(value: Any, environ: Mapping[str, str]) -> Any:
    """``value`` with ``${NAME}`` references replaced in every string it holds.

    Done on the parsed document, not its text, so comments may mention references and a
    secret's characters can never change the YAML's structure."""
    if isinstance(value, dict):
        return {key: _substitute(item, environ) for key, item in value.items()}
    if isinstance(value, list):
        return [_substitute(item, environ) for item in value]
    if not isinstance(value, str):
        return value

    def replacement(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in environ:
            return environ[name]
        if default is not None:
            return default
        raise ConfigError(f"the configuration refers to ${{{name}}}, which is not set")

    return _ENV_REF.sub(replacement, value)


def load_settings(
    path: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Settings from ``path`` (or ``CONTEXTGATE_CONFIG``) with environment overrides."""
    env = os.environ if environ is None else environ
    path = path or env.get("CONTEXTGATE_CONFIG") or None
    data: dict[str, Any] = {}
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read configuration {path}: {exc.strerror}") from exc
        try:
            loaded = _substitute(yaml.load(text, Loader=_Loader), env)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping")
        data = loaded or {}
    overrides = {
        ("upstream", "base_url"): env.get("CONTEXTGATE_UPSTREAM_BASE_URL"),
        ("upstream", "api_key"): env.get("CONTEXTGATE_UPSTREAM_API_KEY"),
        ("anthropic", "base_url"): env.get("CONTEXTGATE_ANTHROPIC_BASE_URL"),
        ("anthropic", "api_key"): env.get("CONTEXTGATE_ANTHROPIC_API_KEY"),
        ("redis_url",): env.get("REDIS_URL"),
        ("store", "secret"): env.get("CONTEXTGATE_STORE_SECRET"),
    }
    for keys, value in overrides.items():
        if value:
            target = data
            for key in keys[:-1]:
                target = target.setdefault(key, {})
                if not isinstance(target, dict):
                    raise ConfigError(f"{key} must be a mapping")
            target[keys[-1]] = value
    _check_fields(data.get("models"), "models", ModelInfo)
    _check_fields(data.get("prices"), "prices", ModelPrice)
    # An unset ${VAR:-} leaves an empty string: for optional settings that means "not set".
    if data.get("redis_url") == "":
        data["redis_url"] = None
    for section, key in (("upstream", "api_key"), ("store", "secret")):
        part = data.get(section)
        if isinstance(part, dict) and part.get(key) == "":
            part[key] = None
    try:
        settings = msgspec.convert(data, Settings)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid configuration: {exc}") from exc
    settings.default_policy()
    return settings


def _check_fields(entries: Any, section: str, kind: type[Any]) -> None:
    """Unknown keys in a catalog entry (``models``, ``prices``) are refused (msgspec
    ignores them on dataclasses)."""
    known = {field.name for field in dataclasses.fields(kind)}
    for index, entry in enumerate(entries if isinstance(entries, list) else ()):
        if isinstance(entry, dict) and (unknown := sorted(set(entry) - known)):
            raise ConfigError(
                f"{section}[{index}]: unknown field {unknown[0]!r};"
                f" known: {', '.join(sorted(known))}"
            )
