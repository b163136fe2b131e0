"""``GET /v1/context/objects/{ref}``: an offloaded object, whole or a range of its lines.

The caller is placed in a namespace exactly as on the chat routes (its key), so a ref is
only found by callers of the namespace that wrote it; any other ref, and anything that is
not a ref, is a 404. ``start_line`` and ``end_line`` (1-based, inclusive) select lines;
the object's total size and line count are in ``x-contextgate-object-bytes`` and
``x-contextgate-object-lines`` either way.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, get
from litestar.response.base import ASGIResponse

from gateway.errors import GatewayError, InvalidRequest, NotFound, StoreUnavailable
from gateway.routes.calls import caller_of, record_of, runtime_of
from gateway.store import REF_PATTERN
from pipelines import StoreError

__all__ = ["get_object", "line_range"]


class RangeNotSatisfiable(GatewayError):
    status = 416
    type = "invalid_request_error"
    default_code = "range_not_satisfiable"


@get("/v1/context/objects/{ref:str}")
async def get_object(request: Request[Any, Any, Any]) -> ASGIResponse:
    ref: str = request.path_params["ref"]
    request_id = record_of(request).request_id
    gateway = runtime_of(request)
    namespace = caller_of(request).namespace
    start = _line_param(request.query_params.get("start_line"), "start_line")
    end = _line_param(request.query_params.get("end_line"), "end_line")
    if start is not None and end is not None and end < start:
        raise InvalidRequest(
            f"end_line ({end}) is before start_line ({start})",
            code="invalid_range",
            param="end_line",
        )
    if not REF_PATTERN.fullmatch(ref):
        raise NotFound(f"No object {ref!r}.", param="ref")
    try:
        content = await gateway.stores.objects.get(namespace, ref)
    except StoreError as exc:
        raise StoreUnavailable(f"The offload store is unavailable: {exc}") from exc
    if content is None:
        raise NotFound(f"No object {ref!r} (it may have expired).", param="ref")
    lines = len(content.splitlines())
    headers = {
        "x-contextgate-request-id": request_id,
        "x-contextgate-object-bytes": str(len(content)),
        "x-contextgate-object-lines": str(lines),
    }
    body = content
    if start is not None or end is not None:
        first, last = start or 1, min(end or lines, lines)
        if first > last:
            raise RangeNotSatisfiable(
                f"The object has {lines} lines; lines {first}-{end or first} are not in it.",
                param="start_line",
            )
        body = line_range(content, first, last)
        headers["x-contextgate-object-range"] = f"lines={first}-{last}"
    try:
        body.decode()
        # Litestar appends "; charset=..." to a ``text/`` media type itself.
        media_type = "text/plain"
    except UnicodeDecodeError:
        media_type = "application/octet-stream"
    return ASGIResponse(body=body, media_type=media_type, encoding="utf-8", headers=headers)


def line_range(content: bytes, first: int, last: int) -> bytes:
    """Lines ``first`` to ``last`` (1-based, inclusive) of ``content``, with their ends."""
    if first > last:
        return b""
    return b"".join(content.splitlines(keepends=True)[first - 1 : last])


def _line_param(value: str | None, name: str) -> int | None:
    if value is None:
        return None
    if not (value.isascii() and value.isdecimal() and len(value) <= 9) or int(value) < 1:
        raise InvalidRequest(
            f"{name} must be a whole number from 1, got {value!r}", code="invalid_range", param=name
        )
    return int(value)
