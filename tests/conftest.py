"""Shared fixtures: the mock upstream, a running gateway in front of it, and Redis."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from gateway.config import AnthropicSettings, Settings, UpstreamSettings
from tests.harness import GatewayServer, private_redis, redis_from_env
from tests.mock_upstream import MockUpstream

# Property tests: `fast` in CI and by default, `deep` on demand (HYPOTHESIS_PROFILE=deep).
# No deadline: this machine is shared, and a slow example is not a failing one.
hypothesis_settings.register_profile(
    "fast", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
hypothesis_settings.register_profile("deep", max_examples=5_000, deadline=None)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fast"))

# The suite's in-process gateways do not trace, whatever the developer's shell exports
# (tests/gateway/telemetry/test_tracing.py runs traced gateways in processes of their own).
for name in [name for name in os.environ if name.startswith("OTEL_")]:
    del os.environ[name]


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """``REDIS_URL`` when set, else a private redis-server started for this run."""
    url = redis_from_env()
    if url:
        yield url
        return
    with private_redis() as url:
        yield url


@pytest.fixture(scope="session")
def mock_upstream() -> Iterator[MockUpstream]:
    with MockUpstream() as server:
        yield server


@pytest.fixture
def upstream(mock_upstream: MockUpstream) -> Iterator[MockUpstream]:
    """The mock upstream with an empty script and history."""
    mock_upstream.reset()
    yield mock_upstream
    mock_upstream.reset()


def settings_for(upstream: MockUpstream, **overrides: object) -> Settings:
    """Settings for a gateway in front of ``upstream``. Summaries (on in the product) are
    off unless a test asks for them: their background calls go to the same mock and would
    take replies a test scripted for its own requests. ``tests/scenarios/test_summaries.py``
    runs them with the mock playing the summary model."""
    overrides.setdefault("summaries", False)
    upstream_fields = {
        k: v for k, v in overrides.items() if k in UpstreamSettings.__struct_fields__
    }
    other = {k: v for k, v in overrides.items() if k not in upstream_fields}
    return Settings(
        upstream=UpstreamSettings(base_url=upstream.base_url, **upstream_fields),  # type: ignore[arg-type]
        **other,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="session")
def session_gateway(mock_upstream: MockUpstream, redis_url: str) -> Iterator[GatewayServer]:
    settings = settings_for(mock_upstream, read_timeout=5.0, redis_url=redis_url)
    with GatewayServer(settings) as server:
        yield server


@pytest.fixture
def gateway(session_gateway: GatewayServer, upstream: MockUpstream) -> GatewayServer:
    """The shared gateway in front of a freshly reset mock upstream."""
    return session_gateway


@pytest.fixture
def anthropic_gateway(upstream: MockUpstream) -> Iterator[GatewayServer]:
    """A gateway whose built-in Anthropic provider (``claude-*``) talks to the mock too."""
    settings = Settings(
        upstream=UpstreamSettings(base_url=upstream.base_url),
        anthropic=AnthropicSettings(base_url=upstream.base_url.removesuffix("/v1")),
        summaries=False,
    )
    with GatewayServer(settings) as server:
        yield server
