"""The inspector's session: which namespace a browser may see, in a signed cookie.

The viewer gives a key once (``POST /ui/session``); it is identified as the API
identifies a caller, and only the namespace it names is kept, never the key: the cookie
holds ``v1.<expiry>.<namespace, base64url>.<HMAC-SHA256, base64url>``, signed under the
store's secret (which replicas share, so a session holds on every replica). A cookie that
is forged, altered, from another gateway or past its expiry opens nothing.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from typing import Final

__all__ = ["COOKIE", "LIFETIME", "opened", "sealed"]

COOKIE: Final = "contextgate_inspector"
LIFETIME: Final = 12 * 3600
"""Seconds a session lasts after the key was given."""
_VERSION: Final = "v1"
_EXPIRY: Final = re.compile(r"[0-9]{1,12}")
_PURPOSE: Final = b"contextgate inspector session\0"
"""Keeps these MACs apart from anything else signed under the same secret."""


def sealed(namespace: str, secret: bytes, now: float) -> str:
    """The cookie's value for ``namespace``, valid for ``LIFETIME`` from ``now``."""
    expires = int(now) + LIFETIME
    name = _encode(namespace.encode())
    return f"{_VERSION}.{expires}.{name}.{_encode(_mac(secret, expires, name))}"


def opened(value: str | None, secret: bytes, now: float) -> str | None:
    """The namespace ``value`` was sealed for, or ``None`` when it is not a valid,
    unexpired session of this gateway."""
    parts = (value or "").split(".")
    if len(parts) != 4 or parts[0] != _VERSION or not _EXPIRY.fullmatch(parts[1]):
        return None
    expires, name, mac = int(parts[1]), parts[2], parts[3]
    expected = _encode(_mac(secret, expires, name)).encode()
    if not hmac.compare_digest(expected, mac.encode("utf-8", "replace")) or expires <= now:
        return None
    try:
        return base64.urlsafe_b64decode(name + "=" * (-len(name) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


def _mac(secret: bytes, expires: int, name: str) -> bytes:
    message = _PURPOSE + f"{expires}.{name}".encode()
    return hmac.new(secret, message, hashlib.sha256).digest()


def _encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()
