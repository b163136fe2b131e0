"""A client's chat request compacted under its policy: the pipeline run over it.

Shared by the chat, Messages and Responses routes (HTTP and WebSocket), which then send
the result (``gateway.context.answer``, or the WebSocket itself), and by the dry runs
(``POST /v1/context/compact``, ``count_tokens``), which return or count it. The request's
policy (its tenant's, tuned by its header), where it goes (its ``Target``), what its
native ``context_management`` gets (``gateway.context.native_request``: the plan, the
policy stepped back, a compaction block of the gateway's expanded, and the client's
compaction made once due), its conversation's identity and record and its summary
model's client are decided here. So is the gateway's restore tool, so that the pipeline
budgets it and sees it as the provider will (``_compact_with_restore_tool``).
``recompact`` serves the overflow retry: when the upstream says the request was too long
for its window anyway, the same request is compacted again (deterministically) to half
of its budget or of its size, whichever is less, under the same native plan, the
compaction block made anew for what goes up then.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

import orjson
from opentelemetry import trace

from gateway.context.call import Call, Services, Target
from gateway.context.compaction_block import compaction_policy
from gateway.context.native_request import (
    checkpointed,
    compaction_block_for,
    compaction_due,
    edited_tokens,
    native_request,
)
from gateway.context.restore import has_refs, with_restore_tool
from gateway.errors import Forbidden, InvalidRequest, RequestRejectedError
from gateway.http.headers import POLICY_HEADER, policy_from_header
from gateway.summaries.model import chat_post
from gateway.summaries.summarizer import UpstreamSummarizer
from gateway.tenancy.auth import Caller
from pipelines import (
    CompactResult,
    ConversationState,
    Policy,
    RequestRejected,
    conversation_id,
)
from pipelines.budget import BUDGET_FLOOR
from pipelines.native import NativePlan
from pipelines.ports import Rendering, Summaries

__all__ = [
    "CONVERSATION_HEADER",
    "ChatRequest",
    "compact",
    "recompact",
    "refuse_upstream_choice",
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


@dataclass(slots=True)
class ChatRequest:
    """A parsed chat request and what the pipeline made of it; never changed once made
    (``dataclasses.replace`` makes another), not frozen only for the cost of a frozen
    class's ``__init__`` (``gateway.context.call.Call``)."""

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
    target: Target | None
    """Where the request goes (``None`` for a dry run)."""
    restore_tool: bool = False
    """Whether ``body`` (and so the request sent) carries the gateway's restore tool."""
    content: bytes | None = None
    """``result.request`` as OpenAI chat JSON, when it was encoded already (to look for
    refs in it): the body as received when no stage changed it."""
    render: Rendering | None = None
    """How a run of removed messages is stored (``None``: as chat JSON)."""
    history_seen: bool = True
    """Whether the request carries its whole history (not one the upstream keeps): only
    then may it be compacted, the overflow retry included."""
    native: NativePlan | None = None
    """What the request's native context management asks of the gateway
    (``gateway.context.native``)."""
    compaction: dict[str, Any] | None = None
    """The ``compaction`` block the answer begins with, when the gateway made the
    client's ``compact_20260112`` on this request (``gateway.context.compaction_block``)."""

    @property
    def rewritten(self) -> bool:
        """Whether what goes up differs from what the client sent in more than cache
        markers (which change no prompt): a stage other than ``cache_markers`` changed it,
        or it carries the restore tool."""
        return self.restore_tool or any(
            name != "cache_markers" for name in self.result.report.actions
        )


async def compact(
    services: Services,
    call: Call,
    body: dict[str, Any],
    *,
    raw: bytes | None = None,
    dry_run: bool = False,
    restore_tool: bool = True,
    history_seen: bool = True,
    render: Rendering | None = None,
    native_api: Literal["messages", "chat", "responses"] | None = None,
    management: Any = None,
) -> ChatRequest:
    """``body``, an OpenAI chat request (as received in ``raw`` when it came as one),
    compacted under its policy, with where it goes (``ChatRequest.target``, resolved here
    once). A ``dry_run`` resolves no target and asks no model for a summary (a checkpoint
    already prepared is used). Without ``restore_tool`` (a client API whose wire has no
    restore loop) the gateway's tool is never added. Without ``history_seen`` (a request
    that continues a history the upstream keeps) the request is kept to hygiene (policy
    mode ``off``): what the gateway cannot see, it cannot compact. ``render`` stores a
    run of removed messages in the client's own form (``pipelines.ports.Rendering``).
    ``native_api`` names the client API whose ``context_management`` the request may
    carry (``gateway.context.native``): Anthropic's edits in the body (Messages to Claude:
    the upstream applies them; anywhere else the gateway does), or on the Responses API
    ``management``, the body's list."""
    caller = call.caller
    call.record.read(body)
    refuse_upstream_choice(body)
    policy = policy_from_header(
        call.headers.get(POLICY_HEADER), caller.profile.policy, caller.profile.bounds
    )
    if not history_seen:
        # No compaction, and no prompt_cache_key of the gateway's: its conversation id,
        # hashed from what the request shows, would change every turn.
        policy = replace(policy, mode="off", cache_markers=False)
    model = str(body.get("model", ""))
    _check_models(caller, model, policy)
    target = None if dry_run else services.target(caller, model, call.headers)
    native, policy, body, kept = await native_request(
        services, call, native_api, body, management, policy, target, history_seen, dry_run
    )
    namespace = caller.namespace
    if kept is not None and CONVERSATION_HEADER not in call.headers:
        conversation = kept  # a checkpoint of the gateway's stood for the history
    else:
        conversation = _conversation(call.headers, namespace, body)
    state = await services.stores.conversations.get(namespace, conversation)
    summaries = None
    if services.settings.summaries and policy.mode == "summarize":
        summarizer = None if dry_run else _summarizer(services, call, policy, model, target)
        summaries = services.summaries.bind(
            namespace, conversation, summarizer, policy.summary_timeout
        )
    if restore_tool:
        result, tooled, content = await _compact_with_restore_tool(
            services, raw, body, policy, state, namespace, conversation, summaries, render, native
        )
    else:
        result = await _compact(
            services, body, policy, state, namespace, conversation, summaries, render, native
        )
        tooled, content = None, None
    compaction = None
    due = compaction_due(native, result) if native_api == "messages" else None
    if due is not None and history_seen and not dry_run:
        # A dry run (count_tokens) makes no new compaction, as the API's count does not.
        policy = compaction_policy(policy, edited_tokens(result), due.trigger)
        result, tooled, content = await _compact_with_restore_tool(
            services, raw, body, policy, state, namespace, conversation, summaries, render, native
        )
        compaction = await compaction_block_for(services, namespace, conversation, policy, result)
        if compaction is not None:
            result = checkpointed(result)
    return ChatRequest(
        raw,
        tooled or body,
        policy,
        result,
        namespace,
        conversation,
        state,
        caller,
        target,
        restore_tool=tooled is not None,
        content=content,
        render=render,
        history_seen=history_seen,
        native=native,
        compaction=compaction,
    )


