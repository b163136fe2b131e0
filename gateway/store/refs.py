"""Refs: ``ctx_`` and 24 URL-safe characters naming one offloaded object.

A ref is an HMAC-SHA256 of the namespace and the content under the store's secret, cut to
144 bits and base64url-encoded: the same content in the same namespace always gets the same
ref (so a rewritten message keeps the same bytes from request to request), while without
the secret nobody can compute or guess a ref for content they have not seen, nor tell from
a ref which namespace it belongs to.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from pipelines.stage import REF_PATTERN

__all__ = ["REF_PATTERN", "make_ref"]


def make_ref(secret: bytes, namespace: str, content: bytes) -> str:
    mac = hmac.new(secret, namespace.encode() + b"\x00" + content, hashlib.sha256).digest()
    return "ctx_" + base64.urlsafe_b64encode(mac[:18]).decode()
