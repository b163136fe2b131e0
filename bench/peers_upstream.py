"""The mock upstream of the peer comparison, which also keeps the last chat request it was
sent, so that the benchmark can tell what each proxy forwarded.

    python -m bench.peers_upstream --port N

It answers as ``python -m tests.mock_upstream`` does (a fixed chat completion, a recorded
stream when the request asks to stream) and keeps nothing but the last chat request's
body. ``GET /last`` answers with that body as it was received (an empty object before the
first).
"""

from __future__ import annotations

import argparse
import re

from tests.mock_upstream import (
    JSONReply,
    Received,
    Reply,
    SSEReply,
    chat_completion,
    recorded_stream,
    serve_until_signalled,
)

STREAMED = re.compile(rb'"stream"\s*:\s*true')
STREAM = "e2aad469b71d1d4894ff833ea147020a9d875eb7ce644a0ff355581690a4cbfd.bin"


class LastRequest:
    """A ``MockUpstream.handler`` that answers chat requests and keeps the last one."""

    def __init__(self) -> None:
        self.completion = JSONReply(chat_completion())
        self.stream = SSEReply(recorded_stream(STREAM))
        self.last = b"{}"

    def __call__(self, received: Received) -> Reply | None:
        if received.path.startswith("/last"):
            return JSONReply(self.last)
        if received.path.startswith("/v1/models"):
            return None
        self.last = received.body
        return self.stream if STREAMED.search(received.body) else self.completion


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    serve_until_signalled(LastRequest(), args.port)


if __name__ == "__main__":
    main()
