"""What the stores' modules share without loading a backend: the short form of a
namespace in keys, and the count of the current request's failed store operations."""

from __future__ import annotations

import hashlib
from contextvars import ContextVar

__all__ = ["REQUEST_FAILURES", "namespace_id"]

REQUEST_FAILURES: ContextVar[list[int] | None] = ContextVar(
    "contextgate_store_request_failures", default=None
)
"""A one-item list counting the store operations that failed while serving the current
request, set per request by ``gateway.edge.access`` (``None`` outside a request)."""


def namespace_id(namespace: str) -> str:
    """A short, fixed-length form of a namespace for keys."""
    return hashlib.blake2b(namespace.encode(), digest_size=12).hexdigest()
