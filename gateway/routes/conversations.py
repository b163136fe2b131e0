"""The ledger's JSON API: what the gateway did to the caller's conversations.

- ``GET /v1/context/conversations``: the caller's conversations, the most recently active
  first, each with its totals (requests, tokens sent and sent up, cost, cache).
- ``GET /v1/context/conversations/{id}``: one conversation's totals and its requests'
  entries (``entries``), newest first.
- ``GET /v1/context/conversations/{id}/requests/{request_id}``: one request's entry with its
  detail (the messages the client sent beside those that went up), while it is kept.

The caller is placed in a namespace exactly as on the chat routes (its key): no caller
ever sees another namespace's conversations, and an id of another namespace is a 404.
Callers without a key share one namespace, which is kept and shown only with
``inspector.anonymous`` (else a 404); while the store's secret cannot be read, 503.
Lists take ``limit`` (1-100, default 20) and ``offset`` (from 0) and say ``total`` and
``has_more``. With the inspector off (``inspector.enabled``), every route is a 404. The
shapes are in ``docs/API.md``.
"""

from __future__ import annotations

from typing import Any, Final

import orjson
from litestar import Request, get
from litestar.response.base import ASGIResponse

from gateway.errors import InvalidRequest, NotFound, StoreUnavailable
from gateway.routes.calls import caller_of, record_of, runtime_of
from gateway.runtime import Gateway
from gateway.store.ledger import Ledger, LedgerPage
from gateway.store.stores import ANONYMOUS, UNRESOLVED
from pipelines import StoreError

__all__ = ["conversation", "conversation_request", "conversations"]

DEFAULT_LIMIT: Final = 20
MAX_LIMIT: Final = 100
_MAX_OFFSET: Final = 1_000_000


@get("/v1/context/conversations")
async def conversations(request: Request[Any, Any, Any]) -> ASGIResponse:
    ledger, namespace = _ledger(request)
    offset, limit = _page(request)
    try:
        page = await ledger.conversations(namespace, offset=offset, limit=limit)
    except StoreError as exc:
        raise _unavailable(exc) from exc
    return _json(request, {"object": "list", **_listed(page, offset, limit)})


@get("/v1/context/conversations/{conversation_id:str}")
async def conversation(request: Request[Any, Any, Any]) -> ASGIResponse:
    ledger, namespace = _ledger(request)
    found: str = request.path_params["conversation_id"]
    offset, limit = _page(request)
    try:
        row = await ledger.conversation(namespace, found)
        page = await ledger.requests(namespace, found, offset=offset, limit=limit)
    except StoreError as exc:
        raise _unavailable(exc) from exc
    if row is None:
        raise NotFound(f"No conversation {found!r} (it may have expired).", param="id")
    listed = _listed(page, offset, limit)
    return _json(request, {"object": "conversation", **row, "entries": listed})


@get("/v1/context/conversations/{conversation_id:str}/requests/{request_id:str}")
async def conversation_request(request: Request[Any, Any, Any]) -> ASGIResponse:
    ledger, namespace = _ledger(request)
    found: str = request.path_params["conversation_id"]
    request_id: str = request.path_params["request_id"]
    try:
        entry = await ledger.request(namespace, found, request_id)
    except StoreError as exc:
        raise _unavailable(exc) from exc
    if entry is None:
        raise NotFound(
            f"No request {request_id!r} in conversation {found!r} (it may have expired).",
            param="request_id",
        )
    return _json(request, {"object": "conversation.request", **entry})


def ledger_of(gateway: Gateway) -> Ledger:
    """The process's ledger; ``NotFound`` with the inspector off."""
    if not gateway.settings.inspector.enabled:
        raise NotFound("The context inspector is off on this gateway (inspector.enabled).")
    return gateway.stores.ledger


def _ledger(request: Request[Any, Any, Any]) -> tuple[Ledger, str]:
    gateway, namespace = runtime_of(request), caller_of(request).namespace
    ledger = ledger_of(gateway)
    if namespace == UNRESOLVED:
        raise StoreUnavailable("The store's secret cannot be read, so neither can the ledger.")
    if namespace == ANONYMOUS and not gateway.settings.inspector.anonymous:
        raise NotFound(
            "Requests sent without a key are not kept in the ledger on this gateway"
            " (inspector.anonymous): send the key your client sends."
        )
    return ledger, namespace


def _page(request: Request[Any, Any, Any]) -> tuple[int, int]:
    offset = _whole(request.query_params.get("offset"), "offset", 0, _MAX_OFFSET)
    limit = _whole(request.query_params.get("limit"), "limit", 1, MAX_LIMIT)
    return offset if offset is not None else 0, limit if limit is not None else DEFAULT_LIMIT


def _whole(value: str | None, name: str, low: int, high: int) -> int | None:
    if value is None:
        return None
    if not (value.isascii() and value.isdecimal() and len(value) <= 9) or not (
        low <= int(value) <= high
    ):
        raise InvalidRequest(
            f"{name} must be a whole number from {low} to {high}, got {value!r}",
            code="invalid_parameter",
            param=name,
        )
    return int(value)


def _listed(page: LedgerPage, offset: int, limit: int) -> dict[str, Any]:
    return {
        "data": page.items,
        "total": page.total,
        "offset": offset,
        "limit": limit,
        "has_more": offset + len(page.items) < page.total,
    }


def _unavailable(exc: StoreError) -> StoreUnavailable:
    return StoreUnavailable(f"The ledger's store is unavailable: {exc}")


def _json(request: Request[Any, Any, Any], body: dict[str, Any]) -> ASGIResponse:
    return ASGIResponse(
        body=orjson.dumps(body),
        media_type="application/json",
        headers={"x-contextgate-request-id": record_of(request).request_id},
    )
