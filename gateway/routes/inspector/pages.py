"""The inspector's pages under ``/ui/``: the conversations, one conversation's timeline,
one request, one offloaded object; the form that opens a session and the button that
closes it.

Each page shows the namespace of the session's cookie only (``session.py``), read from
the ledger (``gateway.store.ledger``) and the offload store. Without a valid session a
page is the key form. The list and the timeline are polled by ``inspector.js``: the same
URL with ``x-contextgate-fragment: live`` answers the part that changes only (401 when the
session has ended, so that the page reloads into the form).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from typing import Annotated, Any, Final
from urllib.parse import unquote

import orjson
from litestar import Request, get, post
from litestar.datastructures import Cookie
from litestar.exceptions import NotFoundException, PermissionDeniedException
from litestar.params import QueryParameter
from litestar.response import Redirect, Response, Template

from gateway.routes.calls import runtime_of
from gateway.routes.inspector import views
from gateway.routes.inspector.chart import LEVELS, chart_of
from gateway.routes.inspector.session import COOKIE, LIFETIME, opened, sealed
from gateway.store import REF_PATTERN
from gateway.store.stores import ANONYMOUS, UNRESOLVED
from gateway.tenancy.auth import Unauthorized, identify
from pipelines import StoreError

__all__ = [
    "close_session",
    "conversation_pages",
    "conversations_page",
    "object_page",
    "open_session",
]

AnyRequest = Request[Any, Any, Any]
Page = Annotated[int, QueryParameter(ge=1, le=1_000_000)]
FRAGMENT: Final = "x-contextgate-fragment"
"""The header ``inspector.js`` sends for the live part of a page."""
CONVERSATIONS_PER_PAGE: Final = 25
REQUESTS_PER_PAGE: Final = 50
CHARTED: Final = 500
"""The latest requests of a conversation the chart shows at most."""
OBJECT_SHOWN: Final = 1_048_576
"""Bytes of an object the page shows at most."""
_IMAGE_TYPES: Final = ("data:image/png;", "data:image/jpeg;", "data:image/gif;", "data:image/webp;")
_PREFIX: Final = "/ui/conversations/"
_FORM_BYTES: Final = 4_096
"""The largest form a session route reads: a key, and the page to return to (these
routes are public, so nothing larger is buffered for an anonymous client)."""
_INSPECTOR_URL: Final = re.compile(r"/ui/[A-Za-z0-9._~%/:@+=!$&'()*,;?-]*")


async def _namespace(request: AnyRequest) -> str | None:
    """The namespace of the request's session, or ``None`` without a valid one. A
    session is valid only for a namespace the gateway still admits callers to: a tenant
    still configured, or a key's namespace while there are no tenants."""
    value = request.cookies.get(COOKIE)
    if not value:
        return None
    gateway = runtime_of(request)
    namespace = opened(value, await gateway.stores.secret(), time.time())
    if namespace is None or (namespace == ANONYMOUS and not gateway.settings.inspector.anonymous):
        return None
    tenant = namespace.removeprefix("tenant:") if namespace.startswith("tenant:") else None
    if gateway.tenants:
        names = {configured.name for configured in gateway.settings.tenants}
        return namespace if tenant in names else None
    return namespace if tenant is None else None


def _page(request: AnyRequest, name: str, context: dict[str, Any]) -> Template:
    """``name``'s page, or its live part (``_<name>``) when the poller asks for it."""
    live = request.headers.get(FRAGMENT) == "live"
    return Template(template_name=f"_{name}" if live else name, context=context)


def _form(
    request: AnyRequest, *, status: int = 200, message: str | None = None, then: str = ""
) -> Template | Response[bytes]:
    """The key form (after a bad session cookie, with it cleared)."""
    if request.headers.get(FRAGMENT) == "live":
        return Response(b"", status_code=401, media_type="text/plain")
    if message is None and request.cookies.get(COOKIE):
        message = "Your session has ended (a session lasts 12 hours). Give your key again."
    tenanted = bool(runtime_of(request).tenants)
    context = {"message": message, "tenanted": tenanted, "then": then, "viewer": None}
    cookies = [_cookie(request, "", 0)] if request.cookies.get(COOKIE) else []
    return Template(
        template_name="login.html", context=context, status_code=status, cookies=cookies
    )


def _cookie(request: AnyRequest, value: str, max_age: int) -> Cookie:
    forwarded = request.headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
    return Cookie(
        key=COOKIE,
        value=value,
        max_age=max_age,
        path="/ui",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https" or forwarded == "https",
    )


