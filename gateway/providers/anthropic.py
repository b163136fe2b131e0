"""The built-in Anthropic provider: the Messages API through the official SDK, the call
only. What goes in and comes out is Anthropic's own bytes (``send_messages``,
``count_tokens``); translating them for another API is the codecs' (``gateway.codecs``).

The SDK client is made once, when the first request goes to Anthropic (importing the SDK and
its HTTP library, httpx2, takes a second and some 60 MB, which a gateway serving only
OpenAI-compatible models never pays; ``load`` does it off the event loop, and the gateway
calls it in the background after start-up when an Anthropic key is configured:
``Gateway.warm``), with its own HTTP pool, the upstream timeouts and ``max_retries=0``
(retries are the caller's, as with any upstream, so they never multiply), and it is copied
per request with the caller's key (``Authorization: Bearer`` or ``x-api-key``, or the
tenant's upstream key). The client's headers go along (``anthropic-version``,
``anthropic-beta``, ``user-agent``, ...), but for those the SDK sets for its own call
(``_OWN``). An error status comes back as Anthropic answered it, with its headers less those
of its transfer; a transport failure is the gateway's own error (a timeout 504, else 502),
and once a stream has begun ``UpstreamStreamBroken``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Final

import httpx

from gateway.config import AnthropicSettings, UpstreamSettings
from gateway.errors import (
    UpstreamStreamBroken,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from gateway.providers.openai import ResponseReading, redacted
from gateway.telemetry.tracing import traced_sdk_transport

if TYPE_CHECKING:  # both loaded with the SDK (``load``)
    import anthropic
    import httpx2

__all__ = ["AnthropicUpstream"]

_OWN: Final = frozenset(
    {"authorization", "x-api-key", "content-type", "accept", "accept-encoding", "connection"}
)
"""Headers the SDK sets for the request it makes (the key, the body's type, its transfer),
with the ``x-stainless-*`` ones (the HTTP client making the call: its language, version,
retry count and timeout). The client's other headers go along (``anthropic-version``,
``anthropic-beta``, ``user-agent``, Claude Code's ``x-app`` and session id, ...)."""


class AnthropicUpstream(ResponseReading):
    __slots__ = ("_client", "_loading", "_transport", "base_url", "settings")

    provider: Final = "anthropic"

    def __init__(
        self,
        settings: AnthropicSettings,
        upstream: UpstreamSettings,
        *,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        """``transport``: the HTTP transport under the SDK (by default a pooled one with no
        retries; a test's ``httpx2.MockTransport``)."""
        self.settings = upstream
        """The upstream limits that apply here too (error body size, timeouts, pool)."""
        self.base_url = settings.base_url
        self._transport = transport
        self._client: anthropic.AsyncAnthropic | None = None
        self._loading: asyncio.Future[anthropic.AsyncAnthropic] | None = None

    @property
    def loaded(self) -> bool:
        """Whether the SDK's client is made yet."""
        return self._client is not None

    async def load(self) -> anthropic.AsyncAnthropic:
        """The SDK's client, made at the first call in a worker thread (the SDK's import,
        its HTTP pool's TLS context), so the event loop serves other requests meanwhile;
        once: every caller awaits the same making, which a caller that goes away (a client
        that disconnects) does not cancel. A making that failed is tried again by the next
        caller."""
        if self._client is None:
            if self._loading is None:
                self._loading = asyncio.ensure_future(asyncio.to_thread(self._made))
            loading = self._loading
            try:
                self._client = await asyncio.shield(loading)
            except Exception:
                if self._loading is loading:
                    self._loading = None
                raise
        return self._client

    def _made(self) -> anthropic.AsyncAnthropic:
        import anthropic
        import httpx2  # the SDK's HTTP library, which the SDK's import loads anyway

        upstream = self.settings
        timeout = httpx2.Timeout(
            connect=upstream.connect_timeout,
            read=upstream.read_timeout,
            write=upstream.write_timeout,
            pool=upstream.pool_timeout,
        )
        limits = httpx2.Limits(
            max_connections=upstream.max_connections,
            max_keepalive_connections=upstream.max_keepalive_connections,
            keepalive_expiry=upstream.keepalive_expiry,
        )
        # The SDK's own HTTP library (it carries its own copy of httpx).
        http = httpx2.AsyncClient(
            timeout=timeout,
            limits=limits,
            transport=traced_sdk_transport(
                self._transport or httpx2.AsyncHTTPTransport(limits=limits, retries=0)
            ),
            follow_redirects=False,
            trust_env=False,
        )
        return anthropic.AsyncAnthropic(
            api_key="unset",
            base_url=self.base_url,
            max_retries=0,
            timeout=timeout,
            http_client=http,
        )

    async def send_messages(self, content: bytes, headers: Mapping[str, str]) -> httpx.Response:
        """Anthropic's own answer to the Messages request in ``content``, status, headers
        and bytes as they come (the body still on the wire, for streams)."""
        return await self._raw("/v1/messages", content, headers, stream=True)

    async def count_tokens(self, content: bytes, headers: Mapping[str, str]) -> httpx.Response:
        """Anthropic's ``count_tokens`` answer for the Messages request in ``content``."""
        return await self._raw("/v1/messages/count_tokens", content, headers, stream=False)

    async def _raw(
        self, path: str, content: bytes, headers: Mapping[str, str], *, stream: bool
    ) -> httpx.Response:
        key = _key(headers)
        client = (await self.load()).with_options(api_key=key)
        import anthropic  # loaded by ``load``: lookups now
        import httpx2

        extra = {
            name: value
            for name, value in headers.items()
            if name not in _OWN and not name.startswith("x-stainless-")
        }
        extra["content-type"] = "application/json"
        try:
            response = await client.post(
                path,
                cast_to=httpx2.Response,
                content=content,
                options={"headers": extra},
                stream=stream,
            )
        except anthropic.APIStatusError as exc:
            return httpx.Response(
                exc.status_code,
                headers=_relayed(exc.response.headers),
                content=redacted(exc.response.content, key),
            )
        except anthropic.APITimeoutError as exc:
            raise UpstreamTimeout("The upstream did not answer in time.") from exc
        except anthropic.APIConnectionError as exc:
            raise UpstreamUnreachable("The upstream could not be reached.") from exc
        return httpx.Response(
            response.status_code, headers=_relayed(response.headers), stream=_Bytes(response)
        )

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()


def _key(headers: Mapping[str, str]) -> str:
    authorization = headers.get("authorization", "")
    if authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    return headers.get("x-api-key", "")


def _relayed(headers: httpx2.Headers) -> list[tuple[str, str]]:
    """An Anthropic answer's headers, less what described its encoding on the wire (its
    body is handed on decoded)."""
    return [
        (name, value)
        for name, value in headers.multi_items()
        if name.lower() not in ("content-encoding", "content-length", "transfer-encoding")
    ]


class _Bytes(httpx.AsyncByteStream):
    """An answer of the SDK's HTTP library read on as the gateway's, with its transport
    errors mapped the same way."""

    def __init__(self, response: httpx2.Response) -> None:
        self.response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        import httpx2  # loaded with the SDK: a lookup

        try:
            async for chunk in self.response.aiter_bytes():
                yield chunk
        except httpx2.TimeoutException as exc:
            raise UpstreamTimeout(
                f"The upstream stopped sending its answer ({type(exc).__name__})."
            ) from exc
        except httpx2.HTTPError as exc:
            raise UpstreamStreamBroken(
                f"The upstream broke its answer off ({type(exc).__name__})."
            ) from exc

    async def aclose(self) -> None:
        await self.response.aclose()
