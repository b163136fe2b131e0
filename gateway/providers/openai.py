"""The OpenAI-compatible upstream over httpx: one pooled client, explicit timeouts and limits.

``Upstream.send`` returns the response as soon as its headers arrive (the body is still on
the wire), so streams relay as they come. Transport failures are mapped here, once: a
timeout is ``UpstreamTimeout`` (504); anything else that stops the exchange is
``UpstreamUnreachable`` (502), or ``UpstreamStreamBroken`` once a stream has begun.
"""

from __future__ import annotations

import itertools
import ssl
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from types import TracebackType
from typing import Any, Final, Protocol

import anyio
import httpx
import orjson

from gateway.config import UpstreamSettings
from gateway.errors import (
    UpstreamInvalidAnswer,
    UpstreamStreamBroken,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from gateway.http.sse import sse_events
from gateway.telemetry.tracing import traced_transport

__all__ = [
    "OVERFLOW_PHRASES",
    "ChatUpstream",
    "Provider",
    "ResponseReading",
    "Upstream",
    "is_context_overflow",
    "json_answer",
    "redacted",
]


def redacted(body: bytes, key: str | None) -> bytes:
    """``body`` with every occurrence of ``key`` replaced by ``[redacted]``."""
    if key and len(key) >= 8 and key.encode() in body:
        return body.replace(key.encode(), b"[redacted]")
    return body


def _sent_key(response: httpx.Response) -> str | None:
    try:
        headers = response.request.headers
    except RuntimeError:  # a response the gateway made itself (providers redact their own)
        return None
    value = headers.get("authorization") or headers.get("x-api-key") or ""
    return value[7:].strip() if value[:7].lower() == "bearer " else value.strip()


class Provider(Protocol):
    """An upstream a request is sent to, as the exchange reads its answers: the
    OpenAI-compatible ``Upstream`` or Anthropic's (``gateway.providers.anthropic``)."""

    settings: UpstreamSettings

    @property
    def provider(self) -> str:
        """Who answers, for metrics and spans: ``openai`` (any OpenAI-compatible server)
        or ``anthropic``."""
        ...

    async def read_body(self, response: httpx.Response, limit: int | None = None) -> bytes: ...

    def events(self, response: httpx.Response) -> AsyncIterator[bytes]: ...


class ChatUpstream(Provider, Protocol):
    """An upstream taking OpenAI's API by path: chat completions and the routes relayed."""

    async def send(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str],
        content: bytes | None = None,
        params: Mapping[str, str] | None = None,
    ) -> httpx.Response: ...


class ResponseReading:
    """How an upstream's responses are read: shared by every ``ChatUpstream``."""

    __slots__ = ()

    async def read_body(self, response: httpx.Response, limit: int | None = None) -> bytes:
        """Read the rest of ``response``'s body (at most ``limit`` bytes), then close it.
        An error body never carries the key the request was sent with: providers echo
        it, and with tenants that key is the gateway's, not the caller's."""
        chunks: list[bytes] = []
        size = 0
        try:
            with _READING:
                async for chunk in response.aiter_bytes():
                    chunks.append(chunk)
                    size += len(chunk)
                    if limit is not None and size >= limit:
                        break
        finally:
            await response.aclose()
        body = b"".join(chunks)
        if not response.is_success:
            body = redacted(body, _sent_key(response))
        return body if limit is None else body[:limit]

    async def events(self, response: httpx.Response) -> AsyncIterator[bytes]:
        """The server-sent events of ``response``, each whole; the response is closed when
        the iteration ends, however it ends."""
        try:
            # Without a content encoding, httpx's decoded bytes are its raw ones, chunk for
            # chunk: read straight, without the decoding generator (and the generator's
            # context manager) that ``aiter_bytes`` puts around them. (A response already
            # read, as one made with its content is, has only its decoded bytes left.)
            if response.is_stream_consumed or "content-encoding" in response.headers:
                chunks = response.aiter_bytes()
            else:
                chunks = response.aiter_raw()
            with _STREAMING:
                async for event in sse_events(chunks):
                    yield event
        finally:
            with anyio.CancelScope(shield=True):
                await response.aclose()


