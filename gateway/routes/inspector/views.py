"""What the inspector's pages show, made from the ledger's rows and entries
(``gateway.store.ledger``; their shape is ``docs/API.md``'s): the figures a person reads,
each worked out once here so that the templates only lay them out.

The ledger is read leniently: a field missing or of another type shows as unknown, never
as a guess and never as an error page. Costs are the ledger's estimates; a request
without a price is unknown, and a conversation priced for only some of its requests says
so (its sums cover those only).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gateway.store import REF_PATTERN
from pipelines.summary import FIELDS

__all__ = [
    "SUMMARY_FIELDS",
    "Cost",
    "MessageRow",
    "RequestRow",
    "Row",
    "Side",
    "cost_of_entry",
    "cost_of_row",
    "message_rows",
    "number",
    "segments",
    "summary_fields",
]

SUMMARY_FIELDS: Final = tuple((name, name.replace("_", " ").capitalize()) for name in FIELDS)
"""The summary checkpoint's 11 fields, in the order the summarizer writes them, with the
titles the page gives them."""


def number(value: Any) -> float | None:
    """``value`` when it is a number (not a bool), else ``None``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


@dataclass(frozen=True, slots=True)
class Cost:
    """What requests cost with the gateway and would have without it (US dollars)."""

    with_gateway: float | None
    without: float | None
    priced: int = 1
    """How many of the requests had a price (the sums cover those only)."""
    requests: int = 1

    @property
    def known(self) -> bool:
        return self.with_gateway is not None and self.without is not None and self.priced > 0

    @property
    def partial(self) -> bool:
        """Priced for some requests only."""
        return self.known and self.priced < self.requests

    @property
    def saved(self) -> float | None:
        if self.with_gateway is None or self.without is None or not self.known:
            return None
        return self.without - self.with_gateway

    @property
    def saved_share(self) -> float | None:
        saved = self.saved
        return saved / self.without if saved is not None and self.without else None


def cost_of_row(row: Mapping[str, Any]) -> Cost:
    requests = int(number(row.get("requests")) or 0)
    priced = int(number(row.get("priced")) or 0)
    if not priced:
        return Cost(None, None, 0, requests)
    return Cost(number(row.get("cost_with")), number(row.get("cost_without")), priced, requests)


def cost_of_entry(entry: Mapping[str, Any]) -> Cost:
    cost = _mapping(entry.get("cost"))
    with_gateway, without = number(cost.get("with")), number(cost.get("without"))
    priced = int(with_gateway is not None and without is not None)
    return Cost(with_gateway, without, priced, 1)


@dataclass(frozen=True, slots=True)
class Row:
    """A conversation as its line in the list and its heading on the timeline."""

    id: str
    title: str
    model: str
    api: str
    requests: int
    client_tokens: float | None
    upstream_tokens: float | None
    cost: Cost
    hit_rate: float | None
    """Share of the provider's input tokens read from its cache; ``None`` without usage."""
    compactions: int
    cache_breaks: int
    restores: int
    first_at: float | None
    last_at: float | None

    @property
    def reduction(self) -> float | None:
        """Share of the client's tokens that did not go up."""
        client, upstream = self.client_tokens, self.upstream_tokens
        if not client or upstream is None:
            return None
        return 1 - upstream / client

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> Row:
        inputs, cached = number(row.get("input_tokens")), number(row.get("cached_tokens"))
        title = row.get("title")
        return cls(
            id=str(row.get("id", "")),
            title=title if isinstance(title, str) and title.strip() else "",
            model=str(row.get("model") or ""),
            api=str(row.get("api") or ""),
            requests=int(number(row.get("requests")) or 0),
            client_tokens=number(row.get("client_tokens")),
            upstream_tokens=number(row.get("upstream_tokens")),
            cost=cost_of_row(row),
            hit_rate=(cached or 0) / inputs if inputs else None,
            compactions=int(number(row.get("compactions")) or 0),
            cache_breaks=int(number(row.get("cache_breaks")) or 0),
            restores=int(number(row.get("restores")) or 0),
            first_at=number(row.get("first_at")),
            last_at=number(row.get("last_at")),
        )


