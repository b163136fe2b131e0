"""One request's entry in its conversation's ledger, made and written after the answer.

The exchange notes in the request's record what the ledger needs (the compacted request,
the restore loop's counts); the access log, once the response is over, hands the record to
``LedgerWriter.write``, which makes the entry in a task of its own and adds it to the
store's ledger (``gateway.store.ledger``), off the request's path. The entry's shape, which
the JSON API returns as it is, is in ``docs/API.md``:

- the summary: when, which route and API, model, tenant, the tokens the client sent and
  those that went up, the budget and its thresholds, each stage's action, the refs named
  in what went up that the client did not send (which stage wrote them on this request and
  how big, what they stand for), the summary checkpoint applied, the
  native context-management edits, the cache's verdict with the provider's counts, the
  estimated cost with the gateway and without it, the restore calls the model made;
- the detail: the messages the client sent beside those that went up, each with its fate
  (kept, shortened, offloaded, pruned, summarised, added), kept for the latest requests.

The messages are matched by identity (a stage keeps what it does not change); between two
kept ones, each of the client's is paired with the next that stands for it (the same tool
call, or the same role with text that begins like the client's up to where a placeholder
of the gateway's begins; a message a placeholder replaced whole is taken for the next of
its role; a summary or note the gateway added never). What is left of the client's was
summarised if it lies inside the applied summary's span, else pruned; what is left of
what went up was added. A pair that reads the same is kept, one whose replacement names a
ref the client's did not is offloaded, any other shortened.

The cost is an estimate from the catalog's price table: with the gateway, the provider's
reported usage at its prices; without, the same, plus the tokens the gateway removed at
the request's own blend of cached and uncached input (as if the client's own, longer
request had had the same share of cache reads). A model without a price, or an answer
without usage, has no cost: unknown, never guessed.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Literal

import orjson

from gateway.context.compaction import ChatRequest
from gateway.context.record import RequestRecord
from gateway.context.restore.restorer import RestoreStats
from gateway.store.ledger import Ledger, LedgerEntry, Totals
from gateway.store.stores import ANONYMOUS, UNRESOLVED
from gateway.telemetry.metrics import cache_writes
from pipelines import ModelCatalog, Report, StageReport
from pipelines.session import usage_of
from pipelines.stage import REF_PATTERN

__all__ = ["LedgerWriter", "detail_of", "entry_of"]

log = logging.getLogger("contextgate")

TEXT_CHARS: Final = 300
"""Characters of each message the detail shows (the original is behind its ref, or in the
client's own history), fewer when the detail has many rows: ``DETAIL_TEXT_CHARS`` in all,
never under ``MIN_TEXT_CHARS`` each."""
DETAIL_TEXT_CHARS: Final = 40_000
MIN_TEXT_CHARS: Final = 80
TITLE_CHARS: Final = 120
RUN_SHOWN: Final = 6
"""Rows of one fate shown in a row at most: a longer run shows its first and last three
and one row counting the rest."""
MAX_ROWS: Final = 400
"""Rows of the detail at most (the first and the latest kept beyond it)."""
_NOTE_CHARS: Final = 160
_ADDED: Final = ("[Recalled context", "[Context note")
"""How the messages the gateway adds begin (a summary, compress's notes)."""
_PLACEHOLDER: Final = re.compile(
    r"\[(?:Shortened|Tool call arguments shortened|Identical to the output|Tool output"
    r" offloaded|Tool result of|Trimmed to save space|Archived output of|An earlier |Result"
    r" of an earlier tool call|No result was recorded|contextgate compaction|Restored media)"
)
"""How the placeholders the gateway leaves begin (the stages' in pipelines/, a compaction
block's and a restored image's in gateway/context/)."""
MAX_REFS: Final = 100
"""Refs an entry lists at most (``refs_named`` counts them all)."""
_APIS: Final = {
    "/v1/chat/completions": "chat",
    "/v1/messages": "messages",
    "/v1/responses": "responses",
}
_KINDS: Final = {
    "native_edits": "cleared tool result",
    "media": "image",
    "filter": "tool output",
    "ttl_prune": "tool result",
    "compress": "messages",
    "summarize": "messages",
}
Fate = Literal["kept", "shortened", "offloaded", "pruned", "summarised", "added"]


class LedgerWriter:
    """Makes and writes each request's ledger entry in the background."""

    __slots__ = ("_tasks", "anonymous", "catalog", "detailed", "ledger")

    def __init__(
        self, ledger: Ledger, catalog: ModelCatalog, *, anonymous: bool, detailed: bool = True
    ) -> None:
        self.ledger, self.catalog = ledger, catalog
        self.detailed = detailed
        """Whether entries carry their detail (``inspector.detailed_requests`` above 0)."""
        self.anonymous = anonymous
        """Whether requests sent without a key are entered (``inspector.anonymous``)."""
        self._tasks: set[asyncio.Task[None]] = set()

    def write(self, record: RequestRecord, method: str, route: str, status: int) -> None:
        """Write the entry of ``record``'s request (``method``: ``WS`` for a response on
        the Responses WebSocket), if it went upstream, after this returns."""
        chat = record.chat
        if not isinstance(chat, ChatRequest) or not self.keeps(chat.namespace):
            return
        api = "responses-ws" if method == "WS" else _APIS.get(route, route)
        task = asyncio.get_running_loop().create_task(self._write(chat, record, api, status))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def keeps(self, namespace: str) -> bool:
        """Whether ``namespace``'s requests are entered: never the one a request gets while
        the store's secret cannot be read (shared by every caller then), nor, unless
        asked, the one requests without a key share."""
        return namespace != UNRESOLVED and (self.anonymous or namespace != ANONYMOUS)

    async def _write(self, chat: ChatRequest, record: RequestRecord, api: str, status: int) -> None:
        try:
            entry = entry_of(chat, record, api, status, self.catalog, detailed=self.detailed)
        except Exception:  # a ledger entry must never cost more than itself
            log.exception("making a ledger entry failed", extra={"request_id": record.request_id})
            return
        namespace, conversation = chat.namespace, chat.conversation
        del chat, record  # the request's body is not held while the store is written
        await self.ledger.add(namespace, conversation, entry)

    async def aclose(self) -> None:
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=1.0)


def entry_of(
    chat: ChatRequest,
    record: RequestRecord,
    api: str,
    status: int,
    catalog: ModelCatalog,
    *,
    detailed: bool = True,
) -> LedgerEntry:
    """The ledger entry of ``record``'s request, compacted as ``chat``."""
    report = chat.result.report
    received = report.received_tokens
    usage = record.usage if record.answered else None
    prompt, cached = usage_of(usage)
    written = _int(cache_writes(usage)) if usage is not None else None
    completion = _int(usage.get("completion_tokens")) if usage is not None else None
    uncached = None if prompt is None else max(0, prompt - (cached or 0) - (written or 0))
    with_gateway, without = _cost(catalog, report, received, cached, uncached, written, completion)
    restored = record.restores.calls if isinstance(record.restores, RestoreStats) else 0
    cache = _cache(report, record.cache_break, cached, uncached, written)
    checkpoint = _checkpoint(chat)
    rows = _rows(chat, checkpoint)
    refs = _refs(report, rows)
    detail = _detail(rows) if detailed else None
    compaction = _is_compaction(chat)
    summary: dict[str, Any] = {
        "id": record.request_id,
        "at": round(record.at, 3),
        "api": api,
        "model": report.model,
        "tenant": chat.caller.tenant,
        "stream": bool(record.stream),
        "status": status,
        "attempts": record.attempts or 1,
        "tokens": {
            "client": received,
            "upstream": report.tokens_after,
            "budget": report.budget,
            "window": report.window,
            "exact": report.exact,
        },
        "thresholds": _thresholds(chat),
        "stages": [_stage(stage) for stage in report.stages],
        "refs": refs[:MAX_REFS],
        "refs_named": len(refs),
        "compaction": compaction,
        "summary": checkpoint,
        "native": report.native,
        "applied_edits": report.applied_edits,
        "cache": cache,
        "cost": {"with": with_gateway, "without": without, "currency": "USD"},
        "restores": {"calls": restored},
        "detail": detail is not None,
    }
    priced = with_gateway is not None and without is not None
    totals = Totals(
        add={
            "requests": 1,
            "client_tokens": received,
            "upstream_tokens": report.tokens_after,
            "input_tokens": prompt or 0,
            "cached_tokens": cached or 0,
            "cost_with": with_gateway or 0.0,
            "cost_without": without or 0.0,
            "priced": int(priced),
            "compactions": int(compaction),
            "cache_breaks": int(cache["verdict"] == "break"),
            "restores": restored,
        },
        latest={
            "refs": len(refs),
            "model": report.model,
            "api": api,
            "tenant": chat.caller.tenant or "",
            "last_at": summary["at"],
        },
        first={"first_at": summary["at"], "title": _title(chat.body.get("messages"))},
    )
    return LedgerEntry(
        record.request_id,
        summary["at"],
        orjson.dumps(summary),
        orjson.dumps(detail) if detail is not None else None,
        totals,
    )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _thresholds(chat: ChatRequest) -> dict[str, int]:
    policy, budget = chat.policy, chat.result.report.budget
    trigger = policy.trigger
    return {
        "prepare": round(min(policy.prepare, trigger) * budget),
        "light": round(min(policy.light, trigger) * budget),
        "trigger": round(trigger * budget),
        "emergency": round(max(policy.emergency, trigger) * budget),
        "target": round(policy.target * budget),
    }


def _stage(stage: StageReport) -> dict[str, Any]:
    return {
        "name": stage.name,
        "changed": stage.changed,
        "before": stage.tokens_before,
        "after": stage.tokens_after,
        "ms": round(stage.ms, 3),
        "error": stage.error,
        "note": _note(stage.details),
    }


def _note(details: Mapping[str, Any]) -> str | None:
    """A stage's details as a short line: its plain values, by name."""
    parts = [
        f"{name}={value}"
        for name, value in details.items()
        if value is True or (isinstance(value, (str, int, float)) and not isinstance(value, bool))
    ]
    return ", ".join(parts)[:_NOTE_CHARS] or None


def _refs(report: Report, rows: Sequence[dict[str, Any] | _Kept]) -> list[dict[str, Any]]:
    """The refs named in what went up that the client did not send, in the order they
    appear: the stage that wrote each on this request and the original's size when it did
    (else ``None``: written by an earlier pass or request), and the client's message it
    stands for where one row shows it."""
    written = {ref: (stage.name, size) for stage in report.stages for ref, size in stage.written}
    found: dict[str, dict[str, Any]] = {}
    for row in rows:
        if isinstance(row, _Kept):  # names no ref
            continue
        client = row["client"]
        for ref in row["refs"]:
            if ref in found:
                continue
            stage, size = written.get(ref, (None, None))
            kind = _KINDS.get(stage or "") or _kind_of(row)
            replaced = None
            if client is not None:
                replaced = f"{row['role']} message, {client['chars']:,} characters"
            found[ref] = {
                "ref": ref,
                "stage": stage,
                "kind": kind,
                "bytes": size,
                "replaced": replaced,
            }
    return list(found.values())


def _kind_of(row: Mapping[str, Any]) -> str:
    """What a ref holds, judged from the row that names it."""
    client = row["client"]
    if client is None:
        return "messages"
    if row["role"] == "tool":
        return "tool output"
    return "image" if "[image]" in client["text"] else "content"


def _cache(
    report: Report,
    cause: str | None,
    cached: int | None,
    uncached: int | None,
    written: int | None,
) -> dict[str, Any]:
    if cause is not None:
        verdict, reason = "break", cause
    elif report.cache == "hot":
        verdict, reason = "warm", None
    else:
        verdict, reason = "cold", report.cache
    return {
        "verdict": verdict,
        "reason": reason,
        "cached": cached,
        "uncached": uncached,
        "written": written,
    }


def _cost(
    catalog: ModelCatalog,
    report: Report,
    received: int,
    cached: int | None,
    uncached: int | None,
    written: int | None,
    completion: int | None,
) -> tuple[float | None, float | None]:
    """What the request cost with the gateway, and would have without it (module
    docstring), in dollars; ``None`` for unknown (no price, or no usage: ``uncached``)."""
    price = catalog.price(report.model)
    if price is None or uncached is None:
        return None, None
    cached, written = cached or 0, written or 0
    read_price = price.cached_input if price.cached_input is not None else price.input
    write_price = price.cache_write if price.cache_write is not None else price.input
    inputs = uncached * price.input + cached * read_price + written * write_price
    outputs = (completion or 0) * price.output
    removed = max(0, received - report.tokens_after)
    read = uncached + cached
    blend = (uncached * price.input + cached * read_price) / read if read else price.input
    with_gateway = (inputs + outputs) / 1_000_000
    without = (inputs + outputs + removed * blend) / 1_000_000
    return round(with_gateway, 6), round(without, 6)


def _is_compaction(chat: ChatRequest) -> bool:
    """Whether this request moved the conversation's compaction: a new cut, a checkpoint
    applied where there was another (or none), an emergency shortening, or the client's
    own compaction made."""
    before, after = chat.state, chat.result.state
    if chat.compaction is not None or chat.result.report.compaction()[4]:
        return True
    cut = before.compacted_cut if before is not None else 0
    span = _span(before.checkpoint) if before is not None else None
    return after.compacted_cut != cut or _span(after.checkpoint) != span


def _span(checkpoint: Mapping[str, Any] | None) -> tuple[Any, Any] | None:
    return (checkpoint.get("start"), checkpoint.get("end")) if checkpoint else None


def _checkpoint(chat: ChatRequest) -> dict[str, Any] | None:
    """The summary checkpoint this request applied, if a summary went up."""
    summarize = chat.result.report.stage("summarize")
    checkpoint = chat.result.state.checkpoint
    if summarize is None or not summarize.changed or not checkpoint:
        return None
    return {
        "start": checkpoint.get("start"),
        "end": checkpoint.get("end"),
        "fields": checkpoint.get("summary"),
        "refs": checkpoint.get("refs"),
    }


def _title(messages: Any) -> str:
    for message in messages if isinstance(messages, list) else ():
        if isinstance(message, dict) and message.get("role") == "user":
            return _text(message)[:TITLE_CHARS]
    return ""


def detail_of(chat: ChatRequest) -> dict[str, Any]:
    """What the client sent beside what went up, message by message."""
    return _detail(_rows(chat, _checkpoint(chat)))


def _rows(chat: ChatRequest, checkpoint: Mapping[str, Any] | None) -> list[dict[str, Any] | _Kept]:
    """A row per message: the client's matched with what went up by identity (a stage
    keeps what it does not change), the runs between paired by ``_changed``. A message
    kept as it was is its ``_Kept`` until the detail shows it (``_detail``): it names no
    ref, and most of a long history's are collapsed or cut, so their text is never read."""
    sent = _messages(chat.body)
    went = _messages(chat.result.request)
    checkpoint = checkpoint or {}
    start, end = checkpoint.get("start"), checkpoint.get("end")
    span = (start, end) if isinstance(start, int) and isinstance(end, int) else None
    kept = {id(message): index for index, message in enumerate(went)}
    rows: list[dict[str, Any] | _Kept] = []
    i = j = 0
    for index, message in enumerate(sent):
        found = kept.get(id(message))
        if found is None or found < j:
            continue
        if index > i or found > j:
            rows.extend(_changed(sent, i, index, went[j:found], span))
        rows.append(_Kept(message))
        i, j = index + 1, found + 1
    rows.extend(_changed(sent, i, len(sent), went[j:], span))
    return rows


class _Kept:
    """A message kept as it was, its row not made yet."""

    __slots__ = ("message",)
    fate: Final = "kept"

    def __init__(self, message: dict[str, Any]) -> None:
        self.message = message

    def row(self) -> dict[str, Any]:
        return _row("kept", self.message, None)


def _detail(rows: list[dict[str, Any] | _Kept]) -> dict[str, Any]:
    """The detail of ``rows``: long runs collapsed, at most ``MAX_ROWS``, the previews
    within ``DETAIL_TEXT_CHARS``."""
    shown = _collapsed(rows)
    truncated = len(shown) > MAX_ROWS
    if truncated:
        shown = [*shown[:20], *shown[-(MAX_ROWS - 20) :]]
    made = [row.row() if isinstance(row, _Kept) else row for row in shown]
    sides = [side for row in made for side in (row.get("client"), row.get("upstream")) if side]
    chars = max(MIN_TEXT_CHARS, min(TEXT_CHARS, DETAIL_TEXT_CHARS // max(1, len(sides))))
    if chars < TEXT_CHARS:
        made = [_shortened_row(row, chars) for row in made]
    return {"messages": made, "truncated": truncated}


def _shortened_row(row: dict[str, Any], shown: int) -> dict[str, Any]:
    sides = {
        name: {**side, "text": side["text"][:shown]}
        for name in ("client", "upstream")
        if (side := row.get(name))
    }
    return {**row, **sides}


def _collapsed(rows: list[dict[str, Any] | _Kept]) -> list[dict[str, Any] | _Kept]:
    """``rows`` with each run of more than ``RUN_SHOWN`` rows of one fate shown by its
    first and last few and one row counting the rest (``collapsed``)."""
    fates = [row.fate if isinstance(row, _Kept) else row["fate"] for row in rows]
    shown: list[dict[str, Any] | _Kept] = []
    start = 0
    while start < len(rows):
        end = start + 1
        while end < len(rows) and fates[end] == fates[start]:
            end += 1
        if end - start > RUN_SHOWN:
            edge = RUN_SHOWN // 2
            shown += rows[start : start + edge]
            shown.append({"fate": fates[start], "collapsed": end - start - 2 * edge})
            shown += rows[end - edge : end]
        else:
            shown += rows[start:end]
        start = end
    return shown


def _messages(request: Mapping[str, Any]) -> list[dict[str, Any]]:
    found = request.get("messages")
    return [m for m in found if isinstance(m, dict)] if isinstance(found, list) else []


def _changed(
    sent: Sequence[dict[str, Any]],
    start: int,
    stop: int,
    went: Sequence[dict[str, Any]],
    span: tuple[int, int] | None,
) -> Iterable[dict[str, Any]]:
    """Rows for the client's messages ``start`` to ``stop``, replaced by the run ``went``
    of what went up: each of the client's paired, in order, with the next that stands for
    it; the rest of the client's removed (summarised where the summary that went up
    stands for them, else pruned), the rest of ``went`` added."""
    j = 0
    for index in range(start, stop):
        message = sent[index]
        found = next((k for k in range(j, len(went)) if _stands_for(went[k], message)), None)
        if found is None:
            inside = span is not None and span[0] <= index < span[1]
            yield _row("summarised" if inside else "pruned", message, None)
            continue
        yield from (_row("added", None, added) for added in went[j:found])
        yield _paired(message, went[found])
        j = found + 1
    yield from (_row("added", None, added) for added in went[j:])


def _stands_for(went: Mapping[str, Any], sent: Mapping[str, Any]) -> bool:
    """Whether ``went`` is ``sent`` as a stage rewrote it: the same role, and the same tool
    call (a tool's result; an assistant's calls), or a beginning that one's text and the
    other's share up to where a placeholder of the gateway's begins; never a message the
    gateway added (a summary, notes). A message a placeholder replaced whole is taken for
    the next of its role."""
    if went.get("role") != sent.get("role"):
        return False
    if went.get("role") == "tool":
        return went.get("tool_call_id") == sent.get("tool_call_id")
    calls, sent_calls = _call_ids(went), _call_ids(sent)
    if calls and sent_calls:
        return bool(calls & sent_calls)
    after = _text(went)
    if after.startswith(_ADDED):
        return False
    lead = _lead(after)
    if not lead:
        return True
    before = _text(sent)
    shared = min(len(lead), len(before))
    return shared > 0 and lead[:shared] == before[:shared]


def _call_ids(message: Mapping[str, Any]) -> set[str]:
    calls = message.get("tool_calls")
    return {
        call["id"]
        for call in (calls if isinstance(calls, list) else ())
        if isinstance(call, dict) and isinstance(call.get("id"), str)
    }


def _lead(text: str) -> str:
    """``text`` up to where the first of the gateway's placeholders begins (all of it
    without one)."""
    found = _PLACEHOLDER.search(text)
    return text[: found.start()] if found is not None else text


def _paired(sent: dict[str, Any], went: dict[str, Any]) -> dict[str, Any]:
    """The row of a message of the client's and what went up in its place: kept when it
    reads the same (a stage changed only what is not read, such as a cache marker),
    offloaded when it names a ref the client's did not, shortened otherwise."""
    before, after = _text(sent), _text(went)
    new: list[str] = []
    if before == after:
        fate: Fate = "kept"
    else:
        if "ctx_" in after:
            found = dict.fromkeys(REF_PATTERN.findall(after))
            new = [ref for ref in found if ref not in before]
        fate = "offloaded" if new else "shortened"
    return {
        "fate": fate,
        "role": str(went.get("role", "")),
        "client": _side(before),
        "upstream": _side(after) if fate != "kept" else None,
        "refs": new,
    }


def _row(fate: Fate, sent: dict[str, Any] | None, went: dict[str, Any] | None) -> dict[str, Any]:
    """The row of a message on one side only: the client's (kept as it was, pruned,
    summarised) or what went up (added), with the refs an added one names."""
    shown = went if went is not None else sent
    assert shown is not None
    text = _text(shown)
    refs = (
        list(dict.fromkeys(REF_PATTERN.findall(text)))
        if went is not None and "ctx_" in text
        else []
    )
    return {
        "fate": fate,
        "role": str(shown.get("role", "")),
        "client": _side(text) if sent is not None else None,
        "upstream": _side(text) if went is not None else None,
        "refs": refs,
    }


def _side(text: str) -> dict[str, Any]:
    return {"text": text[:TEXT_CHARS], "chars": len(text)}


def _text(message: Mapping[str, Any]) -> str:
    """A message as a person reads it: its text, its parts named, its tool calls."""
    parts: list[str] = []
    if message.get("thinking_blocks") or message.get("reasoning_content"):
        parts.append("[thinking]")
    content = message.get("content")
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        for part in content:
            if not isinstance(part, dict):
                continue
            kind = part.get("type")
            if isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif kind in ("image_url", "image", "input_image"):
                parts.append("[image]")
            else:
                parts.append(f"[{kind}]")
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            arguments = function.get("arguments")
            parts.append(
                f"→ {function.get('name')}({arguments if isinstance(arguments, str) else ''})"
            )
    return "\n".join(parts)
