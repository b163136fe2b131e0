"""The upstream span: one OpenTelemetry span (kind ``CLIENT``) per call to the model's
provider, named and described by the GenAI semantic conventions, for operators following a
request's latency and token cost.

``UpstreamCall.start`` opens it as a request leaves (every attempt and every restore
round): ``chat {model}``, with ``gen_ai.operation.name`` ``chat``, ``gen_ai.provider.name``
(and the older ``gen_ai.system``) ``anthropic`` for the built-in Anthropic provider and
``openai`` for the OpenAI-compatible upstream, and ``gen_ai.request.model``. The HTTP client
span of the call is its child. It ends when the answer is whole: ``answered`` with the body
read, or, for a stream, when the events ``streamed`` returns end, however they end.

From the answer, OpenAI's or Anthropic's, whole or event by event, it records
``gen_ai.response.model``, ``gen_ai.response.id``, ``gen_ai.response.finish_reasons``,
``gen_ai.usage.input_tokens`` (cache reads and writes included, as the conventions ask),
``gen_ai.usage.output_tokens``, ``gen_ai.usage.cache_read.input_tokens`` and
``gen_ai.usage.cache_creation.input_tokens`` where the provider reports them, and
``http.response.status_code``. A failure sets status ``ERROR`` and ``error.type``: the
provider's error code or type, else the status, else the gateway's error code. Nothing of
the prompt or of the answer's text is recorded. The answer is read only when the span
records, so with tracing off a call costs one no-op span.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from types import TracebackType
from typing import Any, Final

import orjson
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, StatusCode
from opentelemetry.util.types import AttributeValue

from gateway.http.sse import close, event_data

__all__ = ["UpstreamCall"]

_tracer = trace.get_tracer(__name__)

_READ_MARKS: Final = (b'"usage"', b'"error"', b'_reason":"', b'_reason": "')
"""What an event must hold to be worth parsing once its model is known: usage, an error,
or a finish (``finish_reason``, ``stop_reason``) that is not ``null``."""


class UpstreamCall:
    """The span of one upstream call, ended exactly once."""

    __slots__ = ("_answer", "_ended", "span")

    def __init__(self, span: Span) -> None:
        self.span = span
        self._answer = _Answer()
        self._ended = False

    @classmethod
    def start(
        cls, provider: str, request: Mapping[str, Any], *, restore: bool = False
    ) -> UpstreamCall:
        """The span of ``request`` (OpenAI chat form) going to ``provider`` (``openai``,
        ``anthropic``); ``restore`` marks a restore round (``contextgate.restore_round``)."""
        model = str(request.get("model") or "")
        span = _tracer.start_span(f"chat {model}" if model else "chat", kind=SpanKind.CLIENT)
        if span.is_recording():
            attributes: dict[str, AttributeValue] = {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": provider,
                "gen_ai.system": provider,
                "gen_ai.request.model": model,
            }
            if restore:
                attributes["contextgate.restore_round"] = True
            span.set_attributes(attributes)
        return cls(span)

    def current(self) -> AbstractContextManager[None]:
        """The span current inside (the HTTP client span becomes its child); an error
        out of it ends the call as failed."""
        if not self.span.get_span_context().is_valid:
            # Tracing off (a no-op span): there is no span to make current, and none in the
            # context either (only the server span, when traced, puts one there). The call
            # is its own context manager: a generator's costs a request twice as much.
            return self
        return self._current()

    @contextmanager
    def _current(self) -> Iterator[None]:
        with (
            trace.use_span(
                self.span, end_on_exit=False, record_exception=False, set_status_on_exception=False
            ),
            self,
        ):
            yield

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """An error out of the ``with`` block ends the call as failed."""
        if isinstance(error, Exception):
            self._end(failure=_failure(error))
        elif error is not None:
            self._end()  # cancelled: the client left, the upstream did not fail

    def answered(self, status: int, body: bytes) -> None:
        """End the call with its whole answer."""
        if self._ended:
            return
        if not self.span.is_recording():
            self._end()
            return
        self.span.set_attribute("http.response.status_code", status)
        data = _json(body)
        if 200 <= status < 300:
            if data is not None:
                self._answer.read(data)
            self._end()
        else:
            self._end(failure=_error_type(data) or str(status))

    def streamed(self, status: int, events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """``events`` relayed as they are; the call ends when they end or are closed."""
        if not self.span.is_recording():
            self._end()
            return events
        self.span.set_attribute("http.response.status_code", status)
        return _Watched(events, self)

    def read_event(self, event: bytes) -> None:
        if self._answer.model is not None and not any(m in event for m in _READ_MARKS):
            return
        data = _json(event_data(event))
        if data is not None:
            self._answer.read(data)

    def _end(self, *, failure: str | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        span = self.span
        if span.is_recording():
            span.set_attributes(self._answer.attributes())
            failure = failure or self._answer.error
            if failure is not None:
                span.set_attribute("error.type", failure)
                span.set_status(StatusCode.ERROR)
        span.end()


class _Watched:
    """A stream's events relayed as they are, each read into its call's span, which ends
    with the stream (exhausted, failed, or closed early)."""

    __slots__ = ("_call", "_events")

    def __init__(self, events: AsyncIterator[bytes], call: UpstreamCall) -> None:
        self._events, self._call = events, call

    def __aiter__(self) -> _Watched:
        return self

    async def __anext__(self) -> bytes:
        try:
            event = await self._events.__anext__()
        except StopAsyncIteration:
            self._call._end()
            raise
        except Exception as exc:
            self._call._end(failure=_failure(exc))
            raise
        except BaseException:
            self._call._end()
            raise
        self._call.read_event(event)
        return event

    async def aclose(self) -> None:
        try:
            await close(self._events)
        finally:
            self._call._end()


class _Answer:
    """What the spans record of an answer, gathered from a whole body or from events, in
    OpenAI's form or Anthropic's."""

    __slots__ = ("error", "finish", "id", "model", "usage")

    def __init__(self) -> None:
        self.model: str | None = None
        self.id: str | None = None
        self.error: str | None = None
        self.finish: dict[int, str] = {}
        self.usage: dict[str, Any] = {}

    def read(self, data: Mapping[str, Any]) -> None:
        message = data.get("message")
        if data.get("type") == "message_start" and isinstance(message, Mapping):
            data = message
        response = data.get("response")
        if str(data.get("type")).startswith("response.") and isinstance(response, Mapping):
            data = response  # a Responses event carrying its response (created, completed)
        if data.get("error") is not None:
            self.error = _error_type(data) or "error"
        if self.model is None and isinstance(data.get("model"), str):
            self.model = data["model"]
        if self.id is None and isinstance(data.get("id"), str):
            self.id = data["id"]
        usage = data.get("usage")
        if isinstance(usage, Mapping):
            self.usage.update({k: v for k, v in usage.items() if v is not None})
        choices = data.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            reason = choice.get("finish_reason") if isinstance(choice, Mapping) else None
            if isinstance(reason, str):
                index = choice.get("index")
                self.finish[index if isinstance(index, int) else 0] = reason
        delta = data.get("delta")
        stop = delta.get("stop_reason") if isinstance(delta, Mapping) else data.get("stop_reason")
        if isinstance(stop, str):
            self.finish[0] = stop

    def attributes(self) -> dict[str, AttributeValue]:
        found: dict[str, AttributeValue] = {}
        if self.model is not None:
            found["gen_ai.response.model"] = self.model
        if self.id is not None:
            found["gen_ai.response.id"] = self.id
        if self.finish:
            found["gen_ai.response.finish_reasons"] = [self.finish[i] for i in sorted(self.finish)]
        found.update(_usage_attributes(self.usage))
        return found


def _usage_attributes(usage: Mapping[str, Any]) -> dict[str, AttributeValue]:
    """GenAI usage attributes from an Anthropic usage (``input_tokens`` counts what the
    cache did not serve), an OpenAI Responses one (``input_tokens`` counts it all, its
    ``input_tokens_details`` the cache reads) or an OpenAI chat one (``prompt_tokens``
    counts it all)."""
    found: dict[str, AttributeValue] = {}
    responses = usage.get("input_tokens_details")
    if "input_tokens" in usage and isinstance(responses, Mapping):
        input_tokens = _count(usage["input_tokens"])
        if input_tokens is not None:
            found["gen_ai.usage.input_tokens"] = input_tokens
        read, written = _count(responses.get("cached_tokens")), None
        output = _count(usage.get("output_tokens"))
    elif "input_tokens" in usage:
        read = _count(usage.get("cache_read_input_tokens"))
        written = _count(usage.get("cache_creation_input_tokens"))
        found["gen_ai.usage.input_tokens"] = (
            (_count(usage["input_tokens"]) or 0) + (read or 0) + (written or 0)
        )
        output = _count(usage.get("output_tokens"))
    else:
        prompt = _count(usage.get("prompt_tokens"))
        if prompt is not None:
            found["gen_ai.usage.input_tokens"] = prompt
        details = usage.get("prompt_tokens_details")
        read = _count(details.get("cached_tokens")) if isinstance(details, Mapping) else None
        written = _count(usage.get("cache_creation_input_tokens"))
        output = _count(usage.get("completion_tokens"))
    if output is not None:
        found["gen_ai.usage.output_tokens"] = output
    if read is not None:
        found["gen_ai.usage.cache_read.input_tokens"] = read
    if written is not None:
        found["gen_ai.usage.cache_creation.input_tokens"] = written
    return found


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _json(body: bytes) -> Mapping[str, Any] | None:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return data if isinstance(data, Mapping) else None


def _error_type(data: Mapping[str, Any] | None) -> str | None:
    """The provider's code or type of the error an answer carries (OpenAI's envelope or
    Anthropic's)."""
    error = data.get("error") if data is not None else None
    if not isinstance(error, Mapping):
        return None
    kind = error.get("code") or error.get("type")
    return str(kind) if kind else None


def _failure(exc: Exception) -> str:
    code = getattr(exc, "code", None)
    return code if isinstance(code, str) and code else type(exc).__qualname__
