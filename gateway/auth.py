"""Who is calling: the tenant a gateway key belongs to, or, in passthrough mode, whoever
holds the upstream key presented.

Decided from the request's credentials alone (``Authorization: Bearer`` or ``x-api-key``),
never from ``Host`` or ``X-Forwarded-*``. With tenants configured, a request without a
known gateway key is a 401 and the key itself never goes upstream: the tenant's (or the
global) upstream key does. Without tenants, the caller's key goes upstream as it is and
names the caller's namespace through a keyed hash (``Stores.namespace_of``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from litestar import Request

from gateway.errors import GatewayError
from gateway.state import Gateway
from gateway.tenants import hash_key

__all__ = ["Caller", "Unauthorized", "caller_of", "credential_of", "hash_key"]


class Unauthorized(GatewayError):
    status = 401
    type = "invalid_request_error"
    default_code = "invalid_api_key"


@dataclass(frozen=True, slots=True)
class Caller:
    namespace: str
    upstream_key: str | None
    """The key to send upstream instead of the caller's; ``None``: forward the caller's."""
    tenant: str | None = None


def credential_of(headers: Mapping[str, str]) -> str | None:
    """The key the caller presents: ``Authorization: Bearer``, or ``x-api-key``."""
    authorization = headers.get("authorization")
    if authorization:
        scheme, _, token = authorization.partition(" ")
        return token.strip() if scheme.lower() == "bearer" and token.strip() else authorization
    return headers.get("x-api-key") or None


async def caller_of(request: Request[Any, Any, Any]) -> Caller:
    """The caller of ``request``, or ``Unauthorized``."""
    gateway: Gateway = request.app.state.gateway
    credential = credential_of(request.headers)
    tenants = gateway.tenants
    if tenants:
        tenant = tenants.of(credential)
        if tenant is None:
            raise Unauthorized(
                "A valid gateway key is required: send it as `Authorization: Bearer <key>`"
                " or `x-api-key`."
                if credential is None
                else "The gateway key is not valid."
            )
        request.state.tenant = tenant.name  # for the access log and metrics (gateway.access)
        upstream_key = tenant.upstream_api_key or gateway.settings.upstream.api_key
        return Caller("tenant:" + tenant.name, upstream_key, tenant.name)
    namespace = await gateway.stores.namespace_of(credential)
    return Caller(namespace, gateway.settings.upstream.api_key)
