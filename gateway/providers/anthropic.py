"""The built-in Anthropic provider: the Messages API, through the official SDK, behind the
OpenAI wire the rest of the gateway speaks.

``AnthropicUpstream`` has the interface of ``gateway.providers.openai.Upstream`` (``send``,
``read_body``, ``events``, ``settings``): ``send`` takes an OpenAI chat request, sends its
Messages translation (``gateway.codecs.anthropic``) with the SDK's async client, and
returns an ``httpx.Response`` carrying the OpenAI answer: a chat completion, or a stream
of chunks translated event by event as they arrive. So the chat route, its restore loop,
the relay and the summarizer work unchanged for ``claude-*`` models.

The SDK client is made once (its own HTTP pool, the upstream timeouts, ``max_retries=0``:
retries are the caller's, as with any upstream, so they never multiply) and copied per
request with the caller's key (``Authorization: Bearer`` or ``x-api-key``, or the tenant's
upstream key). The client's headers go along (``anthropic-version``, ``anthropic-beta``,
``user-agent``, ...), but for those the SDK sets for its own call (``_OWN``).
An error status comes back with the same status and an OpenAI error envelope; an error in
the middle of a stream ends it with one ``{"error": ...}`` event.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Final

import anthropic
import httpx
import httpx2
import orjson

from gateway.codecs.anthropic import ChunkTranslator, from_message, to_messages
from gateway.codecs.anthropic_answers import error_type
from gateway.config.settings import AnthropicSettings, UpstreamSettings
from gateway.errors import (
    UpstreamStreamBroken,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from gateway.http.sse import close, event_data
from gateway.providers.openai import ResponseReading, json_answer, redacted
from gateway.telemetry.tracing import traced_sdk_transport

__all__ = ["AnthropicUpstream"]

_OWN: Final = frozenset(
    {"authorization", "x-api-key", "content-type", "accept", "accept-encoding", "connection"}
)
"""Headers the SDK sets for the request it makes (the key, the body's type, its transfer),
with the ``x-stainless-*`` ones (the HTTP client making the call: its language, version,
retry count and timeout). The client's other headers go along (``anthropic-version``,
``anthropic-beta``, ``user-agent``, Claude Code's ``x-app`` and session id, ...)."""
_RELAYED: Final = frozenset({"retry-after", "retry-after-ms", "request-id"})
"""Headers of an Anthropic error answer the client should see (its SDK's backoff)."""


class AnthropicUpstream(ResponseReading):
    __slots__ = ("_client", "max_tokens_for", "settings")

    provider: Final = "anthropic"

    def __init__(
        self,
        settings: AnthropicSettings,
        upstream: UpstreamSettings,
        *,
        max_tokens_for: Callable[[str], int] = lambda model: 8_192,
    ) -> None:
        self.settings = upstream
        """The upstream limits that apply here too (error body size, timeouts, pool)."""
        self.max_tokens_for = max_tokens_for
        """``max_tokens`` for a request that gives none (the API requires it): the
        catalog's output limit for the model."""
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
            transport=traced_sdk_transport(httpx2.AsyncHTTPTransport(limits=limits, retries=0)),
            follow_redirects=False,
            trust_env=False,
        )
        self._client = anthropic.AsyncAnthropic(
            api_key="unset",
            base_url=settings.base_url,
            max_retries=0,
            timeout=timeout,
            http_client=http,
        )

    async def send(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str],
        content: bytes | None = None,
        params: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """The OpenAI answer to the OpenAI chat request in ``content``."""
        body = orjson.loads(content or b"{}")
        model = str(body.get("model", ""))
        request = to_messages(body, default_max_tokens=self.max_tokens_for(model))
        response = await self.send_messages(orjson.dumps(request), headers)
        created = int(time.time())
        if not response.is_success:
            error = await self.read_body(response, self.settings.max_error_body_bytes)
            kept = [(k, v) for k, v in response.headers.multi_items() if _relayed_on_error(k)]
            return httpx.Response(
                response.status_code,
                headers=[*kept, ("content-type", "application/json")],
                content=_openai_error(response.status_code, error),
            )
        if request.get("stream"):
            options = body.get("stream_options") or {}
            translator = ChunkTranslator(
                created=created, include_usage=bool(options.get("include_usage"))
            )
            return httpx.Response(
                200,
                headers={"content-type": "text/event-stream; charset=utf-8"},
                stream=_Chunks(self.events(response), translator),
            )
        message = json_answer(await self.read_body(response), "a message", listing="content")
        answer = from_message(message, created=created)
        return httpx.Response(
            200, headers={"content-type": "application/json"}, content=orjson.dumps(answer)
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
        client = self._client.with_options(api_key=key)
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
        await self._client.close()


def _key(headers: Mapping[str, str]) -> str:
    authorization = headers.get("authorization", "")
    if authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    return headers.get("x-api-key", "")


def _relayed_on_error(name: str) -> bool:
    lower = name.lower()
    return lower in _RELAYED or lower.startswith("anthropic-ratelimit-")


def _openai_error(status: int, body: bytes) -> bytes:
    """An Anthropic error body in OpenAI's envelope (``type`` and ``code`` are Anthropic's
    error type)."""
    try:
        found = orjson.loads(body)
    except orjson.JSONDecodeError:
        found = None
    error = found.get("error") if isinstance(found, dict) else None
    error = error if isinstance(error, dict) else {}
    message = str(error.get("message") or body[:300].decode("utf-8", "replace") or status)
    kind = str(error.get("type") or error_type(status))
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": kind}})


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


class _Chunks(httpx.AsyncByteStream):
    """The Messages stream as OpenAI server-sent events, each made when its event comes."""

    def __init__(self, events: AsyncIterator[bytes], translator: ChunkTranslator) -> None:
        self.events, self.translator = events, translator

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for event in self.events:
            try:
                data = orjson.loads(event_data(event))
            except orjson.JSONDecodeError:
                continue  # not an event a client could use
            if not isinstance(data, dict):
                continue
            for chunk in self.translator.add(data):
                yield b"data: " + orjson.dumps(chunk) + b"\n\n"
            if data.get("type") == "error":
                return
        yield b"data: [DONE]\n\n"

    async def aclose(self) -> None:
        await close(self.events)
