"""``Settings``: the whole configuration, composed of each feature's settings (read by
``gateway.config.loader``)."""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any, Literal

import msgspec

from gateway.config.errors import ConfigError
from gateway.config.inspector import InspectorSettings
from gateway.config.store import RedisTopology, StoreSettings
from gateway.config.tenants import LimitSettings, TenantSettings
from gateway.config.upstream import AnthropicSettings, UpstreamSettings
from pipelines import ModelInfo, ModelPrice, Policy, PolicyBounds, PolicyError

__all__ = ["Settings"]


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
    prices: tuple[ModelPrice, ...] = ()
    """Price-table entries added to (or overriding) the built-in ones, with the fields of
    ``pipelines.ModelPrice`` (US dollars per million tokens): the inspector's cost
    estimates. A model without a price shows its cost as unknown."""
    inspector: InspectorSettings = msgspec.field(default_factory=InspectorSettings)
    """The ledger of what the gateway did, its JSON API and its page at ``/ui/``."""
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
