"""The least a Python gateway can do: a bare Litestar passthrough, as a baseline.

    python -m bench.passthrough --port N --upstream http://127.0.0.1:M/v1

It parses and re-serialises the body with orjson, forwards it with one pooled httpx client
and returns the upstream's body: the same stack as contextgate (uvicorn, Litestar, httpx)
without any of its work. The benchmark runs it beside the gateway so the gateway's own cost
can be told apart from the cost of the extra hop.
"""

from __future__ import annotations

import argparse
from typing import Any

import httpx
import orjson
import uvicorn
from litestar import Litestar, Request, post
from litestar.response.base import ASGIResponse


def build(upstream: str) -> Litestar:
    client = httpx.AsyncClient(
        base_url=upstream, limits=httpx.Limits(max_connections=None), timeout=60
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