def _summarizer(
    services: Services, call: Call, policy: Policy, model: str, target: Target | None
) -> UpstreamSummarizer | None:
    """The summary model's client (``policy.summary_model``, else the request's model), or
    ``None`` when no credentials may be sent there: then checkpoints only."""
    name = policy.summary_model or model
    if target is None or name != model:
        try:
            target = services.target(call.caller, name, call.headers)
        except InvalidRequest:
            return None
    catalog = services.pipeline.catalog
    return UpstreamSummarizer(
        chat_post(target.provider, target.headers, lambda m: catalog.lookup(m).output_reserve),
        timeout=policy.summary_timeout,
        breaker=services.summary_breaker,
        plain=services.structured_refused,
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


async def recompact(services: Services, chat: ChatRequest) -> ChatRequest | None:
    """The request compacted again (deterministically, no model call) to half of what
    the upstream just refused: half its budget, or half its size when that is smaller, as
    the upstream's window is evidently not what the catalog says. None when that would go
    under the budget floor or change nothing."""
    report = chat.result.report
    budget = min(report.budget, report.tokens_after) // 2
    if budget < BUDGET_FLOOR or not chat.history_seen:
        return None
    policy = replace(chat.policy, max_input=budget, mode="truncate")
    result = await _compact(
        services,
        chat.body,
        policy,
        chat.state,
        chat.namespace,
        chat.conversation,
        render=chat.render,
        native=chat.native,
    )
    if result.request == chat.result.request:
        return None
    compaction = chat.compaction
    if compaction is not None:  # the checkpoint is what goes up now
        compaction = await compaction_block_for(
            services, chat.namespace, chat.conversation, policy, result
        )
        if compaction is not None:
            result = checkpointed(result)
    return replace(chat, policy=policy, result=result, content=None, compaction=compaction)


def _conversation(headers: Mapping[str, str], namespace: str, body: dict[str, Any]) -> str:
    header = headers.get(CONVERSATION_HEADER)
    if header is None:
        session = ""
        for name in SESSION_HEADERS:
            if name in headers:
                session = headers[name]
                break
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
    services: Services,
    raw: bytes | None,
    body: dict[str, Any],
    policy: Policy,
    state: ConversationState | None,
    namespace: str,
    conversation: str,
    summaries: Summaries | None,
    render: Rendering | None = None,
    native: NativePlan | None = None,
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
        first and bool(body.get("tools")) and services.settings.restore_tool == "from_start"
    )
    if offered:
        tooled = with_restore_tool(body)
        if tooled is not None:
            result = await _fitted(
                services, tooled, policy, state, namespace, conversation, summaries, render, native
            )
            if result is not None:
                return result, tooled, None
    result = await _compact(
        services, body, policy, state, namespace, conversation, summaries, render, native
    )
    if offered:
        return result, None, None
    content = raw if raw is not None and not result.changed else orjson.dumps(result.request)
    added = with_restore_tool(body) if has_refs(content) else None
    if added is None:
        return result, None, content
    with _tracer.start_as_current_span("contextgate.restore_tool"):
        again = await _fitted(
            services, added, policy, state, namespace, conversation, summaries, render, native
        )
    if again is None:
        return result, None, content
    return again, added, None


async def _fitted(
    services: Services,
    body: dict[str, Any],
    policy: Policy,
    state: ConversationState | None,
    namespace: str,
    conversation: str,
    summaries: Summaries | None,
    render: Rendering | None = None,
    native: NativePlan | None = None,
) -> CompactResult | None:
    """``_compact``, or ``None`` when the request cannot be made to fit its budget."""
    try:
        return await _compact(
            services, body, policy, state, namespace, conversation, summaries, render, native
        )
    except RequestRejectedError as exc:
        if exc.code == "context_length_exceeded":
            return None
        raise


async def _compact(
    services: Services,
    body: dict[str, Any],
    policy: Policy,
    state: ConversationState | None,
    namespace: str,
    conversation: str,
    summaries: Summaries | None = None,
    render: Rendering | None = None,
    native: NativePlan | None = None,
) -> CompactResult:
    try:
        return await services.pipeline.compact(
            body,
            policy=policy,
            state=state,
            namespace=namespace,
            conversation=conversation,
            store=services.stores.for_request(),
            summaries=summaries,
            render=render,
            native=native,
        )
    except RequestRejected as exc:
        raise RequestRejectedError(str(exc), code=exc.code, param=exc.param) from exc