def _refuse_cross_site(request: AnyRequest) -> None:
    """A form posted from another site (a login or logout it forged) is refused."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        if site not in ("same-origin", "none"):
            raise PermissionDeniedException("A form from another site cannot open a session.")
        return
    origin, host = request.headers.get("origin"), request.headers.get("host")
    if origin is not None and origin.partition("://")[2] != host:
        raise PermissionDeniedException("A form from another site cannot open a session.")


def _raw_path(request: AnyRequest) -> str:
    """The path as the client wrote it, its escapes kept."""
    raw = request.scope.get("raw_path") or request.scope["path"].encode()
    return bytes(raw).decode("latin-1")


def _here(request: AnyRequest) -> str:
    query = request.scope.get("query_string", b"").decode("latin-1")
    return _raw_path(request) + (f"?{query}" if query else "")


def _then(value: Any) -> str:
    """Where to go after the form: a page of the inspector, else its list (never a place
    off the gateway)."""
    if isinstance(value, str) and _INSPECTOR_URL.fullmatch(value) and "//" not in value:
        return value
    return "/ui/"


def who(namespace: str) -> str:
    """The namespace as the viewer knows it."""
    if namespace.startswith("tenant:"):
        return f"tenant {namespace.removeprefix('tenant:')}"
    if namespace == "anonymous":
        return "no key (anonymous)"
    return f"upstream key {namespace.removeprefix('key:')[:8]}…"


@get("/ui/")
async def conversations_page(request: AnyRequest, page: Page = 1) -> Template | Response[bytes]:
    """The namespace's conversations, the most recently active first."""
    namespace = await _namespace(request)
    if namespace is None:
        return _form(request)
    ledger = runtime_of(request).stores.ledger
    found = await ledger.conversations(
        namespace, offset=(page - 1) * CONVERSATIONS_PER_PAGE, limit=CONVERSATIONS_PER_PAGE
    )
    context = {
        "viewer": who(namespace),
        "rows": [views.Row.of(row) for row in found.items],
        "total": found.total,
        "page": page,
        "pages": max(1, math.ceil(found.total / CONVERSATIONS_PER_PAGE)),
        "origin": str(request.base_url).rstrip("/"),
        "tenanted": bool(runtime_of(request).tenants),
    }
    return _page(request, "conversations.html", context)


@post("/ui/session", status_code=303, request_max_body_size=_FORM_BYTES)
async def open_session(request: AnyRequest) -> Template | Response[bytes] | Redirect:
    """The key given in the form, identified as the API would; its namespace in a signed
    cookie, never the key."""
    _refuse_cross_site(request)
    gateway = runtime_of(request)
    form = await request.form()
    key, then = form.get("key"), _then(form.get("next"))
    key = key.strip() if isinstance(key, str) else ""
    headers = {"authorization": f"Bearer {key}"} if key else {}
    try:
        caller = await identify(gateway.tenants, gateway.stores, headers)
    except Unauthorized:
        message = (
            "Give a key to see its conversations."
            if not key
            else "This key is not valid for this gateway: give the key your client sends it."
        )
        return _form(request, status=401, message=message, then=then)
    if caller.namespace == UNRESOLVED:
        raise StoreError("the store's secret cannot be read")
    if caller.namespace == ANONYMOUS and not gateway.settings.inspector.anonymous:
        message = (
            "Give the key your client sends. Requests sent without a key share one"
            " namespace, which this gateway does not show (inspector.anonymous)."
        )
        return _form(request, status=401, message=message, then=then)
    value = sealed(caller.namespace, await gateway.stores.secret(), time.time())
    return Redirect(then, status_code=303, cookies=[_cookie(request, value, LIFETIME)])


@post("/ui/logout", status_code=303, request_max_body_size=_FORM_BYTES)
async def close_session(request: AnyRequest) -> Redirect:
    """The session's cookie cleared."""
    _refuse_cross_site(request)
    return Redirect("/ui/", status_code=303, cookies=[_cookie(request, "", 0)])


def _conversation_path(request: AnyRequest) -> list[str]:
    """The segments after ``/ui/conversations/``, each decoded on its own: a conversation
    id may hold a ``/`` (its header allows one), which its links escape."""
    tail = _raw_path(request).partition(_PREFIX)[2]
    return [unquote(part) for part in tail.split("/")]


@get("/ui/conversations/{rest:path}")
async def conversation_pages(request: AnyRequest, page: Page = 1) -> Template | Response[bytes]:
    """``/ui/conversations/{id}``: the timeline; ``.../requests/{request_id}``: a request."""
    namespace = await _namespace(request)
    if namespace is None:
        return _form(request, then=_here(request))
    parts = _conversation_path(request)
    ledger = runtime_of(request).stores.ledger
    row = await ledger.conversation(namespace, parts[0]) if parts[0] else None
    if row is None:
        raise NotFoundException("No such conversation (it may have expired).")
    context: dict[str, Any] = {"viewer": who(namespace), "conversation": views.Row.of(row)}
    if len(parts) == 3 and parts[1] == "requests":
        return await _request_page(request, namespace, parts[0], parts[2], context)
    if len(parts) != 1:
        raise NotFoundException("No such page.")
    charted = await ledger.requests(namespace, parts[0], offset=0, limit=CHARTED)
    offset = (page - 1) * REQUESTS_PER_PAGE
    if offset + REQUESTS_PER_PAGE <= CHARTED:
        listed = charted.items[offset : offset + REQUESTS_PER_PAGE]
    else:
        listed = (
            await ledger.requests(namespace, parts[0], offset=offset, limit=REQUESTS_PER_PAGE)
        ).items
    context |= {
        "chart": chart_of(list(reversed(charted.items))),
        "charted": len(charted.items),
        "levels": LEVELS,
        "requests": [views.RequestRow.of(entry) for entry in listed],
        "total": charted.total,
        "page": page,
        "pages": max(1, math.ceil(charted.total / REQUESTS_PER_PAGE)),
    }
    return _page(request, "conversation.html", context)


