"""Tenant settings, checked when the configuration is built: key hashes, names, upstream
keys, and each tenant's policy, bounds, models and limits against the deployment's."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config import (
    ConfigError,
    LimitSettings,
    Settings,
    TenantSettings,
    UpstreamSettings,
)
from gateway.tenancy.tenants import hash_key

ALPHA, BETA = "cg-alpha-key-0123456789abcdef", "cg-beta-key-0123456789abcdef"


def test_tenant_configuration_is_checked() -> None:
    with pytest.raises(ConfigError, match="not a key hash"):
        TenantSettings("alpha", ("cg-the-raw-key",))
    with pytest.raises(ConfigError, match="lower-case"):
        TenantSettings("Alpha Team", (hash_key(ALPHA),))
    with pytest.raises(ConfigError, match="no upstream key"):
        Settings(tenants=(TenantSettings("alpha", (hash_key(ALPHA),)),))
    with pytest.raises(ConfigError, match="two tenants"):
        Settings(
            upstream=UpstreamSettings(api_key="sk-x"),
            tenants=(
                TenantSettings("alpha", (hash_key(ALPHA),)),
                TenantSettings("beta", (hash_key(ALPHA),)),
            ),
        )


def test_tenant_policy_bounds_and_models_are_checked_at_start() -> None:
    """A tenant's policy, bounds and models are refused at start-up with the field named:
    bounds wider than the deployment's, an unknown key, a summary model it may not use."""
    upstream = UpstreamSettings(api_key="sk-x")
    alpha = (hash_key(ALPHA),)
    cases: list[tuple[dict[str, Any], dict[str, Any], str]] = [
        (
            {"bounds": {"max-input": [8000, 64000]}},
            {"bounds": {"max-input": [4000, 9000]}},
            "wider",
        ),
        ({}, {"bounds": {"keep_images": [0, 2]}}, "unknown key"),
        ({}, {"bounds": {"trigger": [0.5]}}, r"\[low, high\]"),
        ({}, {"models": ("gpt-4o*",), "policy": {"summary-model": "o3-mini"}}, "summary-model"),
        ({}, {"policy": {"trigger": 2}}, "between 0.05 and 1"),
        ({}, {"limits": {"concurrency": 0}}, "concurrency"),
    ]
    for deployment, tenant, says in cases:
        with pytest.raises(ConfigError, match=says):
            fields = dict(tenant)
            if "limits" in fields:
                fields["limits"] = LimitSettings(**fields["limits"])
            Settings(
                upstream=upstream,
                tenants=(TenantSettings("alpha", alpha, **fields),),
                **deployment,
            )
