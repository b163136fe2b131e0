"""A client request as its route hands it to the context work, and where it goes upstream.

A route reads the request off the wire (``gateway.routes.calls``) and passes a ``Call`` and
the parsed body down: below the routes nothing sees Litestar, the application's state or
the ASGI scope. The provider and the key a model's requests go to are resolved once, into
a ``Target`` the request carries (``Services.target``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from litestar.types import Receive

from gateway.breaker import CircuitBreaker
from gateway.config import Settings
from gateway.context.record import RequestRecord
from gateway.providers.anthropic import AnthropicUpstream
from gateway.providers.openai import ChatUpstream
from gateway.store import Stores
from gateway.summaries.service import SummaryService
from gateway.telemetry.metrics import Metrics
from gateway.tenancy.auth import Caller
from pipelines import ConversationState, Pipeline

__all__ = ["Call", "Services", "Target"]


@dataclass(slots=True)
class Call:
    """One client request, read off the wire, its caller known.

    Like ``Target`` and ``gateway.context.compaction.ChatRequest``, made for every request
    and never changed once made, but not frozen: a frozen class's ``__init__`` sets each
    field through ``object.__setattr__``, four times the work of a plain one's (together
    about 30,000 instructions of a small request)."""

    headers: Mapping[str, str]
    """The client's headers (lower-case names)."""
    caller: Caller
    record: RequestRecord
    receive: Receive
    """The ASGI ``receive`` of the client's connection: read to notice the client leaving."""
    started: float
    """``time.perf_counter()`` when the route began: the gateway's own time counts from it."""

    @property
    def request_id(self) -> str:
        return self.record.request_id


@dataclass(slots=True)
class Target:
    """Where one model's requests go for one caller: the provider, and the headers to send
    them with (the key chosen: the caller's, the tenant's, or the deployment's)."""

    model: str
    provider: ChatUpstream | AnthropicUpstream
    headers: dict[str, str]

    @property
    def anthropic(self) -> AnthropicUpstream | None:
        """The Anthropic provider, when it is the one."""
        return self.provider if isinstance(self.provider, AnthropicUpstream) else None


class Services(Protocol):
    """What the context work needs of the process: ``gateway.runtime.Gateway`` is one."""

    @property
    def settings(self) -> Settings: ...

    @property
    def pipeline(self) -> Pipeline: ...

    @property
    def stores(self) -> Stores: ...

    @property
    def summaries(self) -> SummaryService: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def summary_breaker(self) -> CircuitBreaker: ...

    @property
    def structured_refused(self) -> set[str]: ...

    def upstream_for(self, model: str) -> ChatUpstream | AnthropicUpstream:
        """The provider ``model``'s requests go to."""
        ...

    def target(self, caller: Caller, model: str, headers: Mapping[str, str]) -> Target:
        """Where ``caller``'s requests for ``model`` go (``InvalidRequest`` when no key
        may be sent there)."""
        ...

    def remember(self, namespace: str, conversation: str, state: ConversationState) -> None:
        """Store a conversation's record in the background."""
        ...
