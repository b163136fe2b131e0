"""The upstream's side of an exchange (``gateway.context.exchange.Wire``), one per API.

- ``ChatWire``: OpenAI chat completions, to an OpenAI-compatible upstream. An inbound
  Messages request sent this way has its Anthropic-only fields removed first
  (``prepare``: ``openai_request``) and always asks for the usage of its stream; a chat
  request whose native edits the gateway applied, its ``context_management``
  (``native.without_field``).
- ``MessagesWire``: the Anthropic Messages API natively (``AnthropicUpstream.send_messages``),
  for every request to Claude: a Messages client's (its own fields laid over the
  pipeline's request, and its answer Anthropic's own bytes) and a chat client's (the
  pipeline's request translated, and the answer translated back by the chat route).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import httpx
import orjson

from gateway.codecs.anthropic_envelopes import error_status
from gateway.codecs.chat_anthropic import usage_of
from gateway.codecs.json_body import json_dict
from gateway.codecs.responses import chat_usage, error_event, response_of
from gateway.context import restore
from gateway.context.restore import Resend, ResendStream, Restorer
from gateway.context.restore import messages as restore_messages
from gateway.context.restore import responses as restore_responses
from gateway.http.sse import event_data
from gateway.providers.anthropic import AnthropicUpstream
from gateway.providers.openai import ChatUpstream, json_answer
from pipelines.session import NATIVE_EDITS

__all__ = ["ChatWire", "MessagesWire", "ResponsesWire"]


class ChatWire:
    """OpenAI chat completions on the wire."""

    __slots__ = ("_prepare", "upstream")

    def __init__(
        self,
        upstream: ChatUpstream,
        prepare: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        self.upstream = upstream
        self._prepare = prepare
        """Applied to each request before it is encoded (an inbound Messages request's
        Anthropic-only fields removed)."""

    async def send(
        self,
        outgoing: dict[str, Any],
        headers: Mapping[str, str],
        *,
        encoded: bytes | None = None,
        extra: list[dict[str, Any]] | None = None,
    ) -> httpx.Response:
        if extra:
            outgoing, encoded = {**outgoing, "messages": [*outgoing["messages"], *extra]}, None
        if self._prepare is not None:
            content = orjson.dumps(self._prepare(outgoing))
        else:
            content = encoded if encoded is not None else orjson.dumps(outgoing)
        return await self.upstream.send(
            "POST", "chat/completions", headers=headers, content=content
        )

    async def complete(self, body: bytes, restorer: Restorer, resend: Resend) -> bytes:
        return await restore.complete(body, restorer, resend)

    def stream(
        self, first: bytes, events: AsyncIterator[bytes], restorer: Restorer, resend: ResendStream
    ) -> AsyncIterator[bytes]:
        return restore.stream(first, events, restorer, resend)

    def usage(self, body: bytes) -> dict[str, Any] | None:
        return _usage(body)

    def answer_id(self, body: bytes) -> str | None:
        return _answer_id(body)

    def check(self, body: bytes) -> None:
        return None  # relayed as it came

    def usage_tracker(self) -> _ChunkUsage:
        return _ChunkUsage()

    def stream_error(self, event: bytes) -> tuple[int, bytes] | None:
        if b'{"error"' not in event:
            return None  # nor then at the start of its data: not worth taking the data out
        data = event_data(event)
        if not data.startswith(b'{"error"'):
            return None
        try:
            error = orjson.loads(data)["error"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return None
        return _error_status(error), data


class ResponsesWire:
    """The OpenAI Responses API on the wire, to an OpenAI-compatible upstream: ``request``
    makes the Responses request for the pipeline's chat request (``to_request`` with the
    client's own fields); the answer is relayed as it came, with the restore calls of a
    conversation that has the tool answered in place (``restore.responses``)."""

    __slots__ = ("_raw", "request", "upstream")

    def __init__(
        self,
        upstream: ChatUpstream,
        request: Callable[[Mapping[str, Any]], dict[str, Any]],
        raw: tuple[Mapping[str, Any], bytes] | None = None,
    ) -> None:
        self.upstream = upstream
        self.request = request
        self._raw = raw
        """The pipeline's request that changed nothing, and the body as received: sent as
        it is for that request (not for another attempt's, compacted again)."""

    async def send(
        self,
        outgoing: dict[str, Any],
        headers: Mapping[str, str],
        *,
        encoded: bytes | None = None,
        extra: list[dict[str, Any]] | None = None,
    ) -> httpx.Response:
        if self._raw is not None and not extra and outgoing is self._raw[0]:
            content = self._raw[1]
        else:
            request = self.request(outgoing)
            if extra:
                request = {**request, "input": [*request.get("input", []), *extra]}
            content = orjson.dumps(request)
        return await self.upstream.send("POST", "responses", headers=headers, content=content)

    async def complete(self, body: bytes, restorer: Restorer, resend: Resend) -> bytes:
        return await restore_responses.complete(body, restorer, resend)

    def stream(
        self, first: bytes, events: AsyncIterator[bytes], restorer: Restorer, resend: ResendStream
    ) -> AsyncIterator[bytes]:
        return restore_responses.stream(first, events, restorer, resend)

    def usage(self, body: bytes) -> dict[str, Any] | None:
        response = response_of(body)
        return _response_usage(response) if response is not None else None

    def answer_id(self, body: bytes) -> str | None:
        response = response_of(body)
        found = response.get("id") if response is not None else None
        return found if isinstance(found, str) else None

    def check(self, body: bytes) -> None:
        return None  # relayed as it came

    def usage_tracker(self) -> _ResponseUsage:
        return _ResponseUsage()

    def stream_error(self, event: bytes) -> tuple[int, bytes] | None:
        return error_event(event_data(event))


class MessagesWire:
    """The Anthropic Messages API on the wire: ``request`` makes the Messages request for
    the pipeline's chat request (``to_request`` with a Messages client's own fields,
    ``to_messages`` for a chat client's)."""

    __slots__ = ("for_chat", "request", "upstream")

    def __init__(
        self,
        upstream: AnthropicUpstream,
        request: Callable[[Mapping[str, Any]], dict[str, Any]],
        *,
        for_chat: bool = False,
    ) -> None:
        self.upstream = upstream
        self.request = request
        self.for_chat = for_chat
        """Whether the answers are translated for a chat client (``check`` then requires
        a message it can translate; a Messages client gets Anthropic's bytes as they are)."""

    async def send(
        self,
        outgoing: dict[str, Any],
        headers: Mapping[str, str],
        *,
        encoded: bytes | None = None,
        extra: list[dict[str, Any]] | None = None,
    ) -> httpx.Response:
        request = self.request(outgoing)
        if extra:
            request = {**request, "messages": [*request["messages"], *extra]}
        return await self.upstream.send_messages(orjson.dumps(request), headers)

    async def complete(self, body: bytes, restorer: Restorer, resend: Resend) -> bytes:
        return await restore_messages.complete(body, restorer, resend)

    def stream(
        self, first: bytes, events: AsyncIterator[bytes], restorer: Restorer, resend: ResendStream
    ) -> AsyncIterator[bytes]:
        return restore_messages.stream(first, events, restorer, resend)

    def usage(self, body: bytes) -> dict[str, Any] | None:
        answer = json_dict(body) or {}
        usage = answer.get("usage")
        if not isinstance(usage, dict):
            return None
        return _with_writes(usage, _applied_edits(answer.get("context_management")))

    def answer_id(self, body: bytes) -> str | None:
        return _answer_id(body)

    def check(self, body: bytes) -> None:
        if self.for_chat:
            json_answer(body, "a message", listing="content")

    def usage_tracker(self) -> _EventUsage:
        return _EventUsage()

    def stream_error(self, event: bytes) -> tuple[int, bytes] | None:
        if b'"error"' not in event:
            return None  # nor then in its data
        data = event_data(event)
        if b'"error"' not in data[:40]:
            return None
        try:
            answer = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(answer, dict) or answer.get("type") != "error":
            return None
        return _error_status(answer.get("error")), data


def _error_status(error: Any) -> int:
    """The status an error object of a stream's first event stands for (by its Anthropic
    error type; 502 when it names none the gateway knows)."""
    kind = error.get("type") if isinstance(error, dict) else None
    return error_status(str(kind)) or 502


def _usage(body: bytes) -> dict[str, Any] | None:
    """The ``usage`` of a JSON answer (a chat completion, a Messages answer), if it has
    one."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    usage = data.get("usage") if isinstance(data, dict) else None
    return usage if isinstance(usage, dict) else None


def _answer_id(body: bytes) -> str | None:
    """The ``id`` of a JSON answer (a chat completion or chunk, a Messages answer)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    found = data.get("id") if isinstance(data, dict) else None
    return found if isinstance(found, str) else None


class _ChunkUsage:
    """A chat stream's usage: its usage chunk (some providers repeat a running total in
    every chunk: the last one counts); and its id, the first event's."""

    __slots__ = ("answer_id", "usage")

    def __init__(self) -> None:
        self.usage: dict[str, Any] | None = None
        self.answer_id: str | None = None

    def add(self, event: bytes) -> None:
        if self.answer_id is None:
            self.answer_id = _answer_id(event_data(event)) or ""
        if b'"usage"' not in event:
            return
        data = event_data(event)
        if data.startswith(b"{"):
            self.usage = _usage(data) or self.usage


class _ResponseUsage:
    """A Responses stream's usage and id: ``response.created`` names the response,
    ``response.completed`` (or ``.incomplete``) carries its usage."""

    __slots__ = ("answer_id", "usage")

    def __init__(self) -> None:
        self.usage: dict[str, Any] | None = None
        self.answer_id: str | None = None

    def add(self, event: bytes) -> None:
        if self.answer_id is not None and b'"usage"' not in event:
            return
        response = response_of(event_data(event))
        if response is None:
            return
        if self.answer_id is None:
            found = response.get("id")
            self.answer_id = found if isinstance(found, str) else ""
        self.usage = _response_usage(response) or self.usage


class _EventUsage:
    """A Messages stream's usage: ``message_start`` gives the input side (and the id),
    each ``message_delta`` updates it; kept in Anthropic form, read in OpenAI form."""

    __slots__ = ("_applied", "_usage", "answer_id")

    def __init__(self) -> None:
        self._usage: dict[str, Any] = {}
        self._applied = 0
        self.answer_id: str | None = None

    @property
    def usage(self) -> dict[str, Any] | None:
        return _with_writes(self._usage, self._applied) if self._usage else None

    def add(self, event: bytes) -> None:
        if b'"usage"' not in event:
            return
        try:
            data = orjson.loads(event_data(event))
        except orjson.JSONDecodeError:
            return
        if not isinstance(data, dict):
            return
        if data.get("type") == "message_start":
            message = data.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            found = message.get("id") if isinstance(message, dict) else None
            self.answer_id = found if isinstance(found, str) else ""
        else:
            usage = data.get("usage")
            self._applied = _applied_edits(data.get("context_management")) or self._applied
        if isinstance(usage, dict):
            self._usage.update({k: v for k, v in usage.items() if v is not None})


def _with_writes(usage: Mapping[str, Any], applied: int = 0) -> dict[str, Any]:
    """The OpenAI-form usage of Anthropic ``usage``, with its cache writes kept as
    ``cache_creation_input_tokens`` (LiteLLM's name) for the token metrics: the OpenAI form
    folds them into ``prompt_tokens``; and, as ``native_edits``, the context edits the
    provider applied (``applied`` from its ``context_management``, and each compaction in
    its ``iterations``) for the conversation's record."""
    converted = usage_of(usage)
    written = usage.get("cache_creation_input_tokens")
    converted["cache_creation_input_tokens"] = written if isinstance(written, int) else 0
    iterations = usage.get("iterations")
    compactions = sum(
        1
        for entry in (iterations if isinstance(iterations, list) else ())
        if isinstance(entry, dict) and entry.get("type") == "compaction"
    )
    if applied or compactions:
        converted[NATIVE_EDITS] = applied + compactions
    return converted


def _response_usage(response: Mapping[str, Any]) -> dict[str, Any] | None:
    """A Responses answer's usage in OpenAI chat form, with the compactions the upstream
    made (``compaction`` items in its output) as ``native_edits``."""
    usage = chat_usage(response.get("usage"))
    output = response.get("output")
    compactions = sum(
        1
        for item in (output if isinstance(output, list) else ())
        if isinstance(item, dict) and item.get("type") == "compaction"
    )
    if usage is not None and compactions:
        usage[NATIVE_EDITS] = compactions
    return usage


def _applied_edits(management: Any) -> int:
    """How many edits an answer's ``context_management`` reports applied."""
    edits = management.get("applied_edits") if isinstance(management, dict) else None
    return len(edits) if isinstance(edits, list) else 0
