"""The built-in Anthropic provider: the Messages API, through the official SDK, behind the
OpenAI wire the rest of the gateway speaks.

``AnthropicUpstream`` has the interface of ``gateway.upstream.Upstream`` (``send``,
``read_body``, ``events``, ``settings``): ``send`` takes an OpenAI chat request, sends its
Messages translation (``gateway.codecs.anthropic``) with the SDK's async client, and
returns an ``httpx.Response`` carrying the OpenAI answer: a chat completion, or a stream
of chunks translated event by event as they arrive. So the chat route, its restore loop,
the relay and the summarizer work unchanged for ``claude-*`` models.

The SDK client is made once (its own HTTP pool, the upstream timeouts, ``max_retries=0``:
retries are the caller's, as with any upstream, so they never multiply) and copied per
request with the caller's key (``Authorization: Bearer`` or ``x-api-key``, or the tenant's
upstream key). A client's ``anthropic-version`` and ``anthropic-beta`` headers go along.
An error status comes back with the same status and an OpenAI error envelope; an error in
the middle of a stream ends it with one ``{"error": ...}`` event.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Final

import anthropic
import httpx
import httpx2
import orjson

from gateway.codecs.anthropic import ChunkTranslator, from_message, to_messages
from gateway.errors import UpstreamStreamBroken, UpstreamTimeout, UpstreamUnreachable
from gateway.settings import AnthropicSettings, UpstreamSettings
from gateway.upstream import ResponseReading

__all__ = ["AnthropicUpstream"]

_PASSED: Final = ("anthropic-version", "anthropic-beta")
_RELAYED: Final = frozenset({"retry-after", "retry-after-ms", "request-id"})
"""Headers of an Anthropic error answer the client should see (its SDK's backoff)."""
_ERROR_TYPES: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


class AnthropicUpstream(ResponseReading):
    __slots__ = ("_client", "max_tokens_for", "settings")

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
            transport=httpx2.AsyncHTTPTransport(limits=limits, retries=0),
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
        streamed = bool(request.pop("stream", False))
        client = self._client.with_options(api_key=_key(headers))
        extra = {name: headers[name] for name in _PASSED if name in headers}
        messages: Any = client.messages
        created = int(time.time())
        try:
            if streamed:
                events = await messages.create(**request, stream=True, extra_headers=extra)
                options = body.get("stream_options") or {}
                translator = ChunkTranslator(
                    created=created, include_usage=bool(options.get("include_usage"))
                )
                return httpx.Response(
                    200,
                    headers={"content-type": "text/event-stream; charset=utf-8"},
                    stream=_Chunks(events, translator),
                )
            message = await messages.create(**request, extra_headers=extra)
        except anthropic.APIStatusError as exc:
            relayed = {
                name: value
                for name, value in exc.response.headers.items()
                if name.lower() in _RELAYED or name.lower().startswith("anthropic-ratelimit-")
            }
            return httpx.Response(
                exc.status_code,
                headers={**relayed, "content-type": "application/json"},
                content=_error_body(exc),
            )
        except anthropic.APITimeoutError as exc:
            raise UpstreamTimeout("The upstream did not answer in time.") from exc
        except anthropic.APIConnectionError as exc:
            raise UpstreamUnreachable("The upstream could not be reached.") from exc
        answer = from_message(message.model_dump(mode="json", exclude_none=True), created=created)
        return httpx.Response(
            200, headers={"content-type": "application/json"}, content=orjson.dumps(answer)
        )

    async def aclose(self) -> None:
        await self._client.close()


def _key(headers: Mapping[str, str]) -> str:
    authorization = headers.get("authorization", "")
    if authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    return headers.get("x-api-key", "")


def _error_body(exc: anthropic.APIStatusError) -> bytes:
    body: Mapping[str, Any] = exc.body if isinstance(exc.body, Mapping) else {}
    found = body.get("error")
    error: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    message = str(error.get("message") or exc.message)
    kind = str(error.get("type") or _ERROR_TYPES.get(exc.status_code, "api_error"))
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": kind}})


class _Chunks(httpx.AsyncByteStream):
    """The Messages stream as OpenAI server-sent events, each made when its event comes."""

    def __init__(self, events: Any, translator: ChunkTranslator) -> None:
        self.events, self.translator = events, translator

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for event in self.events:
                for chunk in self.translator.add(event.model_dump(mode="json")):
                    yield b"data: " + orjson.dumps(chunk) + b"\n\n"
        except httpx2.TimeoutException as exc:
            # The SDK does not wrap transport errors met while a stream is read: they are
            # the gateway's own upstream errors (a terminal event, or 502/504 before any).
            raise UpstreamTimeout(
                f"The upstream stopped sending in the middle of the stream ({type(exc).__name__})."
            ) from exc
        except httpx2.HTTPError as exc:
            raise UpstreamStreamBroken(
                f"The upstream broke the stream off ({type(exc).__name__})."
            ) from exc
        except anthropic.APIStatusError as exc:
            yield b"data: " + _error_body(exc) + b"\n\n"
            return
        except anthropic.APIError as exc:
            error = {"error": {"message": str(exc), "type": "api_error", "code": "api_error"}}
            yield b"data: " + orjson.dumps(error) + b"\n\n"
            return
        yield b"data: [DONE]\n\n"

    async def aclose(self) -> None:
        await self.events.close()
