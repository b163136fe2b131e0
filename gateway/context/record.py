"""What one HTTP request did, recorded on its way through the gateway.

The access log creates the request's ``RequestRecord`` before anything else runs and keeps
it in the request's ASGI state (``scope["state"]``, Litestar's ``request.state``) under
``RECORD``; whoever learns something about the request writes it there, and the access log
reads it all once the response is over, for the request's metrics, its log line and its
ledger entry (``gateway.context.ledger``):

=============  ==========================  =============================================
field          written by                  what
=============  ==========================  =============================================
request_id     ``gateway.edge.access``     the request's id
at             ``gateway.edge.access``     when it came
caller         ``gateway.edge.admission``  who is calling (its tenant)
model, stream  the route                   from the request's body (``read``)
report         ``context.exchange``        the pipeline's report of what went up
chat           ``context.exchange``        the compacted request (for the ledger)
restores       ``context.exchange``        the restore loop's counts, when it ran
attempts       ``context.exchange``        upstream attempts, overflow retries included
usage          ``context.exchange``        the upstream's usage, on success
cache_break    ``context.exchange``        the cache break judged with it
drained        ``gateway.edge.drain``      ended by the shutdown deadline
=============  ==========================  =============================================
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from gateway.tenancy.auth import Caller
from pipelines import Report

__all__ = ["RECORD", "RequestRecord", "new_request_id", "record_of"]

RECORD: Final = "record"
"""The record's key in a request's ASGI state."""


def new_request_id() -> str:
    return "cg-" + secrets.token_hex(12)


@dataclass(slots=True)
class RequestRecord:
    """One HTTP request's account of itself (see the module's table)."""

    request_id: str
    at: float = field(default_factory=time.time)
    """When the request came (seconds since the epoch)."""
    caller: Caller | None = None
    model: str | None = None
    stream: bool | None = None
    messages: Any = None
    """The body's messages, logged only when ``log_prompts`` is on."""
    report: Report | None = None
    chat: Any = None
    """The request as compacted and sent (``gateway.context.compaction.ChatRequest``,
    which this module cannot name without an import cycle): what its ledger entry is
    made from."""
    restores: Any = None
    """The restore loop's counts (``gateway.context.restore.RestoreStats``), when the
    request had the restore tool."""
    attempts: int | None = None
    answered: bool = False
    """The upstream answered with success (``usage`` is what it reported, if anything)."""
    usage: dict[str, Any] | None = None
    cache_break: str | None = None
    drained: bool = False

    def read(self, body: Mapping[str, Any]) -> None:
        """Note what the access log reports of a request's JSON body."""
        model = body.get("model")
        self.model = model if isinstance(model, str) else None
        self.stream = body.get("stream") is True
        self.messages = body.get("messages")


def record_of(state: Mapping[str, Any]) -> RequestRecord | None:
    """The record in a request's ASGI state, if the access log made one."""
    record = state.get(RECORD)
    return record if isinstance(record, RequestRecord) else None
