"""The gateway in this process, its providers scripted with httpx's ``MockTransport``: for
unit tests of the exchange and the providers, where a socket adds nothing. The client is
Litestar's test client (an ``httpx.AsyncClient``, which the openai SDK takes as its HTTP
client; the anthropic SDK gets its own copy's ASGI transport on the same app); the
end-to-end tests keep the loopback mock (``tests/mock_upstream.py``)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anthropic
import httpx
import httpx2
import openai
from litestar.testing import AsyncTestClient

from gateway import create_app
from gateway.config import AnthropicSettings, Settings, UpstreamSettings

UPSTREAM = "http://upstream.test/v1"
ANTHROPIC = "http://anthropic.test"

Handler = Callable[[httpx.Request], httpx.Response | Awaitable[httpx.Response]]
SDKHandler = Callable[[httpx2.Request], httpx2.Response | Awaitable[httpx2.Response]]


class InProcess:
    """The running app, the requests each provider received, and SDK clients on it."""

    def __init__(self, client: AsyncTestClient[Any]) -> None:
        self.client = client
        self.received: list[httpx.Request] = []
        self.anthropic_received: list[httpx2.Request] = []

    def openai(self, key: str = "sk-caller-key-0001") -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=f"{self.client.base_url}/v1",
            api_key=key,
            max_retries=0,
            http_client=self.client,
        )

    def anthropic(self, key: str = "sk-ant-caller-0001") -> anthropic.AsyncAnthropic:
        """The Anthropic SDK on the app (it takes its own copy of httpx's client only)."""
        return anthropic.AsyncAnthropic(
            base_url=str(self.client.base_url),
            api_key=key,
            max_retries=0,
            http_client=httpx2.AsyncClient(transport=httpx2.ASGITransport(app=self.client.app)),
        )


@contextlib.asynccontextmanager
async def in_process(
    upstream: Handler | None = None,
    /,
    *,
    anthropic: SDKHandler | None = None,
    **settings: Any,
) -> AsyncIterator[InProcess]:
    """A gateway app whose OpenAI-compatible upstream answers with ``upstream`` and whose
    Anthropic with ``anthropic`` (each handler given the request, after it is recorded);
    ``settings`` override the defaults (in-memory store, no background summaries)."""
    holder: list[InProcess] = []

    async def openai_side(request: httpx.Request) -> httpx.Response:
        await request.aread()
        holder[0].received.append(request)
        if upstream is None:
            raise AssertionError(f"unexpected upstream request {request.url}")
        answer = upstream(request)
        return await answer if isinstance(answer, Awaitable) else answer

    async def anthropic_side(request: httpx2.Request) -> httpx2.Response:
        await request.aread()
        holder[0].anthropic_received.append(request)
        if anthropic is None:
            raise AssertionError(f"unexpected Anthropic request {request.url}")
        answer = anthropic(request)
        return await answer if isinstance(answer, Awaitable) else answer

    settings.setdefault("upstream", UpstreamSettings(base_url=UPSTREAM))
    settings.setdefault("anthropic", AnthropicSettings(base_url=ANTHROPIC))
    settings.setdefault("summaries", False)
    app = create_app(
        Settings(**settings),
        transport=httpx.MockTransport(openai_side),
        anthropic_transport=httpx2.MockTransport(anthropic_side),
    )
    async with AsyncTestClient(app, base_url="http://gateway.test") as client:
        holder.append(InProcess(client))
        yield holder[0]