class Upstream(ResponseReading):
    """Pooled HTTP connections to one OpenAI-compatible base URL.

    Connections are spread over ``pool_shards`` independent httpx transports, taken in
    turn: httpcore's pool rescans every connection it holds (quadratically, with a syscall
    per idle one) each time a request starts or ends, so one pool serving a hundred
    concurrent streams spends more time on bookkeeping than on relaying. Small pools keep
    that cheap.

    Requests go to the transport directly rather than through an ``httpx.AsyncClient``: the
    client's URL merging, auth and redirect hooks and cookie jar are all unused here, and
    skipping them takes about 0.3 ms off a small request (docs/DECISIONS.md, "Web stack").
    """

    __slots__ = ("_base", "_timeout", "_transports", "_turn", "_urls", "settings")

    provider: Final = "openai"

    def __init__(
        self, settings: UpstreamSettings, *, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.settings = settings
        shards = 1 if transport is not None else settings.pool_shards
        limits = httpx.Limits(
            max_connections=_per_shard(settings.max_connections, shards),
            max_keepalive_connections=_per_shard(settings.max_keepalive_connections, shards),
            keepalive_expiry=settings.keepalive_expiry,
        )
        timeout = httpx.Timeout(
            connect=settings.connect_timeout,
            read=settings.read_timeout,
            write=settings.write_timeout,
            pool=settings.pool_timeout,
        )
        base = httpx.URL(settings.base_url)
        # Built once: loading the CA bundle takes 0.1 s and 3 MB. A plain-HTTP upstream (a
        # model server beside the gateway) makes no TLS connection and loads none; its
        # context has no CA, so a TLS connection through it could not be verified: refused.
        tls = (
            httpx.create_ssl_context()
            if base.scheme == "https"
            else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        )
        self._transports = tuple(
            traced_transport(
                transport or httpx.AsyncHTTPTransport(verify=tls, limits=limits, retries=0)
            )
            for _ in range(shards)
        )
        self._turn = itertools.cycle(self._transports)
        # A base path ends with a slash, so that joining a relative path keeps it.
        self._base = base.copy_with(raw_path=base.raw_path.rstrip(b"/") + b"/")
        self._timeout = timeout.as_dict()
        self._urls: dict[str, httpx.URL] = {}

    async def send(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str],
        content: bytes | None = None,
        params: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """Send a request; the returned response's body is still to be read (or closed)."""
        url = self._urls.get(path)
        if url is None:
            # As httpx.AsyncClient merges a relative URL: appended to the base path, never
            # resolved against it (which could drop the base path's last segment).
            url = self._base.copy_with(raw_path=self._base.raw_path + path.lstrip("/").encode())
            if len(self._urls) < _KEPT_URLS:  # building one parses it again: ~20 us
                self._urls[path] = url
        if params is not None:
            url = url.copy_merge_params(params)
        sent, extensions = _as_sent(headers), {"timeout": self._timeout}
        if content is not None and _SET_BY_HTTPX.isdisjoint(map(str.lower, headers)):
            request = _request(method, url, sent, content, extensions)
        else:
            request = httpx.Request(
                method, url, headers=sent, content=content, extensions=extensions
            )
        return await self._send(request)

    async def open(
        self,
        method: str,
        target: bytes,
        *,
        headers: Mapping[str, str],
        content: bytes | AsyncIterable[bytes] | None,
    ) -> httpx.Response:
        """Send a request whose request-target is ``target``, byte for byte (httpx would
        re-encode a path or query it parses), to the base URL's scheme, host and port;
        the returned response's body is still to be read (or closed)."""
        extensions = {"timeout": self._timeout, "target": target}
        return await self._send(
            httpx.Request(
                method,
                self._base,
                headers=_as_sent(headers),
                content=content,
                extensions=extensions,
            )
        )

    async def _send(self, request: httpx.Request) -> httpx.Response:
        with _SENDING:
            response = await next(self._turn).handle_async_request(request)
        response.request = request
        return response

    async def aclose(self) -> None:
        for transport in self._transports:
            await transport.aclose()


_KEPT_URLS: Final = 32
"""Upstream URLs kept built, by path: the gateway sends to a handful of paths."""


class _Mapped:
    """httpx's errors as the gateway's, out of a ``with`` block: a timeout is 504, any
    other failure ``broken``. A class, not a generator's context manager (which costs a
    request's send and read about 7,500 instructions each more); the three are made once."""

    __slots__ = ("broke", "broken", "timed_out")

    def __init__(
        self, timed_out: str, broke: str, broken: type[UpstreamUnreachable | UpstreamStreamBroken]
    ) -> None:
        self.timed_out, self.broke, self.broken = timed_out, broke, broken

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if isinstance(error, httpx.TimeoutException):
            raise UpstreamTimeout(
                f"The upstream {self.timed_out} ({type(error).__name__})."
            ) from error
        if isinstance(error, httpx.HTTPError):
            raise self.broken(f"The upstream {self.broke} ({type(error).__name__}).") from error


_SENDING: Final = _Mapped("did not answer in time", "could not be reached", UpstreamUnreachable)
_READING: Final = _Mapped(
    "stopped sending its response", "broke off its response", UpstreamUnreachable
)
_STREAMING: Final = _Mapped(
    "stopped sending in the middle of the stream", "broke the stream off", UpstreamStreamBroken
)


def _per_shard(total: int | None, shards: int) -> int | None:
    return None if total is None else max(1, -(-total // shards))


OVERFLOW_PHRASES: Final = (
    "maximum context length",
    "context_length_exceeded",
    "context window",
    "reduce the length of the messages",
    "too many tokens",
    "prompt is too long",
    "exceed context limit",
)


def json_answer(body: bytes, what: str, *, listing: str | None = None) -> dict[str, Any]:
    """The JSON object in a success ``body`` that the gateway has to read (translate it,
    answer restore calls in it), with a list under ``listing`` when one is named; else
    ``UpstreamInvalidAnswer`` saying it is not ``what`` it should be."""
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict) or (
        listing is not None and not isinstance(answer.get(listing), list)
    ):
        raise UpstreamInvalidAnswer(
            f"The upstream answered with success, and a body that is not {what}:"
            f" {body[:200].decode('utf-8', 'replace')}"
        )
    return answer


def is_context_overflow(status: int, body: bytes) -> bool:
    """Whether an upstream error says the prompt did not fit the model's window."""
    if status not in (400, 413, 422):
        return False
    text = body[:4096].decode("utf-8", "replace").lower()
    return any(phrase in text for phrase in OVERFLOW_PHRASES)


_DEFAULT_HEADERS: Final = {
    "accept": b"*/*",
    "accept-encoding": b"gzip, deflate",
    "user-agent": f"python-httpx/{httpx.__version__}".encode(),
}
"""What an ``httpx.AsyncClient`` adds where the request does not say otherwise."""


_SET_BY_HTTPX: Final = frozenset({"host", "content-length", "transfer-encoding"})
"""Headers httpx sets itself for a body given as bytes, unless the request has them."""


def _request(
    method: str,
    url: httpx.URL,
    headers: list[tuple[bytes, bytes]],
    content: bytes,
    extensions: dict[str, Any],
) -> httpx.Request:
    """The request ``httpx.Request(method, url, headers=headers, content=content)`` makes,
    header for header and in the same order (``Host`` first, ``Content-Length`` last),
    built from its parts: given the body as bytes, httpx looks the headers over four more
    times and builds them twice. ``headers`` (``_as_sent``'s) name none of
    ``_SET_BY_HTTPX``."""
    headers.insert(0, (b"Host", url.netloc))
    headers.append((b"Content-Length", str(len(content)).encode()))
    request = httpx.Request(
        method, url, headers=headers, stream=httpx.ByteStream(content), extensions=extensions
    )
    request.read()  # as httpx does with a body given whole: ``request.content`` is set
    return request


def _as_sent(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    """The request's headers, then the defaults it does not override. Values go out as the
    bytes they came in as (ASGI hands them over decoded as latin-1), so a non-ASCII value
    passes through instead of failing to encode."""
    sent = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    named = {k.lower() for k in headers}
    sent.extend((k.encode(), v) for k, v in _DEFAULT_HEADERS.items() if k not in named)
    return sent
