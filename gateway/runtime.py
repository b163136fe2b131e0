"""The process's parts, built once and held for its lifetime: the settings, the pipeline,
the stores, the providers, the tenants and limits, the summary service, the metrics; warmed
after start-up (``warm``) and closed at shutdown. Routes reach them through the
application's state (``gateway.routes.calls.runtime_of``); below the routes each gets the
parts it needs."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import httpx

from gateway.breaker import CircuitBreaker
from gateway.config import Settings
from gateway.context.call import Target
from gateway.context.ledger import LedgerWriter
from gateway.edge.drain import Draining
from gateway.edge.overload import Shedder
from gateway.errors import InvalidRequest
from gateway.http.forwarding import upstream_request_headers
from gateway.providers.anthropic import AnthropicUpstream
from gateway.providers.openai import ChatUpstream, Upstream
from gateway.store import Stores
from gateway.summaries.service import SummaryService
from gateway.telemetry.metrics import Metrics
from gateway.tenancy.auth import Caller
from gateway.tenancy.limits import Limiter
from gateway.tenancy.tenants import Tenants
from pipelines import ConversationState, ModelCatalog, Pipeline, Policy

if TYPE_CHECKING:
    import httpx2

__all__ = ["TRIM_OVER", "TRIM_TICK", "Gateway", "one_malloc_arena"]

log = logging.getLogger("contextgate")

_WARM_REQUEST: Final = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Hi"}]}
TRIM_TICK: Final = 0.5
"""Seconds between the idle trim's looks at the process (``Gateway._trim_when_idle``): it
trims at the second look in a row that finds nothing in flight, so 0.5-1 s after a burst."""
TRIM_OVER: Final = 8 * 1024 * 1024
"""Bytes RSS must have grown by since the last trim for the next to be worth making."""
_PAGE: Final = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_M_ARENA_MAX: Final = -8
"""``mallopt``'s parameter for the most arenas glibc's allocator makes (``malloc.h``)."""


def _resident() -> int:
    """The process's RSS in bytes (0 where ``/proc`` cannot be read)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except OSError:
        return 0


