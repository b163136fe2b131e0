"""Reading a chat request off the wire and running the pipeline over it.

Shared by the chat route, which then forwards the result, and the dry-run route, which
returns it. The gateway's restore tool is decided here, so that the pipeline budgets it and
sees it as the provider will: it is in the request from the first one that names an
offloaded object on (``gateway.context.restore``). ``recompact`` serves the overflow retry: when
the upstream says the request was too long for its window anyway, the same request is
compacted again to half the budget.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

import orjson
from litestar import Request
from opentelemetry import trace

from gateway.codecs.openai import parse_chat_request
from gateway.context.restore import has_refs, with_restore_tool
from gateway.errors import Forbidden, InvalidRequest, RequestRejectedError
from gateway.http.client import read_body
from gateway.http.headers import POLICY_HEADER, policy_from_header
from gateway.providers.openai import upstream_request_headers
from gateway.runtime import Gateway
from gateway.summaries.summarizer import UpstreamSummarizer
from gateway.tenancy.auth import Caller, caller_of
from pipelines import (
    CompactResult,
    ConversationState,
    Policy,
    RequestRejected,
    conversation_id,
)
from pipelines.budget import BUDGET_FLOOR
from pipelines.checkpoints import Summaries

__all__ = [
    "CONVERSATION_HEADER",
    "ChatRequest",
    "compact_request",
    "recompact",
    "refuse_upstream_choice",
    "request_body",
]

_tracer = trace.get_tracer(__name__)

CONVERSATION_HEADER: Final = "x-contextgate-conversation"
SESSION_HEADERS: Final = ("x-claude-code-session-id", "session-id")
"""Headers by which agents name their session (Claude Code's, Codex's): part of the
identity of a conversation the client does not name."""
_CONVERSATION_ID: Final = re.compile(r"[A-Za-z0-9._:@/+=-]{1,200}")
UPSTREAM_CHOICES: Final = frozenset(
    {"api_base", "base_url", "api_key", "api_host", "azure_endpoint", "custom_llm_provider"}
)
"""Body fields with which other gateways let a request pick its upstream or credentials
(the classic gateway SSRF): refused, so that no upstream that reads them gets them."""


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A parsed chat request and what the pipeline made of it."""

    raw: bytes | None
    """The body as received when it is an OpenAI chat request; ``None`` when it came in
    another format."""
    body: dict[str, Any]
    """The request the pipeline ran over: the client's, with the restore tool when the
    request carries it."""
    policy: Policy
    result: CompactResult
    namespace: str
    conversation: str
    """The conversation's identity: the client's ``x-contextgate-conversation`` or a
    hash of the namespace, system prompt and first user message."""
    state: ConversationState | None
    """The conversation's record as it was before this request."""
    caller: Caller
    restore_tool: bool = False
    """Whether ``body`` (and so the request sent) carries the gateway's restore tool."""
    content: bytes | None = None
    """``result.request`` as OpenAI chat JSON, when it was encoded already (to look for
    refs in it): the body as received when no stage changed it."""

    @property
    def rewritten(self) -> bool:
        """Whether what goes up differs from what the client sent in more than cache
        markers (which change no prompt): a stage other than ``cache_markers`` changed it,
        or it carries the restore tool."""
        return self.restore_tool or any(
            name != "cache_markers" for name in self.result.report.actions
        )


async def compact_request(
    request: Request[Any, Any, Any],
    *,
    dry_run: bool = False,
    body: dict[str, Any] | None = None,
) -> ChatRequest:
    """The request's body (an OpenAI chat request, read from ``request`` unless ``body``
    gives it already translated) compacted under its policy; a ``dry_run`` asks no model
    for a summary (a checkpoint already prepared is used)."""
    gateway: Gateway = request.app.state.gateway
    caller = caller_of(request)
    raw = None
    if body is None:
        raw = await request_body(request)
        body = parse_chat_request(raw)
    request.state.body = body  # for the access log and metrics (gateway.access)
    refuse_upstream_choice(body)
    policy = policy_from_header(
        request.headers.get(POLICY_HEADER), caller.profile.policy, caller.profile.bounds
    )
    _check_models(caller, str(body.get("model", "")), policy)
    namespace = caller.namespace
    conversation = _conversation(request.headers, namespace, body)
    state = await gateway.stores.conversations.get(namespace, conversation)
    summaries = None
    if gateway.settings.summaries and policy.mode == "summarize":
        summary_model = policy.summary_model or str(body.get("model", ""))
        try:
            key = gateway.upstream_key(caller, summary_model)
        except InvalidRequest:
            dry_run = True  # no credentials for the summary model: checkpoints only
            key = None
        headers = upstream_request_headers(request.headers.items(), key)
        summarizer = (
            None
            if dry_run
            else UpstreamSummarizer(
                gateway.upstream_for(summary_model),
                headers,
                timeout=policy.summary_timeout,
                breaker=gateway.summary_breaker,
                plain=gateway.structured_refused,
            )
        )
        summaries = gateway.summaries.bind(
            namespace, conversation, summarizer, policy.summary_timeout
        )
    result, tooled, content = await _compact_with_restore_tool(
        gateway, raw, body, policy, state, namespace, conversation, summaries
    )
    return ChatRequest(
        raw,
        tooled or body,
        policy,
        result,
        namespace,
        conversation,
        state,
        caller,
        restore_tool=tooled is not None,
        content=content,
    )


