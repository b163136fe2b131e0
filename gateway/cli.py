"""The ``contextgate`` command: ``serve`` the gateway, or ``compact`` a request offline."""

from __future__ import annotations

import sys

# httpx imports its own command-line tool whenever rich, pygments and click are installed
# (Litestar's dependencies install them): 70 modules, 2 MB and a tenth of a second at
# start-up that this process never runs. A ``None`` entry makes that import fail, and
# httpx carries on without the tool, as it does where they are not installed.
sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import os  # noqa: E402
import secrets  # noqa: E402
from collections.abc import Sequence  # noqa: E402

import orjson  # noqa: E402

from gateway.config import ConfigError, load_settings  # noqa: E402
from gateway.errors import GatewayError  # noqa: E402
from gateway.http.headers import policy_from_header  # noqa: E402
from gateway.telemetry.logs import LEVELS, configure_logging  # noqa: E402
from gateway.tenancy.tenants import hash_key  # noqa: E402

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="contextgate", description="An OpenAI-compatible gateway that manages the context."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=_port, default=8080, help="port to bind (default 8080)")
    serve.add_argument("--config", help="YAML configuration (default: $CONTEXTGATE_CONFIG)")
    serve.add_argument(
        "--log-level",
        type=str.lower,
        default=os.environ.get("CONTEXTGATE_LOG_LEVEL", "info").lower(),
        help=f"one of {', '.join(LEVELS)} (default: $CONTEXTGATE_LOG_LEVEL, else info: one"
        " JSON line per request on stderr)",
    )
    compact = commands.add_parser(
        "compact", help="run the pipeline over a chat request file and print {request, report}"
    )
    compact.add_argument("file", help="a chat completions request body (JSON); - for stdin")
    compact.add_argument("--model", help="model to budget for (default: the request's)")
    compact.add_argument(
        "--policy", help="policy as in the header, e.g. 'mode=truncate, trigger=0.6'"
    )
    compact.add_argument("--config", help="YAML configuration (default: $CONTEXTGATE_CONFIG)")
    hash_key = commands.add_parser(
        "hash-key",
        help="print the hash of a gateway key for a tenant's `keys` (reads the key from stdin,"
        " or makes a new one with --new)",
    )
    hash_key.add_argument(
        "--new", action="store_true", help="generate a new key; print it, then its hash"
    )
    return parser


def _port(text: str) -> int:
    port = int(text) if text.isdigit() else -1
    if not 1 <= port <= 65_535:
        raise argparse.ArgumentTypeError(f"not a TCP port: {text!r} (1-65535)")
    return port


def _serve(args: argparse.Namespace) -> int:
    from gateway.app import create_app
    from gateway.edge.server import Config, DrainingServer  # uvicorn's, less its command line
    from gateway.runtime import one_malloc_arena
    from gateway.telemetry.heap import watch_heap

    one_malloc_arena()  # before any thread starts
    watch_heap()
    if args.log_level not in LEVELS:
        print(
            f"contextgate: unknown log level {args.log_level!r}; one of {', '.join(LEVELS)}",
            file=sys.stderr,
        )
        return 2
    settings = load_settings(args.config)
    configure_logging(args.log_level)
    app = create_app(settings)
    config = Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        log_config=None,  # every logger is ours already: JSON lines on stderr
        access_log=False,  # the gateway writes its own (gateway.edge.access)
        loop="auto",
        http="auto",
        proxy_headers=False,
        server_header=False,
        # A WebSocket message (a Responses response.create) may be as large as a body.
        ws_max_size=settings.max_body_bytes,
    )
    gateway = app.state.gateway
    server = DrainingServer(
        config, gateway.draining, settings.shutdown_grace, gateway.shedder, gateway.warm
    )
    server.run()
    return 0 if server.started else 3  # 3: uvicorn's "could not start" (port taken, ...)


def _compact(args: argparse.Namespace) -> int:
    from gateway.codecs.openai import parse_chat_request
    from pipelines import ModelCatalog, Pipeline

    settings = load_settings(args.config)
    raw = sys.stdin.buffer.read() if args.file == "-" else _read(args.file)
    body = parse_chat_request(raw)
    policy = policy_from_header(args.policy, settings.default_policy())
    pipeline = Pipeline(catalog=ModelCatalog().extended(settings.models))
    result = asyncio.run(pipeline.compact(body, model=args.model, policy=policy))
    output = {"request": result.request, "report": result.report.as_dict()}
    sys.stdout.buffer.write(orjson.dumps(output, option=orjson.OPT_INDENT_2) + b"\n")
    return 0


def _hash_key(args: argparse.Namespace) -> int:
    if args.new:
        key = "cg-" + secrets.token_urlsafe(32)
        print(key)
    else:
        key = sys.stdin.readline().strip()
        if len(key) < 16:
            print("contextgate: a gateway key must be at least 16 characters", file=sys.stderr)
            return 2
    print(hash_key(key))
    return 0


def _read(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "hash-key":
            return _hash_key(args)
        return _serve(args) if args.command == "serve" else _compact(args)
    except ConfigError as exc:
        print(f"contextgate: configuration error: {exc}", file=sys.stderr)
        return 2
    except GatewayError as exc:
        print(f"contextgate: {exc.code}: {exc.message}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"contextgate: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
