"""``POST /v1/responses``: the OpenAI Responses API through the context pipeline, streamed
or not, for the openai SDK's ``responses``, the Agents SDK and Codex CLI.

The request is read as a Responses request, turned into the chat request the pipeline
works on (``gateway.codecs.responses``), compacted like any other, and sent to the
OpenAI-compatible upstream as a Responses request again: every item the pipeline left
alone as the client sent it (encrypted reasoning and compaction items are never edited),
every other field as it came (with the provider's compaction asked for under
``native=prefer``: ``with_preferred``). The answer is the upstream's, byte for byte; its usage
(``response.completed`` when streamed) feeds the conversation's record.

A request that continues server-side state (``previous_response_id``, ``conversation``)
is kept to hygiene: the gateway does not see the history it continues. Models served by
Anthropic are not reached through this route (Claude has no Responses API): 400. The
other ``/v1/responses/...`` routes (``compact``, retrieve, ``input_items``, ``cancel``,
delete) are relayed (``gateway.routes.passthrough``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from functools import partial
from typing import Any

from litestar import Request, post
from litestar.response.base import ASGIResponse

from gateway.codecs.responses import InboundRequest, StoredItems, parse_request, to_request
from gateway.context.answer import answer
from gateway.context.call import Call, Services
from gateway.context.compaction import ChatRequest, compact, refuse_upstream_choice
from gateway.context.exchange import Buffered
from gateway.context.native import FIELD, preferred_field
from gateway.context.wires import ResponsesWire
from gateway.errors import GatewayError, InvalidRequest
from gateway.http.responses import last_sequence_number, responses_error_event
from gateway.http.sse import close
from gateway.providers.anthropic import AnthropicUpstream
from gateway.routes.answers import respond
from gateway.routes.calls import received

__all__ = ["compacted", "responses", "wire_for", "with_preferred"]


@post("/v1/responses", status_code=200)
async def responses(request: Request[Any, Any, Any]) -> ASGIResponse:
    """OpenAI Responses, streamed or not, through the context pipeline."""
    gateway, call, raw = await received(request)
    inbound = parse_request(raw)
    chat = await compacted(gateway, call, inbound)
    target = chat.target
    assert target is not None  # not a dry run
    got = await answer(gateway, call, chat, wire_for(chat, inbound, raw), target.headers)
    keepalive = gateway.settings.stream_keepalive
    if isinstance(got, Buffered):
        return respond(got, call.request_id, keepalive=keepalive, error=responses_error_event)
    numbered = _Numbered(got.first, got.events)
    got.events = numbered
    return respond(got, call.request_id, keepalive=keepalive, error=numbered.error_event)


async def compacted(
    services: Services,
    call: Call,
    inbound: InboundRequest,
    *,
    dry_run: bool = False,
    restore_tool: bool = True,
) -> ChatRequest:
    """``inbound`` through the pipeline: in full when the request carries its whole
    history, kept to hygiene when it continues one the upstream keeps; with the restore
    tool where the conversation has it, unless ``restore_tool`` is off (a wire with no
    restore loop: the WebSocket's)."""
    refuse_upstream_choice(inbound.native)
    chat = await compact(
        services,
        call,
        inbound.chat,
        dry_run=dry_run,
        native_api="responses",
        management=inbound.native.get(FIELD),
        # The restore tool only where no response is stored: a stored id would name a
        # restore round the client never saw (gateway.context.restore.responses).
        restore_tool=restore_tool and not inbound.stateful and inbound.native.get("store") is False,
        history_seen=not inbound.stateful,
        render=StoredItems(),
    )
    target = chat.target
    if target is not None and isinstance(target.provider, AnthropicUpstream):
        raise InvalidRequest(
            f"{target.model} is served by Anthropic, which has no Responses API: use"
            " /v1/messages or /v1/chat/completions for it.",
            code="unsupported_model",
            param="model",
        )
    return chat


def with_preferred(inbound: InboundRequest, chat: ChatRequest) -> InboundRequest:
    """``inbound`` asking the upstream for its compaction when the policy prefers it
    (``gateway.context.native``)."""
    if chat.native is None or chat.native.mode != "prefer":
        return inbound
    field = preferred_field(chat.native, inbound.native.get(FIELD))
    return replace(inbound, native={**inbound.native, FIELD: field})


def wire_for(chat: ChatRequest, inbound: InboundRequest, raw: bytes | None) -> ResponsesWire:
    """The Responses wire for ``chat``: ``raw`` sent as it came when the pipeline changed
    nothing and the gateway added nothing (a tool, the provider's compaction)."""
    target = chat.target
    assert target is not None
    assert not isinstance(target.provider, AnthropicUpstream)
    result = chat.result
    preferring = inbound is not (inbound := with_preferred(inbound, chat))
    as_sent = not result.changed and not chat.restore_tool and not preferring
    unchanged = (result.request, raw) if raw is not None and as_sent else None
    return ResponsesWire(target.provider, partial(_request, inbound), unchanged)


def _request(inbound: InboundRequest, outgoing: Mapping[str, Any]) -> dict[str, Any]:
    return to_request(outgoing, inbound.native, inbound.messages)


class _Numbered:
    """A Responses stream's events relayed as they are, the last ``sequence_number``
    noted, so that an error event ending the stream is numbered after it."""

    __slots__ = ("_events", "last")

    def __init__(self, first: bytes, events: AsyncIterator[bytes]) -> None:
        self._events = events
        self.last = -1
        self._note(first)

    def _note(self, event: bytes) -> None:
        found = last_sequence_number(event)
        if found is not None:
            self.last = found

    def __aiter__(self) -> _Numbered:
        return self

    async def __anext__(self) -> bytes:
        event = await self._events.__anext__()
        self._note(event)
        return event

    async def aclose(self) -> None:
        await close(self._events)

    def error_event(self, error: GatewayError) -> bytes:
        return responses_error_event(error, self.last + 1)
