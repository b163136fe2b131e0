"""Admission: every route that is not marked public (``opt={"public": True}``: the health
checks and ``/metrics``) runs behind it.

Before the route handler, it first refuses the request when the process is overloaded
(503 ``gateway_overloaded`` with ``Retry-After``, ``gateway.edge.overload``; under
``contextgate serve`` the server's protocol has refused most of those already, as they were
read: ``gateway.edge.refusal``), and takes the request's in-flight slot. That check comes
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

from gateway.context.record import record_of
from gateway.edge.overload import Shedder
from gateway.errors import HeadersTooLarge
from gateway.http.responses import send_error
from gateway.store import Stores
from gateway.store.shared import namespace_id
from gateway.tenancy.auth import identify
from gateway.tenancy.limits import Limiter
from gateway.tenancy.tenants import Tenants

__all__ = ["Admission"]


class Admission(ASGIMiddleware):
    """Built with the parts it consults: the process's shedder, the tenants and stores that
    identify a caller, the limiter, and the largest headers accepted."""

    scopes = (ScopeType.HTTP,)
    exclude_opt_key = "public"

    def __init__(
        self,
        shedder: Shedder,
        tenants: Tenants,
        stores: Stores,
        limiter: Limiter,
        *,
        max_header_bytes: int,
    ) -> None:
        self.shedder, self.tenants, self.stores, self.limiter = shedder, tenants, stores, limiter
        self.max_header_bytes = max_header_bytes

    async def handle(self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
        refusal = self.shedder.admit()
        if refusal is not None:
            # Answered here, not through Litestar's exception handlers: there a refusal
            # cost about half a small request, too much when the point is to save work.
            record = record_of(scope.get("state", {}))
            await send_error(scope, send, refusal, record.request_id if record else None)
            return
        try:
            await self._admit_caller(scope, receive, send, next_app)
        finally:
            self.shedder.release()

    async def _admit_caller(
        self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp
    ) -> None:
        limit = self.max_header_bytes
        size = 0
        for name, value in scope["headers"]:
            size += len(name) + len(value)
        if size > limit:
            raise HeadersTooLarge(f"The request's headers are larger than {limit:,} bytes.")
        caller = await identify(self.tenants, self.stores, Headers.from_scope(scope))
        record = record_of(scope.get("state", {}))
        if record is not None:
            record.caller = caller
        tenant = caller.tenant
        key = "t:" + tenant if tenant is not None else namespace_id(caller.namespace)
        lease = await self.limiter.admit(key, tenant or "passthrough", caller.profile.limits)
        try:
            await next_app(scope, receive, send)
        finally:
            if lease is not None:
                with anyio.CancelScope(shield=True):
                    await lease.release()
