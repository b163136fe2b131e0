"""The least a Python gateway can do: a bare Litestar passthrough, as a baseline.

    python -m bench.passthrough --port N --upstream http://127.0.0.1:M/v1

It parses and re-serialises the body with orjson, forwards it with one pooled httpx client
and returns the upstream's body (relayed chunk by chunk when it is an event stream): the
same stack as contextgate (uvicorn, Litestar, httpx) without any of its work. The
benchmarks run it beside the gateway, and beside the peers, so the cost of the extra hop
on this stack can be told apart from the work done on top of it.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import uvicorn
from litestar import Litestar, Request, post
from litestar.response.base import ASGIResponse
from litestar.response.streaming import ASGIStreamingResponse


def build(upstream: str, transport: httpx.AsyncBaseTransport | None = None) -> Litestar:
    """The relay to ``upstream`` (``transport``: an in-process one, for ``bench.instructions``)."""
    client = httpx.AsyncClient(
        base_url=upstream,
        limits=httpx.Limits(max_connections=None),
        timeout=60,
        transport=transport,
    )

    @post("/v1/chat/completions", status_code=200)
    async def chat(request: Request[Any, Any, Any]) -> ASGIResponse:
        body = orjson.dumps(orjson.loads(await request.body()))
        headers = {
            "content-type": "application/json",
            "authorization": request.headers.get("authorization", ""),
        }
        response = await client.send(
            client.build_request("POST", "chat/completions", content=body, headers=headers),
            stream=True,
        )
        media_type = response.headers.get("content-type", "")
        if media_type.startswith("text/event-stream"):

            async def relayed() -> AsyncIterator[bytes]:
                try:
                    async for chunk in response.aiter_raw():
                        yield chunk
                finally:
                    await response.aclose()

            return ASGIStreamingResponse(  # Litestar adds the charset
                iterator=relayed(), status_code=response.status_code, media_type="text/event-stream"
            )
        content = await response.aread()
        await response.aclose()
        return ASGIResponse(
            body=content,
            status_code=response.status_code,
            media_type=response.headers.get("content-type"),
        )

    async def close() -> None:
        await client.aclose()

    return Litestar([chat], on_shutdown=[close], logging_config=None, openapi_config=None)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args()
    uvicorn.run(build(args.upstream), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
