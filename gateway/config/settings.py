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
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Literal

import msgspec
import yaml

from pipelines import ModelInfo, Policy, PolicyBounds, PolicyError

__all__ = [
    "ConfigError",
    "LimitSettings",
    "Settings",
    "StoreSettings",
    "TenantSettings",
    "UpstreamSettings",
    "load_settings",
]


class ConfigError(ValueError):
    """The configuration cannot be used; the message says where and why."""


class UpstreamSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The default OpenAI-compatible upstream."""

    base_url: str = "https://api.openai.com/v1"
    """Base URL ending in the API version, e.g. ``https://api.openai.com/v1``."""
    api_key: str | None = None
    """Key sent upstream instead of the caller's; ``None``: pass the caller's through."""
    connect_timeout: float = 10.0
    """Seconds to establish a connection."""
    read_timeout: float = 600.0
    """Seconds to wait for the next bytes of a response (reasoning models think long)."""
    write_timeout: float = 60.0
    """Seconds to send the request body."""
    pool_timeout: float = 10.0
    """Seconds to wait for a pooled connection."""
    max_connections: int | None = None
    """Open connections at most; ``None``: no cap, so streams never queue behind others."""
    max_keepalive_connections: int = 256
    """Idle connections kept for reuse."""
    pool_shards: int = 16
    """Independent connection pools the connections are spread over (see
    ``gateway.providers.openai.Upstream``); the limits above are totals across them."""
    keepalive_expiry: float = 30.0
    """Seconds an idle connection is kept."""
    max_error_body_bytes: int = 1_048_576
    """Largest upstream error body relayed; longer ones are cut."""

    def __post_init__(self) -> None:
        if not re.match(r"^https?://[^/\s]+", self.base_url):
            raise ConfigError(f"upstream.base_url must be an http(s) URL, got {self.base_url!r}")
        if self.api_key is not None and not self.api_key.isascii():
            raise ConfigError("upstream.api_key must be ASCII")
        for name in ("connect_timeout", "read_timeout", "write_timeout", "pool_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"upstream.{name} must be positive")
        if self.max_connections is not None and self.max_connections < 1:
            raise ConfigError("upstream.max_connections must be at least 1 or null")
        if not 1 <= self.pool_shards <= 256:
            raise ConfigError("upstream.pool_shards must be between 1 and 256")


class AnthropicSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The built-in Anthropic provider (``claude-*`` models)."""

    base_url: str = "https://api.anthropic.com"
    api_key: str | None = None
    """The Anthropic key (``CONTEXTGATE_ANTHROPIC_API_KEY``); ``None``: in passthrough
    mode the caller's own key goes, with tenants ``claude-*`` models are refused. The
    OpenAI upstream's key is never sent to Anthropic."""
    enabled: bool = True
    """``false``: ``claude-*`` models go to the OpenAI-compatible upstream like any other
    (a proxy that serves them in OpenAI form)."""


class StoreSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The offload store (Redis when ``redis_url`` is set, else memory)."""

    secret: str | None = None
    """Key of the refs' HMAC, shared by every replica (``CONTEXTGATE_STORE_SECRET``); at
    least 32 characters. ``None``: one is created in Redis on first start (or, in memory,
    per process)."""
    timeout: float = 0.25
    """Seconds one store operation may take before the request goes on without it."""
    max_object_bytes: int = 16 * 1024 * 1024
    """Largest object stored; larger content stays where it is."""
    memory_max_bytes: int = 256 * 1024 * 1024
    """Bytes the in-memory store may hold."""
    breaker_failures: int = 3
    """Consecutive failures after which the store is not asked for ``breaker_cooldown``."""
    breaker_cooldown: float = 5.0
    max_connections: int = 256
    """Redis connections per gateway process; past it, calls wait (within the timeout)."""

    def __post_init__(self) -> None:
        if self.secret is not None and len(self.secret) < 32:
            raise ConfigError("store.secret must be at least 32 characters")
        if not 0 < self.timeout <= 30:
            raise ConfigError("store.timeout must be in (0, 30] seconds")
        if not 1_024 <= self.max_object_bytes <= 512 * 1024 * 1024:
            raise ConfigError("store.max_object_bytes must be between 1 KiB and 512 MiB")
        if self.memory_max_bytes < self.max_object_bytes:
            raise ConfigError("store.memory_max_bytes must be at least max_object_bytes")
        if not 1 <= self.max_connections <= 10_000:
            raise ConfigError("store.max_connections must be between 1 and 10000")
        if self.breaker_failures < 1 or self.breaker_cooldown <= 0:
            raise ConfigError("store.breaker_failures must be >= 1, breaker_cooldown > 0")


class LimitSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How much one tenant (in passthrough mode, one upstream key) may ask at once, counted
    across replicas in Redis (in the process without Redis). Past a limit the answer is 429
    with ``Retry-After``; when Redis cannot be asked, the request goes on (fail-open)."""

    concurrency: int | None = None
    """Requests in progress at once, a stream until its last event; ``None``: no limit."""
    requests_per_minute: int | None = None
    """Requests started per minute; a burst of as many is allowed at once, then they are
    admitted evenly. ``None``: no limit."""

    def __post_init__(self) -> None:
        for name in ("concurrency", "requests_per_minute"):
            value = getattr(self, name)
            if value is not None and not 1 <= value <= 1_000_000:
                raise ConfigError(f"limits.{name} must be between 1 and 1000000, or null")


class TenantSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A team sharing the gateway: its gateway keys (as hashes), its upstream credentials,
    the models it may use, its policy and what its callers may tune, and its limits."""

    name: str
    """Lower-case letters, digits and dashes; names the tenant's namespace."""
    keys: tuple[str, ...]
    """Hashes of the tenant's gateway keys, as ``contextgate hash-key`` prints them."""
    upstream_api_key: str | None = None
    """The key sent to the OpenAI-compatible upstream for this tenant (by ``${ENV}``
    reference); ``None``: the global ``upstream.api_key``."""
    anthropic_api_key: str | None = None
    """The key sent to Anthropic for this tenant; ``None``: the global ``anthropic.api_key``."""
    models: tuple[str, ...] = ("*",)
    """Globs of the model names the tenant may use (``gpt-4o*``); others get 403. Summary
    models too."""
    policy: dict[str, Any] = msgspec.field(default_factory=dict)
    """The tenant's policy, by wire name, over the deployment's ``policy``."""
    bounds: dict[str, Any] = msgspec.field(default_factory=dict)
    """What the tenant's callers may tune with ``x-contextgate-policy``, within the
    deployment's ``bounds``: ``[low, high]`` for a numeric key, the values allowed for
    another, ``false`` for a key they may not set."""
    limits: LimitSettings | None = None
    """The tenant's limits; ``None``: the deployment's ``limits``."""

    def __post_init__(self) -> None:
        if not _TENANT_NAME.fullmatch(self.name):
            raise ConfigError(
                f"tenants: name {self.name!r} must be 1-64 lower-case letters, digits or dashes"
            )
        if not self.keys:
            raise ConfigError(f"tenants[{self.name}]: needs at least one key hash")
        for key in self.keys:
            if not _KEY_HASH.fullmatch(key):
                raise ConfigError(
                    f"tenants[{self.name}]: {key[:12]!r}... is not a key hash; store"
                    " `contextgate hash-key` output (sha256:<64 hex digits>), never the key"
                )
        for field in ("upstream_api_key", "anthropic_api_key"):
            value = getattr(self, field)
            if value is not None and (not value or not value.isascii()):
                raise ConfigError(f"tenants[{self.name}]: {field} must be a non-empty ASCII key")
        if not self.models or not all(self.models):
            raise ConfigError(f"tenants[{self.name}]: models must list at least one glob")


_TENANT_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
_KEY_HASH = re.compile(r"sha256:[0-9a-f]{64}")


class Settings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Everything the gateway is configured with."""

    upstream: UpstreamSettings = msgspec.field(default_factory=UpstreamSettings)
    anthropic: AnthropicSettings = msgspec.field(default_factory=AnthropicSettings)
    redis_url: str | None = None
    """Redis for the offload store, conversation records and limits (``REDIS_URL``);
    ``None``: in memory. One server: ``redis://host:6379/0`` (``rediss://`` for TLS).
    Sentinel: ``redis+sentinel://[:password@]host:26379[,host:26379...]/<service>[/<db>]``
    (``?sentinel_password=`` when the sentinels want one of their own). Cluster or Valkey
    cluster: ``redis+cluster://[:password@]host:6379[,host:6379...]``. ``rediss+sentinel``
    and ``rediss+cluster`` for TLS."""
    store: StoreSettings = msgspec.field(default_factory=StoreSettings)
    max_body_bytes: int = 32 * 1024 * 1024
    """Largest request body accepted; larger gets 413."""
    max_file_bytes: int = 512 * 1024 * 1024
    """Largest ``multipart/form-data`` body relayed (a file upload, an audio file to
    transcribe, an image to edit: every OpenAI route that takes a file takes it that way);
    larger gets 413. Such a body is streamed upstream as it arrives, never held in memory.
    The default is OpenAI's own limit for one file."""
    models: tuple[ModelInfo, ...] = ()
    """Catalog entries added to (or overriding) the built-in ones, with the fields of
    ``pipelines.ModelInfo``."""
    policy: dict[str, Any] = msgspec.field(default_factory=dict)
    """Policy defaults for every request, by wire name (``trigger: 0.6``)."""
    restore_tool: Literal["from_start", "when_needed"] = "from_start"
    """When a conversation's requests get the gateway's ``context_restore`` tool (kept on
    every later request once added): ``from_start``, from the first request of a
    conversation that brings tools of its own (one without gets it once it names an
    offloaded object, as some servers refuse tools a request did not ask for), so the
    tools the provider caches first never change; ``when_needed``, only from the first
    request that names an offloaded object, which changes the tools mid-conversation and
    costs the whole cached prefix once (``docs/DECISIONS.md``, "The restore tool's
    arrival")."""
    summaries: bool = True
    """Ask the summary model to replace compacted spans by a structured summary (policy
    ``mode=summarize``): prepared in the background from ``prepare`` utilisation, made
    synchronously (within ``summary-timeout``) only when none is ready at a cut."""
    summary_workers: int = 2
    """Background summaries running at once in a process."""
    summary_queue: int = 64
    """Background summaries waiting in a process; beyond it new ones are dropped (a
    later request of the conversation schedules its summary again)."""
    tenants: tuple[TenantSettings, ...] = ()
    """Teams sharing the gateway; none: passthrough mode (callers' own keys go upstream)."""
    bounds: dict[str, Any] = msgspec.field(default_factory=dict)
    """What every caller may tune with ``x-contextgate-policy`` (a tenant may narrow it):
    ``[low, high]`` for a numeric key, the values allowed for another, ``false`` for a key
    callers may not set. Keys not named keep their built-in range."""
    limits: LimitSettings = msgspec.field(default_factory=LimitSettings)
    """Limits of each tenant that sets none of its own, and in passthrough mode of each
    upstream key."""
    body_timeout: float = 30.0
    """Seconds a client may take to send its request body; then 408."""
    max_header_bytes: int = 65_536
    """Largest total size of a request's headers; larger gets 431."""
    log_prompts: bool = False
    """Debugging only: put each chat request's messages in its access-log line. Prompts
    are the users' data; off, no prompt content is logged."""
    shutdown_grace: float = 20.0
    """Seconds in-flight requests and streams may take to finish after SIGTERM; then
    what is left ends with a terminal error (``gateway_shutting_down``). Keep it below the
    orchestrator's kill deadline (Kubernetes: ``terminationGracePeriodSeconds`` minus any
    ``preStop`` delay) so the ending is the gateway's, not a SIGKILL."""
    max_in_flight: int | None = 1_024
    """Requests this process handles at once, every tenant together (a stream until its
    last event; ``/healthz``, ``/readyz`` and ``/metrics`` not counted); past it a request
    gets 503 ``gateway_overloaded`` with ``Retry-After`` before any work is done. The
    default keeps a process full of 20K-token requests (about 280 KiB each in flight, on
    225 MiB at rest) near 500 MiB, within the chart's 512 MiB memory request. ``None``:
    no cap."""
    max_queue_delay: float | None = 0.1
    """Seconds work may wait for the event loop: about what a small request waits, read by
    timing a callback through 20 turns of the loop every 50 ms. Once a reading is three
    times later than this, the number of requests admitted at once falls (to those in
    flight times this over the reading, never below 8) and new requests past it are refused
    with 503 ``gateway_overloaded``; each timely reading raises it again by a sixteenth, up
    to ``max_in_flight`` (``gateway.edge.overload``). A saturated process's turns all grow
    long; one large request is one long turn, which hardly moves the reading. ``None``: not
    checked."""

    stream_keepalive: float = 15.0
    """Seconds a relayed stream may stay silent before the gateway sends the client an
    SSE comment (``: keep-alive``), which SSE decoders skip, so that a proxy or load
    balancer with an idle timeout (often 60 s) does not cut a stream whose upstream is
    thinking. Keep it below the shortest idle timeout on the way; 0 turns it off."""

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1_024:
            raise ConfigError("max_body_bytes must be at least 1024")
        if self.max_file_bytes < 1_024:
            raise ConfigError("max_file_bytes must be at least 1024")
        if not 1 <= self.summary_workers <= 64 or not 1 <= self.summary_queue <= 10_000:
            raise ConfigError("summary_workers must be 1-64 and summary_queue 1-10000")
        if not 0 < self.body_timeout <= 3_600:
            raise ConfigError("body_timeout must be in (0, 3600] seconds")
        if not 4_096 <= self.max_header_bytes <= 1_048_576:
            raise ConfigError("max_header_bytes must be between 4096 and 1048576")
        if not 0 <= self.shutdown_grace <= 3_600:
            raise ConfigError("shutdown_grace must be in [0, 3600] seconds")
        if not (self.stream_keepalive == 0 or 0.1 <= self.stream_keepalive <= 3_600):
            raise ConfigError("stream_keepalive must be 0 (off) or in [0.1, 3600] seconds")
        if self.max_in_flight is not None and not 1 <= self.max_in_flight <= 1_000_000:
            raise ConfigError("max_in_flight must be between 1 and 1000000, or null")
        if self.max_queue_delay is not None and not 0.01 <= self.max_queue_delay <= 60:
            raise ConfigError("max_queue_delay must be in [0.01, 60] seconds, or null")
        if self.redis_url is not None:
            # Imported here: the store package imports this module.
            from gateway.store.topologies import RedisTopology

            try:
                RedisTopology.parse(self.redis_url)
            except ValueError as exc:
                raise ConfigError(str(exc)) from exc
        bounds = self.policy_bounds()
        names: set[str] = set()
        hashes: set[str] = set()
        for tenant in self.tenants:
            if tenant.name in names:
                raise ConfigError(f"tenants: {tenant.name!r} appears twice")
            names.add(tenant.name)
            if hashes & set(tenant.keys):
                raise ConfigError(f"tenants[{tenant.name}]: a key hash belongs to two tenants")
            hashes.update(tenant.keys)
            if tenant.upstream_api_key is None and self.upstream.api_key is None:
                raise ConfigError(
                    f"tenants[{tenant.name}]: no upstream key (set upstream_api_key, or"
                    " upstream.api_key for all); a tenant's gateway key is never sent upstream"
                )
            self.tenant_policy(tenant)
            self.tenant_bounds(tenant, bounds)

    def default_policy(self) -> Policy:
        """The deployment's policy: the built-in defaults with ``policy`` applied."""
        try:
            return Policy.from_mapping(self.policy)
        except PolicyError as exc:
            raise ConfigError(f"policy: {exc}") from exc

    def policy_bounds(self) -> PolicyBounds:
        try:
            return PolicyBounds.from_mapping(self.bounds)
        except PolicyError as exc:
            raise ConfigError(f"bounds: {exc}") from exc

    def tenant_policy(self, tenant: TenantSettings) -> Policy:
        """``tenant``'s policy: its ``policy`` over the deployment's."""
        try:
            policy = Policy.from_mapping(tenant.policy, self.default_policy())
        except PolicyError as exc:
            raise ConfigError(f"tenants[{tenant.name}].policy: {exc}") from exc
        if policy.summary_model is not None and not any(
            fnmatchcase(policy.summary_model, glob) for glob in tenant.models
        ):
            raise ConfigError(
                f"tenants[{tenant.name}].policy: summary-model {policy.summary_model!r} is not"
                " one of the tenant's models"
            )
        return policy

    def tenant_bounds(self, tenant: TenantSettings, outer: PolicyBounds) -> PolicyBounds:
        """``tenant``'s bounds, within the deployment's ``outer`` ones."""
        try:
            return outer.narrowed(PolicyBounds.from_mapping(tenant.bounds))
        except PolicyError as exc:
            raise ConfigError(f"tenants[{tenant.name}].bounds: {exc}") from exc


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
    _check_model_fields(data.get("models"))
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


def _check_model_fields(models: Any) -> None:
    """Unknown keys in a model entry are refused (msgspec ignores them on dataclasses)."""
    known = {field.name for field in dataclasses.fields(ModelInfo)}
    for index, entry in enumerate(models if isinstance(models, list) else ()):
        if isinstance(entry, dict) and (unknown := sorted(set(entry) - known)):
            raise ConfigError(
                f"models[{index}]: unknown field {unknown[0]!r}; known: {', '.join(sorted(known))}"
            )
