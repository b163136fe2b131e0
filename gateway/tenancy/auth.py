"""Who is calling: the tenant a gateway key belongs to, or, in passthrough mode, whoever
holds the upstream key presented.

Decided from the request's credentials alone (``Authorization: Bearer`` or ``x-api-key``),
never from ``Host`` or ``X-Forwarded-*``, by ``gateway.edge.admission`` before any route that is
not public runs. With tenants configured, a request without a known gateway key is a 401
and the key itself never goes upstream: the tenant's (or the global) upstream key does.
Without tenants, the caller's key goes upstream as it is and names the caller's namespace
through a keyed hash (``Stores.namespace_of``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway.errors import GatewayError
from gateway.store import Stores
from gateway.tenancy.tenants import Profile, Tenants

__all__ = ["Caller", "Unauthorized", "credential_of", "identify"]


class Unauthorized(GatewayError):
    status = 401
    type = "invalid_request_error"
    default_code = "invalid_api_key"


@dataclass(frozen=True, slots=True)
class Caller:
    namespace: str
    """Where the caller's offloaded content and conversations live."""
    profile: Profile
    """The caller's tenant, or the passthrough profile."""

    @property
    def tenant(self) -> str | None:
        return self.profile.tenant

    @property
    def upstream_key(self) -> str | None:
        """The key to send upstream instead of the caller's; ``None``: forward the caller's."""
        return self.profile.upstream_api_key


def credential_of(headers: Mapping[str, str]) -> str | None:
    """The key the caller presents: ``Authorization: Bearer``, or ``x-api-key``."""
    authorization = headers.get("authorization")
    if authorization:
        scheme, _, token = authorization.partition(" ")
        return token.strip() if scheme.lower() == "bearer" and token.strip() else authorization
    return headers.get("x-api-key") or None


async def identify(tenants: Tenants, stores: Stores, headers: Mapping[str, str]) -> Caller:
    """The caller presenting ``headers``' credentials, or ``Unauthorized``: a tenant's
    gateway key, or (without tenants) an upstream key, whose namespace ``stores`` names."""
    credential = credential_of(headers)
    if tenants:
        profile = tenants.of(credential)
        if profile is None:
            raise Unauthorized(
                "A valid gateway key is required: send it as `Authorization: Bearer <key>`"
                " or `x-api-key`."
                if credential is None
                else "The gateway key is not valid."
            )
        return Caller("tenant:" + str(profile.tenant), profile)
    return Caller(await stores.namespace_of(credential), tenants.passthrough)
