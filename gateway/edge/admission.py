"""Admission: every route that is not marked public (``opt={"public": True}``: the health
checks and ``/metrics``) runs behind it.

Before the route handler, it first refuses the request when the process is overloaded
(503 ``gateway_overloaded`` with ``Retry-After``, ``gateway.edge.overload``). That check comes
before authentication because it must cost least: authentication and limits may ask
Redis, work an overloaded process should not take on for a request it then refuses. Then
it refuses oversized headers (431), identifies the caller from its credentials
(``gateway.tenancy.auth``; 401 when tenants are configured and the key is not known) and takes a
slot within the caller's limits (429 with ``Retry-After``). The decision rests on the
route Litestar matched for the request's path, never on ``Host`` or ``X-Forwarded-*``.
Both slots (the process's and the caller's) are given back when the response is over: a
stream at its last event, however the exchange ends.
"""

from __future__ import annotations

import anyio
from litestar.datastructures import Headers
from litestar.enums import ScopeType
from litestar.middleware import ASGIMiddleware
from litestar.types import ASGIApp, Receive, Scope, Send

from gateway.errors import HeadersTooLarge
from gateway.http.responses import send_error
from gateway.runtime import Gateway
from gateway.store.redis import namespace_id
from gateway.tenancy.auth import identify

__all__ = ["Admission"]


class Admission(ASGIMiddleware):
    scopes = (ScopeType.HTTP,)
    exclude_opt_key = "public"

    async def handle(self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
        gateway: Gateway = scope["litestar_app"].state.gateway
        shedder = gateway.shedder
        refusal = shedder.admit()
        if refusal is not None:
            # Answered here, not through Litestar's exception handlers: there a refusal
            # cost about half a small request, too much when the point is to save work.
            await send_error(scope, send, refusal)
            return
        try:
            await self._admit_caller(gateway, scope, receive, send, next_app)
        finally:
            shedder.release()

    @staticmethod
    async def _admit_caller(
        gateway: Gateway, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp
    ) -> None:
        limit = gateway.settings.max_header_bytes
        if sum(len(name) + len(value) for name, value in scope["headers"]) > limit:
            raise HeadersTooLarge(f"The request's headers are larger than {limit:,} bytes.")
        caller = await identify(gateway, Headers.from_scope(scope))
        scope.setdefault("state", {})["caller"] = caller
        tenant = caller.tenant
        key = "t:" + tenant if tenant is not None else namespace_id(caller.namespace)
        lease = await gateway.limiter.admit(key, tenant or "passthrough", caller.profile.limits)
        try:
            await next_app(scope, receive, send)
        finally:
            if lease is not None:
                with anyio.CancelScope(shield=True):
                    await lease.release()