def _glibc(name: str) -> Callable[..., int] | None:
    """glibc's function ``name`` (``int`` arguments, an ``int`` back), where the C library
    is glibc."""
    try:
        function: Callable[..., int] = getattr(ctypes.CDLL("libc.so.6"), name)
    except (OSError, AttributeError):
        return None
    return function


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, where the C library is glibc."""
    return _glibc("malloc_trim")


def one_malloc_arena() -> bool:
    """Have glibc's allocator serve every thread of the process from one arena (its main
    one), unless ``MALLOC_ARENA_MAX`` is set (the operator's choice stands); whether it was
    done. For a process to call before it starts threads (``contextgate serve``).

    By default each thread that allocates gets an arena of its own (up to eight per core),
    whose free memory serves only the threads of that arena. The warm-up builds the
    o200k_base encoding in a worker thread (so the event loop stays free): built there its
    tables held 47.6 MiB after a collection and ``malloc_trim``, 43.0 MiB built on the main
    thread or with one arena; the worker threads that count large requests, the Anthropic
    SDK's import and uvloop's name lookups add arenas of their own. Python's own small
    objects do not come from these arenas, and a thread's small allocations are served
    from its own cache without the arena's lock: two threads counting 1 MB of text while
    the loop's thread allocated took the same time with one arena as with eight (within
    this machine's noise)."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    mallopt = _glibc("mallopt")
    return mallopt is not None and bool(mallopt(_M_ARENA_MAX, 1))


@dataclass(slots=True)
class Gateway:
    """The long-lived parts of one gateway process."""

    settings: Settings
    pipeline: Pipeline
    upstream: Upstream
    default_policy: Policy
    stores: Stores
    tenants: Tenants
    summaries: SummaryService
    anthropic: AnthropicUpstream
    limiter: Limiter
    metrics: Metrics
    shedder: Shedder
    summary_breaker: CircuitBreaker = field(default_factory=lambda: CircuitBreaker(3, 30.0))
    """Summaries pause for 30 s after 3 failures in a row (then one probes)."""
    structured_refused: set[str] = field(default_factory=set)
    """Models whose provider refused structured output for summaries."""
    draining: Draining = field(default_factory=Draining)
    """Shutdown state: started on SIGTERM by ``gateway.edge.server.DrainingServer``."""
    ledger: LedgerWriter | None = None
    """Writes each request's ledger entry (``None`` with the inspector off)."""
    _writes: set[asyncio.Task[None]] = field(default_factory=set)
    _warming: asyncio.Task[None] | None = None
    _trimming: asyncio.Task[None] | None = None
    _warm_failed: bool = False

    def __post_init__(self) -> None:
        self.metrics.watch(self.stores, self.summaries, self.shedder)

    def upstream_for(self, model: str) -> ChatUpstream | AnthropicUpstream:
        """Where requests for ``model`` go: the built-in Anthropic provider for Anthropic
        model names (``claude-*``, no provider prefix: ``anthropic/claude-...`` is a
        router's name and goes to the OpenAI-compatible upstream), unless it is disabled;
        the OpenAI-compatible upstream else."""
        if (
            self.settings.anthropic.enabled
            and model.startswith("claude")
            and self.pipeline.catalog.lookup(model).family == "anthropic"
        ):
            return self.anthropic
        return self.upstream

    def target(self, caller: Caller, model: str, headers: Mapping[str, str]) -> Target:
        """Where ``caller``'s requests for ``model`` go, with the client's ``headers`` as
        they are sent there (the key chosen by ``upstream_key``)."""
        provider = self.upstream_for(model)
        sent = upstream_request_headers(headers.items(), self.upstream_key(caller, model))
        sent["content-type"] = "application/json"
        return Target(model, provider, sent)

    def upstream_key(self, caller: Caller, model: str) -> str | None:
        """The key to send instead of the caller's for ``model`` (``None``: the caller's
        own). The Anthropic provider gets the tenant's or the global Anthropic key, or in
        passthrough mode the caller's own key; never the OpenAI upstream's key nor a
        tenant's gateway key."""
        if self.upstream_for(model) is not self.anthropic:
            return caller.upstream_key
        if caller.profile.anthropic_api_key:
            return caller.profile.anthropic_api_key
        if caller.tenant is not None:
            raise InvalidRequest(
                f"{model} is served by Anthropic, and this gateway has no Anthropic key"
                " for this tenant (anthropic.api_key, or the tenant's anthropic_api_key)",
                code="provider_not_configured",
                param="model",
            )
        return None

    def remember(self, namespace: str, conversation: str, state: ConversationState) -> None:
        """Store a conversation's record in the background (the answer is not held up)."""
        task = asyncio.get_running_loop().create_task(
            self.stores.conversations.put(namespace, conversation, state)
        )
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    @classmethod
    def build(
        cls,
        settings: Settings,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        anthropic_transport: httpx2.AsyncBaseTransport | None = None,
    ) -> Gateway:
        catalog = ModelCatalog().extended(settings.models, settings.prices)
        stores = Stores.build(settings)
        metrics = Metrics()
        inspector = settings.inspector
        return cls(
            settings=settings,
            pipeline=Pipeline(catalog=catalog, store=stores.objects),
            upstream=Upstream(settings.upstream, transport=transport),
            default_policy=settings.default_policy(),
            stores=stores,
            tenants=Tenants(settings),
            limiter=Limiter(stores.redis, metrics),
            metrics=metrics,
            shedder=Shedder(settings.max_in_flight, settings.max_queue_delay),
            anthropic=AnthropicUpstream(
                settings.anthropic, settings.upstream, transport=anthropic_transport
            ),
            summaries=SummaryService(
                stores.conversations,
                stores.objects,
                workers=settings.summary_workers,
                queue_size=settings.summary_queue,
            ),
            ledger=(
                LedgerWriter(
                    stores.ledger,
                    catalog,
                    anonymous=inspector.anonymous,
                    detailed=inspector.detailed_requests > 0,
                )
                if inspector.enabled
                else None
            ),
        )

    def start(self) -> None:
        """At start-up, before the port opens: move everything built so far out of the
        garbage collector's view (collections triggered by large request bodies do not
        rescan it) and start the shedder's probe. What only some requests need is loaded
        later (``warm``)."""
        gc.collect()
        gc.freeze()
        self.shedder.start()

    def warm(self) -> None:
        """Right after the port opens, in the background: load what the first requests
        would otherwise wait for, so that the first costs about what a warm one does (the
        o200k_base encoding, which counts every OpenAI-family model's tokens, and a first
        pass through the pipeline; the Anthropic SDK where an Anthropic key is configured,
        else at the first Claude request; cl100k_base, for older models only, at its
        first use). The loading runs in worker threads, so requests are served meanwhile,
        each waiting only for what it needs."""
        if self._warming is None:
            loop = asyncio.get_running_loop()
            self._warming = loop.create_task(self._warm())
            self._trimming = loop.create_task(self._trim_when_idle())

    @property
    def warmed(self) -> bool:
        """Whether ``warm`` has loaded what it loads (a failed warm-up is logged, and what
        it did not load is loaded by the first request that needs it)."""
        task = self._warming
        return task is not None and task.done() and not task.cancelled() and not self._warm_failed

    async def _warm(self) -> None:
        try:
            await self.pipeline.counter("o200k_base").ready()
            # One small request through the pipeline, in process: the first time through
            # its stages costs about twice a later time (the first client's request would
            # pay it otherwise), and the stages' metrics are made ready. Nothing is sent,
            # stored or recorded.
            warmed = await self.pipeline.compact(_WARM_REQUEST)
            self.metrics.expect(warmed.report)
            if self.settings.anthropic.enabled and (
                self.settings.anthropic.api_key
                or any(tenant.anthropic_api_key for tenant in self.settings.tenants)
            ):
                await self.anthropic.load()
        except Exception:
            log.exception("the warm-up failed; the first requests will load what they need")
            self._warm_failed = True
            return
        # What the loading made out of the collector's view, as at start-up, unless requests
        # are in flight: a collection now would hold the loop up (0.1 s after the SDK's
        # import), and freezing would keep their cycles for good.
        if self.draining.in_flight == 0:
            gc.collect()
            gc.freeze()

    async def _trim_when_idle(self) -> None:
        """Once a burst is over, hand the allocator's free memory back to the system
        (glibc's ``malloc_trim``; nothing elsewhere): after a run of large requests the C
        allocator keeps the pages it freed, and the process's RSS would stay at the burst's
        peak (about 20 MiB above what it holds after a run of 100K-token requests at 16
        connections); a trim takes about a millisecond. Every ``TRIM_TICK`` the process is
        looked at; it is trimmed when two looks in a row found no request in flight (so a
        single pause between two requests of steady traffic is not taken for the end of a
        burst; two such pauses 0.5 s apart cost one early trim, a millisecond) and RSS
        has grown by ``TRIM_OVER`` since the last trim: below that there is little to give
        back, and the pages given back are faulted in again by the next requests."""
        trim = _malloc_trim()
        if trim is None:
            return
        if self._warming is not None:
            await asyncio.wait((self._warming,))
        # What the warm-up loads is kept, what it freed is given back now: building the
        # o200k tables frees their Python copy and leaves about 4 MiB of the C heap free
        # (a process at rest held 101 MiB without this trim, 97 MiB with it).
        trim(0)
        floor = _resident()
        idle = False
        while True:
            await asyncio.sleep(TRIM_TICK)
            was_idle, idle = idle, self.draining.in_flight == 0
            if was_idle and idle and _resident() - floor >= TRIM_OVER:
                trim(0)
                floor = _resident()

    async def aclose(self) -> None:
        for task in (self._warming, self._trimming):
            if task is not None:
                task.cancel()
        self.shedder.stop()
        await self.summaries.aclose()
        if self.ledger is not None:
            await self.ledger.aclose()
        if self._writes:
            await asyncio.wait(self._writes, timeout=1.0)
        await self.upstream.aclose()
        await self.anthropic.aclose()
        await self.stores.aclose()
