"""The mock upstream of the Responses overhead benchmark (``bench/overhead_responses.py``):
chat completions, the Responses API over HTTP (JSON and SSE) and its WebSocket, all on one
port, each answer built once and sent as the same bytes every time.

    python -m bench.responses_upstream --port N [--stream-interval 0.001]

Every answer says the same text, the one of the recorded chat stream that
``python -m tests.mock_upstream`` sends (34 events): a chat completion; that recorded
stream; a response (``tests.mock_upstream.response_body``) with one message saying it, as
JSON, or as its 34 events (``response_events``) in SSE or, for each ``response.create``
on a WebSocket, as text frames. A stream's events are paced ``--stream-interval`` seconds
apart, so that each event crosses a proxy on its own and the latency a proxy adds to it
can be read event by event. The mock keeps nothing, so it costs the same on every path.
"""

from __future__ import annotations

import argparse
from typing import Final

import orjson

from tests.mock_upstream import (
    JSONReply,
    Received,
    Reply,
    SSEReply,
    WSReply,
    chat_completion,
    message_item,
    recorded_stream,
    response_body,
    response_events,
    serve_until_signalled,
    sse_of_events,
)

STREAM: Final = "e2aad469b71d1d4894ff833ea147020a9d875eb7ce644a0ff355581690a4cbfd.bin"
"""The recorded chat stream (``tests/fixtures/openai-recorded``) every answer says."""
STREAMED: Final = b'"stream":true'
CREATE: Final = b'{"type":"response.create"'


def streamed_text(events: list[bytes]) -> str:
    """The text a recorded chat stream's events say."""
    text: list[str] = []
    for event in events:
        data = event.removeprefix(b"data: ").strip()
        if not data.startswith(b"{"):
            continue
        choices = orjson.loads(data).get("choices", ())
        text.extend(choice.get("delta", {}).get("content") or "" for choice in choices)
    return "".join(text)


class Answers:
    """A ``MockUpstream.handler``: each route's answer, made once."""

    def __init__(self, interval: float = 0.0) -> None:
        chat_events = recorded_stream(STREAM)
        text = streamed_text(chat_events)
        response = response_body("gpt-4o", [message_item(text, "msg_bench")], id="resp_bench")
        events = response_events(response)
        self.completion = JSONReply(orjson.dumps(chat_completion(text)))
        self.chat_stream = SSEReply(chat_events, interval=interval)
        self.response = JSONReply(orjson.dumps(response))
        self.response_stream = SSEReply(sse_of_events(events), interval=interval)
        self.socket = WSReply([orjson.dumps(event) for event in events], interval=interval)

    def __call__(self, received: Received) -> Reply | None:
        if received.method == "WS":
            return self.socket if received.body.startswith(CREATE) else None
        path = received.path
        if path.startswith("/v1/models"):
            return None  # the model list: it tells that the mock is up
        if path.startswith("/v1/responses"):
            return self.response_stream if STREAMED in received.body else self.response
        return self.chat_stream if STREAMED in received.body else self.completion


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--stream-interval", type=float, default=0.0, help="seconds between a stream's events"
    )
    args = parser.parse_args()
    serve_until_signalled(Answers(args.stream_interval), args.port)


if __name__ == "__main__":
    main()
