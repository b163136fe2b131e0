"""What a route reads off Litestar's request: the process's parts, the request's record and
caller, its body within the gateway's limits, and the ``Call`` it hands down.

Only routes use these: below them nothing sees Litestar (``gateway.context.call``).
"""

from __future__ import annotations

from time import perf_counter
from typing import Any, NamedTuple

from litestar import Request

from gateway.context.call import Call
from gateway.context.record import RECORD, RequestRecord, new_request_id
from gateway.http.client import read_body
from gateway.runtime import Gateway
from gateway.tenancy.auth import Caller

__all__ = ["Received", "body_of", "call_of", "caller_of", "received", "record_of", "runtime_of"]

AnyRequest = Request[Any, Any, Any]


def runtime_of(request: AnyRequest) -> Gateway:
    """The process's parts (``gateway.runtime.Gateway``)."""
    gateway: Gateway = request.app.state.gateway
    return gateway


def record_of(request: AnyRequest) -> RequestRecord:
    """The request's record, which the access log made for it."""
    state = request.scope.setdefault("state", {})
    record = state.get(RECORD)
    if not isinstance(record, RequestRecord):  # an app run without its access log
        record = state[RECORD] = RequestRecord(new_request_id())
    return record


def caller_of(request: AnyRequest) -> Caller:
    """The caller ``gateway.edge.admission`` identified for ``request``."""
    caller = record_of(request).caller
    if caller is None:
        raise RuntimeError("a route behind admission ran without a caller")
    return caller


def call_of(request: AnyRequest, started: float) -> Call:
    """The request as the context work takes it (``started``: when the route began)."""
    return Call(request.headers, caller_of(request), record_of(request), request.receive, started)


async def body_of(request: AnyRequest) -> bytes:
    """The request's body, read within the gateway's size and time limits."""
    settings = runtime_of(request).settings
    return await read_body(
        request.receive,
        request.headers.get("content-length"),
        settings.max_body_bytes,
        within=settings.body_timeout,
    )


class Received(NamedTuple):
    """What a route that compacts works from."""

    gateway: Gateway
    call: Call
    body: bytes


async def received(request: AnyRequest) -> Received:
    """The process's parts, the request as a ``Call`` (begun now) and its body."""
    call = call_of(request, perf_counter())
    return Received(runtime_of(request), call, await body_of(request))
