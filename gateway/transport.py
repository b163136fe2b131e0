"""The HTTP transport under the upstream client: httpx's API on aiohttp's connection pool.

httpx stays the interface (``Timeout``, ``Limits``, ``Request``/``Response``); aiohttp,
through the ``httpx-aiohttp`` transport, does the I/O, which costs about half a
millisecond less per request here (docs/BENCHMARKS.md). Two things are set deliberately:

- the pool is sized from ``Limits.max_connections`` and ``None`` means no cap at all (the
  library would otherwise fall back to aiohttp's default of 100 connections, which would
  queue the 101st concurrent stream);
- a connection the upstream closed or reset is a ``ConnectError``/``ReadError``, not the
  ``ConnectTimeout`` the library reports for every non-timeout connection error, so the
  client gets a 502 rather than a 504.
"""

from __future__ import annotations

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport

__all__ = ["UpstreamTransport"]


class UpstreamTransport(AiohttpTransport):
    """``AiohttpTransport`` with an explicitly sized pool and exact error mapping."""

    def __init__(self, limits: httpx.Limits) -> None:
        self._pool_size = limits.max_connections or 0
        self._keepalive = limits.keepalive_expiry
        super().__init__(limits=limits, trust_env=False, client=self._session)

    def _session(self) -> aiohttp.ClientSession:
        # Built on first use, inside the running event loop, as aiohttp requires.
        connector = aiohttp.TCPConnector(
            limit=self._pool_size, limit_per_host=0, keepalive_timeout=self._keepalive
        )
        return aiohttp.ClientSession(connector=connector, trust_env=False)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return await super().handle_async_request(request)
        except httpx.ConnectTimeout as exc:
            cause = exc.__cause__
            if isinstance(cause, aiohttp.ServerTimeoutError) or not isinstance(
                cause, aiohttp.ClientConnectionError
            ):
                raise
            if isinstance(cause, aiohttp.ClientConnectorError):
                raise httpx.ConnectError(str(cause), request=request) from cause
            raise httpx.RemoteProtocolError(str(cause), request=request) from cause
