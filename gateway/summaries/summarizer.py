"""A summarizer that asks the summary model for the structured summary, in OpenAI's chat
API (Claude's answers translated: ``gateway.summaries.model.chat_post``).

It sends the prompt of ``pipelines.summary`` with the provider's structured-output mode
(``response_format`` with the summary's JSON Schema, strict); a provider that refuses a
request with it (a 400 that is not a context overflow) is asked again without it, and
remembered when that is answered. Each answer is parsed and audited: an
invalid one, or one keeping under 30% of the key entities of what it replaces, is retried,
at most ``attempts`` times in all, and the best valid attempt is kept. The whole call is
bounded by ``timeout``. Anything else (no valid answer, an error status, the deadline) is a
``SummaryFailed``: the caller falls back to deterministic compaction, the request goes on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

import orjson

from gateway.breaker import CircuitBreaker
from gateway.errors import GatewayError
from gateway.providers.openai import is_context_overflow
from pipelines.messages import Message, message_text
from pipelines.summary import (
    MIN_RETENTION,
    Summary,
    SummaryFailed,
    SummaryInvalid,
    SummaryOverflow,
    key_entities,
    parse_summary,
    retention,
    summary_request_messages,
    summary_schema,
)

__all__ = ["ChatPost", "SummaryFailed", "UpstreamSummarizer"]

ChatPost = Callable[[dict[str, Any]], Awaitable[tuple[int, bytes]]]
"""A chat request sent and answered: the status and the body, a chat completion (or an
error in OpenAI's envelope), whoever answers."""

_CALLERS_FAULT: Final = frozenset({401, 403, 404, 429})
"""Statuses that say the caller's key, model or quota is the problem: they do not count
towards pausing summaries for everyone."""


class SummaryRefused(SummaryFailed):
    """The upstream refused the summary call for the caller's own reasons."""


_RESPONSE_FORMAT: Final = {
    "type": "json_schema",
    "json_schema": {"name": "context_checkpoint", "strict": True, "schema": summary_schema()},
}


class UpstreamSummarizer:
    __slots__ = ("_plain", "attempts", "breaker", "post", "timeout")

    def __init__(
        self,
        post: ChatPost,
        *,
        timeout: float = 20.0,
        attempts: int = 3,
        breaker: CircuitBreaker | None = None,
        plain: set[str] | None = None,
    ) -> None:
        self.post = post
        """Sends a chat request to the summary model, whoever serves it
        (``gateway.summaries.model.chat_post``)."""
        self.timeout, self.attempts = timeout, attempts
        self.breaker = breaker
        """Shared by the requests of a process: after 3 failed summaries in a row, none is
        asked for a while (then one, to probe)."""
        self._plain: set[str] = plain if plain is not None else set()
        """Models whose provider refused ``response_format``."""

    async def summarize(
        self,
        messages: Sequence[Message],
        *,
        model: str,
        previous: Mapping[str, Any] | None = None,
    ) -> Summary:
        breaker = self.breaker
        if breaker is not None and not breaker.allow():
            raise SummaryFailed("summaries are paused after repeated failures")
        try:
            async with asyncio.timeout(self.timeout):
                summary = await self._summarize(messages, model, previous)
        except TimeoutError as exc:
            failure: SummaryFailed = SummaryFailed(f"no summary within {self.timeout:g} s")
            cause: BaseException = exc
        except GatewayError as exc:
            failure, cause = SummaryFailed(f"the summary model did not answer: {exc.code}"), exc
        except SummaryOverflow:
            if breaker is not None:
                breaker.release()  # the input's fault, not the model's: asked again with less
            raise
        except SummaryRefused:
            if breaker is not None:
                breaker.release()  # the caller's key or quota, not the model
            raise
        except asyncio.CancelledError:
            # The caller's deadline ran out first: as slow as a timeout of our own.
            if breaker is not None:
                breaker.failure()
            raise
        except SummaryFailed as exc:
            failure, cause = exc, exc
        else:
            if breaker is not None:
                breaker.success()
            return summary
        if breaker is not None:
            breaker.failure()
        raise failure from cause

    async def _summarize(
        self, messages: Sequence[Message], model: str, previous: Mapping[str, Any] | None
    ) -> Summary:
        entities = key_entities(message_text(m) for m in messages)
        prompt = summary_request_messages(messages, previous)
        best: Summary | None = None
        problems: list[str] = []
        for attempt in range(1, self.attempts + 1):
            try:
                fields, usage = await self._ask(prompt, model)
            except SummaryInvalid as exc:
                problems.append(str(exc))
                continue
            kept = retention(fields, entities)
            summary = Summary(fields, kept, attempt, usage)
            if best is None or kept > best.retention:
                best = summary
            if kept >= MIN_RETENTION:
                return summary
            problems.append(f"kept {kept:.0%} of the key entities")
        if best is not None:
            return best
        raise SummaryFailed("; ".join(problems) or "no answer")

    async def _ask(
        self, prompt: list[dict[str, Any]], model: str
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        body: dict[str, Any] = {"model": model, "messages": prompt, "temperature": 0}
        structured = model not in self._plain
        if structured:
            body["response_format"] = _RESPONSE_FORMAT
        status, answer = await self._post(body)
        if status == 400 and structured and not is_context_overflow(status, answer):
            # Providers word their refusal of structured output in their own terms
            # (``response_format``, Anthropic's ``output_config``, a model without it):
            # asked again plainly, and remembered when that is answered.
            del body["response_format"]
            status, answer = await self._post(body)
            if status == 200:
                self._plain.add(model)
        if is_context_overflow(status, answer):
            raise SummaryOverflow(f"the summary model's window was exceeded ({status})")
        if status in _CALLERS_FAULT:
            raise SummaryRefused(f"the summary call was refused ({status})")
        if status != 200:
            raise SummaryFailed(f"the summary model answered {status}{_error_code(answer)}")
        try:
            data = orjson.loads(answer)
            content = data["choices"][0]["message"]["content"]
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
            raise SummaryInvalid("the summary model's answer is not a chat completion") from exc
        if not isinstance(content, str):
            raise SummaryInvalid("the summary model answered without text")
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else None
        return parse_summary(content), usage

    async def _post(self, body: dict[str, Any]) -> tuple[int, bytes]:
        return await self.post(body)


def _error_code(body: bytes) -> str:
    """`` (code)`` from an OpenAI error envelope, else nothing: the body itself is not
    repeated (it goes to logs and reports, and a provider might echo a credential)."""
    try:
        error = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return ""
    code = error.get("code") or error.get("type") if isinstance(error, dict) else None
    return f" ({code})" if isinstance(code, str) and code.isprintable() and len(code) < 80 else ""