async def request_body(request: Request[Any, Any, Any]) -> bytes:
    """The request's body, read within the gateway's size and time limits."""
    settings = request.app.state.gateway.settings
    return await read_body(
        request.receive,
        request.headers.get("content-length"),
        settings.max_body_bytes,
        within=settings.body_timeout,
    )


def refuse_upstream_choice(fields: Mapping[str, Any]) -> None:
    """400 when a request's body tries to choose the upstream or its credentials."""
    named = UPSTREAM_CHOICES.intersection(fields)
    if named:
        field = min(named)
        raise InvalidRequest(
            f"'{field}' cannot be set by a request: the gateway's configuration chooses"
            " the upstream and its credentials.",
            code="unsupported_parameter",
            param=field,
        )


def _check_models(caller: Caller, model: str, policy: Policy) -> None:
    """403 unless the caller's tenant may use ``model`` and the summary model."""
    profile = caller.profile
    for name, param in ((model, "model"), (policy.summary_model, POLICY_HEADER)):
        if name is not None and not profile.allows(name):
            raise Forbidden(
                f"The model {name!r} is not available to this gateway key.",
                param=param if param == "model" else f"{POLICY_HEADER}.summary-model",
            )


async def recompact(gateway: Gateway, chat: ChatRequest) -> ChatRequest | None:
    """The request compacted again (deterministically, no model call) to half of what
    the upstream just refused: half its budget, or half its size when that is smaller, as
    the upstream's window is evidently not what the catalog says. None when that would go
    under the budget floor or change nothing."""
    report = chat.result.report
    budget = min(report.budget, report.tokens_after) // 2
    if budget < BUDGET_FLOOR:
        return None
    policy = replace(chat.policy, max_input=budget, mode="truncate")
    result = await _compact(
        gateway, chat.body, policy, chat.state, chat.namespace, chat.conversation
    )
    if result.request == chat.result.request:
        return None
    return replace(chat, policy=policy, result=result, content=None)


def _conversation(headers: Mapping[str, str], namespace: str, body: dict[str, Any]) -> str:
    header = headers.get(CONVERSATION_HEADER)
    if header is None:
        session = next((headers[name] for name in SESSION_HEADERS if name in headers), "")
        return conversation_id(namespace, body["messages"], session[:200])
    if not _CONVERSATION_ID.fullmatch(header):
        raise InvalidRequest(
            f"{CONVERSATION_HEADER} must be 1-200 characters of letters, digits and"
            " . _ : @ / + = -",
            code="invalid_conversation_id",
            param=CONVERSATION_HEADER,
        )
    return "client:" + header


async def _compact_with_restore_tool(
    gateway: Gateway,
    raw: bytes | None,
    body: dict[str, Any],
    policy: Policy,
    state: ConversationState | None,
    namespace: str,
    conversation: str,
    summaries: Summaries | None,
) -> tuple[CompactResult, dict[str, Any] | None, bytes | None]:
    """The compacted request; ``body`` with the restore tool when the request carries it;
    and the result as OpenAI chat JSON when it was encoded (to look for refs in it).

    The tool is part of the request the pipeline budgets, marks and compares with the
    previous one: kept from the conversation's record; offered from the conversation's
    first request when it brings tools of its own (``Settings.restore_tool``); else, the
    first time the request names an offloaded object, added and the pipeline run again
    over it (once per conversation), so that it is counted and its cache break is
    predicted. A request that fits only without it goes without it rather than be
    refused."""
    first = state is None or state.calls == 0
    offered = (state is not None and state.restore_tool) or (
        first and bool(body.get("tools")) and gateway.settings.restore_tool == "from_start"
    )
    if offered:
        tooled = with_restore_tool(body)
        if tooled is not None:
            result = await _fitted(
                gateway, tooled, policy, state, namespace, conversation, summaries
            )
            if result is not None:
                return result, tooled, None
    result = await _compact(gateway, body, policy, state, namespace, conversation, summaries)
    if offered:
        return result, None, None
    content = raw if raw is not None and not result.changed else orjson.dumps(result.request)
    added = with_restore_tool(body) if has_refs(content) else None
    if added is None:
        return result, None, content
    with _tracer.start_as_current_span("contextgate.restore_tool"):
        again = await _fitted(gateway, added, policy, state, namespace, conversation, summaries)
    if again is None:
        return result, None, content
    return again, added, None


async def _fitted(
    gateway: Gateway,
    body: dict[str, Any],
    policy: Policy,
    state: ConversationState | None,
    namespace: str,
    conversation: str,
    summaries: Summaries | None,
) -> CompactResult | None:
    """``_compact``, or ``None`` when the request cannot be made to fit its budget."""
    try:
        return await _compact(gateway, body, policy, state, namespace, conversation, summaries)
    except RequestRejectedError as exc:
        if exc.code == "context_length_exceeded":
            return None
        raise


async def _compact(
    gateway: Gateway,
    body: dict[str, Any],
    policy: Policy,
    state: ConversationState | None,
    namespace: str,
    conversation: str,
    summaries: Summaries | None = None,
) -> CompactResult:
    try:
        return await gateway.pipeline.compact(
            body,
            policy=policy,
            state=state,
            namespace=namespace,
            conversation=conversation,
            store=gateway.stores.for_request(),
            summaries=summaries,
        )
    except RequestRejected as exc:
        raise RequestRejectedError(str(exc), code=exc.code, param=exc.param) from exc
