"""The context inspector: a page at ``/ui/`` that shows what the gateway did to each
conversation, read from the ledger (``gateway.store.ledger``).

- ``GET /ui/``: the conversations of the viewer's namespace, the most recently active
  first (the key form without a session);
- ``GET /ui/conversations/{id}``: one conversation's timeline, a chart and its requests;
- ``GET /ui/conversations/{id}/requests/{request_id}``: what one request went through;
- ``GET /ui/objects/{ref}``: the original content behind a ref;
- ``POST /ui/session`` (form field ``key``) opens a session, ``POST /ui/logout`` ends it;
- ``GET /ui/static/...``: the stylesheet and the poller; ``GET /`` goes to ``/ui/``.

Server-rendered (``gateway/ui/templates``, Jinja2 escaping everything, loaded with the
first page: ``engine.py``), no inline script or style, nothing fetched from elsewhere. The
routes are public to admission (``gateway.edge.admission``): they authenticate by their own
signed cookie (``session.py``), which holds the namespace a key named, never the key. Every
response under ``/ui`` carries ``SECURITY_HEADERS``: pages and static files by their
routers' ``after_request`` hook, errors by ``error_page``, which the application's own 404
and 405 under ``/ui`` come to too (``is_inspector``). With ``inspector.ui`` or
``inspector.enabled`` off there are no such routes: ``/ui/`` is a 404.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Final

from litestar import Request, Response, Router, get
from litestar.exceptions import HTTPException
from litestar.response import Redirect, Template
from litestar.static_files import create_static_files_router
from litestar.template.config import TemplateConfig

from gateway.config.inspector import InspectorSettings
from gateway.routes.inspector.engine import InspectorTemplates
from gateway.routes.inspector.pages import (
    FRAGMENT,
    close_session,
    conversation_pages,
    conversations_page,
    object_page,
    open_session,
)
from gateway.routes.inspector.session import COOKIE
from pipelines import StoreError

__all__ = [
    "SECURITY_HEADERS",
    "STATIC",
    "TEMPLATES",
    "error_page",
    "inspector_routes",
    "inspector_templates",
    "is_inspector",
]

log = logging.getLogger("contextgate")

_UI: Final = Path(__file__).resolve().parents[2] / "ui"
TEMPLATES: Final = _UI / "templates"
STATIC: Final = _UI / "static"
CONTENT_SECURITY_POLICY: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
    " connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS: Final = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}


def is_inspector(path: str) -> bool:
    """Whether ``path`` is the inspector's (``/`` too, which leads to it)."""
    return path in ("/", "/ui") or path.startswith("/ui/")


def _secured(response: Response[Any]) -> Response[Any]:
    """A page's or static file's response with ``SECURITY_HEADERS``."""
    response.headers.update(SECURITY_HEADERS)
    return response


def error_page(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """An error under ``/ui`` as a page (a bare status for the poller), with
    ``SECURITY_HEADERS``: a handler's, and the application's own 404 and 405 for paths
    under ``/ui`` (``gateway.app`` hands those here)."""
    if isinstance(exc, StoreError):
        status = 503
        detail = "The gateway's store cannot be read just now. Try again in a moment."
    elif not isinstance(exc, HTTPException):
        log.error("unhandled error on %s", request.url.path, exc_info=exc)
        status, detail = 500, "Something went wrong."
    else:
        status, detail = exc.status_code, exc.detail
    if status >= 500 and not isinstance(exc, StoreError) and isinstance(exc, HTTPException):
        log.error("error on %s", request.url.path, exc_info=exc)
    if request.headers.get(FRAGMENT) == "live":
        return Response(b"", status_code=status, media_type="text/plain", headers=SECURITY_HEADERS)
    signed_in = bool(request.cookies.get(COOKIE))
    context = {"status": status, "detail": detail, "viewer": None, "signed_in": signed_in}
    return Template(
        template_name="error.html", context=context, status_code=status, headers=SECURITY_HEADERS
    )


@get("/", include_in_schema=False)
async def to_inspector() -> Redirect:
    """The gateway's root is the inspector."""
    return Redirect("/ui/", status_code=302)


def inspector_routes(settings: InspectorSettings) -> list[Router]:
    """The inspector's pages and static files, or nothing when the page is off."""
    if not (settings.enabled and settings.ui):
        return []
    pages = Router(
        "/",
        route_handlers=[
            conversations_page,
            conversation_pages,
            object_page,
            open_session,
            close_session,
            to_inspector,
        ],
        opt={"public": True},
        include_in_schema=False,
        exception_handlers={Exception: error_page},
        after_request=_secured,
    )
    static = create_static_files_router(
        path="/ui/static",
        directories=[STATIC],
        opt={"public": True},
        name="inspector-static",
        after_request=_secured,
        exception_handlers={Exception: error_page},
    )
    return [pages, static]


def inspector_templates() -> TemplateConfig[InspectorTemplates]:
    """The inspector's templates, rendered by Jinja2 with autoescaping (loaded with the
    first page: ``InspectorTemplates``)."""
    return TemplateConfig(directory=TEMPLATES, engine=InspectorTemplates)