async def _request_page(
    request: AnyRequest,
    namespace: str,
    conversation: str,
    request_id: str,
    context: dict[str, Any],
) -> Template:
    gateway = runtime_of(request)
    entry = await gateway.stores.ledger.request(namespace, conversation, request_id)
    if entry is None:
        raise NotFoundException("No such request in this conversation's ledger.")
    listed = await gateway.stores.ledger.requests(namespace, conversation, offset=0, limit=CHARTED)
    ids = [str(item.get("id")) for item in listed.items]
    at = ids.index(request_id) if request_id in ids else None
    context |= {
        "newer": ids[at - 1] if at else None,
        "older": ids[at + 1] if at is not None and at + 1 < len(ids) else None,
        "number": listed.total - at if at is not None else None,
        "total": listed.total,
    }
    detail = entry.get("detail")
    summary = entry.get("summary")
    native = entry.get("native")
    context |= {
        "entry": entry,
        "row": views.RequestRow.of(entry),
        "stages": [stage for stage in entry.get("stages") or () if isinstance(stage, Mapping)],
        "refs": [ref for ref in entry.get("refs") or () if isinstance(ref, Mapping)],
        "messages": views.message_rows(detail) if isinstance(detail, Mapping) else None,
        "truncated": isinstance(detail, Mapping) and detail.get("truncated") is True,
        "kept_details": gateway.settings.inspector.detailed_requests,
        "summary": summary if isinstance(summary, Mapping) else None,
        "summary_fields": views.summary_fields(summary) if isinstance(summary, Mapping) else [],
        "native": orjson.dumps(native, option=orjson.OPT_INDENT_2).decode() if native else None,
        "edits": [e for e in entry.get("applied_edits") or () if isinstance(e, Mapping)],
        "cache": entry.get("cache") if isinstance(entry.get("cache"), Mapping) else {},
        "tokens": entry.get("tokens") if isinstance(entry.get("tokens"), Mapping) else {},
    }
    return Template(template_name="request.html", context=context)


@get("/ui/objects/{ref:str}")
async def object_page(request: AnyRequest) -> Template | Response[bytes]:
    """The original content behind a ref of the session's namespace: text, or an image."""
    ref: str = request.path_params["ref"]
    namespace = await _namespace(request)
    if namespace is None:
        return _form(request, then=_here(request))
    if not REF_PATTERN.fullmatch(ref):
        raise NotFoundException("That is not a ref.")
    content = await runtime_of(request).stores.objects.get(namespace, ref)
    if content is None:
        raise NotFoundException("No object under this ref for your key (it may have expired).")
    image = _image_url(content)
    text = content[:OBJECT_SHOWN].decode("utf-8", errors="replace") if image is None else None
    context = {
        "viewer": who(namespace),
        "ref": ref,
        "size": len(content),
        "lines": content.count(b"\n") + (bool(content) and not content.endswith(b"\n")),
        "shown": min(len(content), OBJECT_SHOWN),
        "image": image,
        "text": text,
        # Replacement characters the decoding made, not ones the content holds.
        "binary": text is not None and "\ufffd" in text and b"\xef\xbf\xbd" not in content,
    }
    return Template(template_name="object.html", context=context)


def _image_url(content: bytes) -> str | None:
    """The ``data:`` URL of an image part as the store keeps it (the chat content part's
    JSON, or an Anthropic image block's), when it is a raster image."""
    if not content.startswith(b"{"):
        return None
    try:
        part = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(part, dict):
        return None
    url: Any = None
    if part.get("type") == "image_url" and isinstance(part.get("image_url"), Mapping):
        url = part["image_url"].get("url")
    elif part.get("type") == "input_image":
        url = part.get("image_url")
    elif part.get("type") == "image" and isinstance(part.get("source"), Mapping):
        source = part["source"]
        if source.get("type") == "base64" and isinstance(source.get("data"), str):
            url = f"data:{source.get('media_type')};base64,{source['data']}"
    if isinstance(url, str) and url.startswith(_IMAGE_TYPES) and ";base64," in url:
        return url
    return None