@dataclass(frozen=True, slots=True)
class RequestRow:
    """A request as its line in the timeline's table and its page's heading."""

    id: str
    at: float | None
    api: str
    model: str
    status: float | None
    client: float | None
    upstream: float | None
    acted: list[str]
    """The stages that changed the request."""
    failed: list[str]
    """The stages that raised (and were skipped)."""
    compaction: bool
    verdict: str
    reason: str
    cost: Cost
    restores: int

    @classmethod
    def of(cls, entry: Mapping[str, Any]) -> RequestRow:
        tokens, cache = _mapping(entry.get("tokens")), _mapping(entry.get("cache"))
        stages = [_mapping(stage) for stage in entry.get("stages") or ()]
        return cls(
            id=str(entry.get("id", "")),
            at=number(entry.get("at")),
            api=str(entry.get("api") or ""),
            model=str(entry.get("model") or ""),
            status=number(entry.get("status")),
            client=number(tokens.get("client")),
            upstream=number(tokens.get("upstream")),
            acted=[str(s.get("name")) for s in stages if s.get("changed") and not s.get("error")],
            failed=[str(s.get("name")) for s in stages if s.get("error")],
            compaction=entry.get("compaction") is True,
            verdict=str(cache.get("verdict") or ""),
            reason=str(cache.get("reason") or ""),
            cost=cost_of_entry(entry),
            restores=int(number(_mapping(entry.get("restores")).get("calls")) or 0),
        )


@dataclass(frozen=True, slots=True)
class Side:
    """One side of a message's row: the start of its text, and how long it was."""

    text: str
    chars: int

    @property
    def cut(self) -> bool:
        """Whether the ledger kept only the start of the text."""
        return self.chars > len(self.text)

    @classmethod
    def of(cls, side: Any) -> Side | None:
        if not isinstance(side, Mapping):
            return None
        text = side.get("text")
        text = text if isinstance(text, str) else ""
        return cls(text, int(number(side.get("chars")) or len(text)))


@dataclass(frozen=True, slots=True)
class MessageRow:
    fate: str
    role: str
    client: Side | None
    upstream: Side | None
    refs: tuple[str, ...]

    @property
    def unshown_refs(self) -> tuple[str, ...]:
        """The refs this message names that its shown text does not (they were cut)."""
        shown = self.upstream.text if self.upstream is not None else ""
        return tuple(ref for ref in self.refs if ref not in shown)


_FATES: Final = frozenset({"kept", "shortened", "offloaded", "pruned", "summarised", "added"})


def message_rows(detail: Mapping[str, Any]) -> list[MessageRow]:
    """The detail's messages, what the client sent beside what went up."""
    rows = []
    for message in detail.get("messages") or ():
        if not isinstance(message, Mapping):
            continue
        fate = str(message.get("fate"))
        refs = message.get("refs")
        refs = refs if isinstance(refs, list) else []
        rows.append(
            MessageRow(
                fate=fate if fate in _FATES else "kept",
                role=str(message.get("role") or ""),
                client=Side.of(message.get("client")),
                upstream=Side.of(message.get("upstream")),
                refs=tuple(ref for ref in refs if isinstance(ref, str)),
            )
        )
    return rows


def segments(text: str) -> list[tuple[str, bool]]:
    """``text`` cut at the refs it names: ``(part, is_ref)`` in order, so that each ref
    can be shown as a link and the rest as text."""
    found: list[tuple[str, bool]] = []
    at = 0
    for match in REF_PATTERN.finditer(text):
        if match.start() > at:
            found.append((text[at : match.start()], False))
        found.append((match.group(), True))
        at = match.end()
    if at < len(text):
        found.append((text[at:], False))
    return found


def summary_fields(summary: Mapping[str, Any]) -> list[tuple[str, list[str]]]:
    """The checkpoint's fields, labelled, each as a list of lines (empty when unset)."""
    fields = _mapping(summary.get("fields"))
    shown = []
    for name, label in SUMMARY_FIELDS:
        value = fields.get(name)
        if isinstance(value, str):
            lines = [value] if value.strip() else []
        elif isinstance(value, Sequence):
            lines = [item if isinstance(item, str) else repr(item) for item in value]
        else:
            lines = []
        shown.append((label, lines))
    return shown
