"""The ledger on Redis (``gateway.store.ledger``), shared by every replica, on one server,
behind Sentinel or on a cluster.

Keys, all of one namespace's under one hash tag (so one slot of a cluster), where
``<ns>`` is ``namespace_id(namespace)``:

- ``cg:{i:<ns>}:idx``: a sorted set of the namespace's conversations, scored by the
  ``at`` of their latest request (never lowered by a request that ends late).
- ``cg:{i:<ns>}:<conversation>:log``: a list of the entries' summaries, newest first,
  each ``<request id>\\n<summary JSON, zlib-compressed>`` so that the script writing an
  entry can tell whose detail to drop without decoding anything.
- ``cg:{i:<ns>}:<conversation>:row``: a hash of the conversation's totals. Each field's
  name carries the type of its value (``i:requests``, ``f:cost_with``, ``s:model``), so a
  title that reads ``2024`` comes back a string and an integral cost a float; a total
  added as an int by one request and as a float by another is the sum of its two fields.
- ``cg:{i:<ns>}:<conversation>:detail``: a hash of request id to its detail JSON,
  zlib-compressed, for the latest ``max_details`` entries only.

The tag is ``i`` (inspector), not ``l``: ``cg:{l:<id>}`` is the rate limiter's
(``gateway.tenancy.limits``), whose ``<id>`` is this same ``namespace_id`` in passthrough.

One script writes an entry in one round trip, atomically: it pushes the summary, trims
the log to ``max_requests``, keeps the detail and drops the one leaving the detail
window, applies the totals, indexes the conversation, drops the namespace's least recently
active conversations past ``max_conversations`` (entries and all), takes out of the index
those whose TTL has run out (their keys are gone already), and renews every key's TTL.
The cost of the single slot: a namespace's whole ledger lives on one cluster node, and
its writes go to that node.

Reads: a page of conversations is one script (the index's page, its count and each row);
a page of entries one pipelined ``LRANGE`` and ``LLEN``; one entry a script that looks
for it in the log, newest first, and reads its detail (so a lookup does not bring the
whole log, half a megabyte for the longest measured, over the network). A conversation
whose last request is older than the TTL is not listed, though the index keeps it until
the namespace's next write.

Summaries and details are kept zlib-compressed (level 1), like the in-memory ledger's: a
summary is mostly repeated keys and stage names, a detail message text. What a request
costs in Redis, measured with ``MEMORY USAGE`` by ``bench/ledger.py`` at the default
bounds, is in docs/BENCHMARKS.md ("The ledger's memory and Redis bytes"); nothing grows
past the bounds, and all of a namespace's ledger is on one node of a cluster.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import Any, Final

from gateway.breaker import CircuitBreaker
from gateway.store.ledger import LedgerEntry, LedgerPage, Totals, pack, unpack
from gateway.store.redis import RedisBackend
from gateway.store.shared import namespace_id
from pipelines import StoreError

__all__ = ["RedisLedger"]

_ADD: Final = """
local index, log, row, details = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local prefix, conversation, at, request_id = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local max_requests, max_details = tonumber(ARGV[7]), tonumber(ARGV[8])
local max_conversations, ttl = tonumber(ARGV[9]), tonumber(ARGV[10])

local function id_of(item)
  return string.sub(item, 1, (string.find(item, '\\n', 1, true) or 1) - 1)
end

redis.call('LPUSH', log, ARGV[5])
if ARGV[6] ~= '' then redis.call('HSET', details, request_id, ARGV[6]) end
local leaving = redis.call('LINDEX', log, max_details)
if leaving then redis.call('HDEL', details, id_of(leaving)) end
if redis.call('HLEN', details) > max_details then
  -- kept under a larger window than this one: drop all those now outside it
  for _, item in ipairs(redis.call('LRANGE', log, max_details, -1)) do
    redis.call('HDEL', details, id_of(item))
  end
end
redis.call('LTRIM', log, 0, max_requests - 1)

for i = 11, #ARGV, 4 do
  local op, kind, name, value = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local field = kind .. ':' .. name
  if op == 'add' then
    redis.call(kind == 'f' and 'HINCRBYFLOAT' or 'HINCRBY', row, field, value)
  elseif op == 'latest' then
    for _, other in ipairs({'s', 'i', 'f'}) do
      if other ~= kind then redis.call('HDEL', row, other .. ':' .. name) end
    end
    redis.call('HSET', row, field, value)
  elseif redis.call('HEXISTS', row, 's:' .. name) == 0
      and redis.call('HEXISTS', row, 'i:' .. name) == 0
      and redis.call('HEXISTS', row, 'f:' .. name) == 0 then
    redis.call('HSET', row, field, value)
  end
end

local seen = redis.call('ZSCORE', index, conversation)
if not seen or tonumber(seen) < at then redis.call('ZADD', index, ARGV[3], conversation) end
redis.call('ZREMRANGEBYSCORE', index, '-inf', '(' .. tostring(at - ttl))
local over = redis.call('ZCARD', index) - max_conversations
if over > 0 then
  for _, name in ipairs(redis.call('ZRANGE', index, 0, over)) do
    if over > 0 and name ~= conversation then
      redis.call('ZREM', index, name)
      redis.call('DEL', prefix .. name .. ':log', prefix .. name .. ':row',
                 prefix .. name .. ':detail')
      over = over - 1
    end
  end
end
for _, key in ipairs(KEYS) do redis.call('EXPIRE', key, ttl) end
return 1
"""
"""Writes one entry: KEYS index, log, row, detail; ARGV the key prefix, conversation, at,
request id, log item, detail (empty for none), the four bounds, then the totals as
(operation, kind, name, value) fours."""

_CONVERSATIONS: Final = """
local prefix, since, offset, limit = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local names, rows = {}, {}
if limit > 0 then
  names = redis.call('ZREVRANGEBYSCORE', KEYS[1], '+inf', since, 'LIMIT', offset, limit)
end
for i, name in ipairs(names) do rows[i] = redis.call('HGETALL', prefix .. name .. ':row') end
return {redis.call('ZCOUNT', KEYS[1], since, '+inf'), names, rows}
"""
"""A page of conversations: KEYS index; ARGV the key prefix, the oldest score listed,
offset, limit. Returns the count listed, the page's names and their rows."""

_REQUEST: Final = """
local wanted, start = ARGV[1] .. '\\n', 0
repeat
  local items = redis.call('LRANGE', KEYS[1], start, start + 31)
  for _, item in ipairs(items) do
    if string.sub(item, 1, #wanted) == wanted then
      return {item, redis.call('HGET', KEYS[2], ARGV[1])}
    end
  end
  start = start + 32
until #items < 32
return false
"""
"""One entry: KEYS log, detail; ARGV the request id. Returns its log item and detail
(nil when not kept), or nil when the entry is not in the log."""


class RedisLedger:
    """``gateway.store.ledger.Ledger`` on Redis; ``ttl`` in whole seconds."""

    __slots__ = (
        "_add",
        "_conversations",
        "_request",
        "backend",
        "breaker",
        "max_conversations",
        "max_details",
        "max_requests",
        "ttl",
    )

    def __init__(
        self,
        backend: RedisBackend,
        *,
        max_requests: int,
        max_details: int,
        max_conversations: int,
        ttl: int,
    ) -> None:
        self.backend = backend
        settings = backend.settings
        self.breaker = CircuitBreaker(settings.breaker_failures, settings.breaker_cooldown)
        """The ledger's own: its failures (after the answers) never stop the requests'
        store operations."""
        self.max_requests, self.max_details = max_requests, max_details
        self.max_conversations, self.ttl = max_conversations, ttl
        # Sent by their hash (EVALSHA), the text only when Redis does not know them yet.
        client = backend.client
        self._add = client.register_script(_ADD)
        self._conversations = client.register_script(_CONVERSATIONS)
        self._request = client.register_script(_REQUEST)

    async def add(self, namespace: str, conversation: str, entry: LedgerEntry) -> None:
        prefix = _prefix(namespace)
        base = prefix + conversation
        keys = [prefix + "idx", base + ":log", base + ":row", base + ":detail"]
        args: list[str | bytes | int] = [
            prefix,
            conversation,
            repr(float(entry.at)),
            entry.request_id,
            entry.request_id.encode() + b"\n" + pack(entry.summary),
            pack(entry.detail) if entry.detail is not None else b"",
            self.max_requests,
            self.max_details,
            self.max_conversations,
            self.ttl,
            *_totals(entry.totals),
        ]
        script = self._add
        try:
            await self.backend.run(
                lambda: script(keys=keys, args=args), "ledger_add", breaker=self.breaker
            )
        except StoreError:
            return

    async def conversations(self, namespace: str, *, offset: int, limit: int) -> LedgerPage:
        prefix = _prefix(namespace)
        args: list[str | int] = [prefix, repr(time.time() - self.ttl), max(0, offset), limit]
        script = self._conversations
        total, names, rows = await self.backend.run(
            lambda: script(keys=[prefix + "idx"], args=args), "ledger_read", breaker=self.breaker
        )
        items = [
            {"id": name.decode(), **_row(_pairs(fields))}
            for name, fields in zip(names, rows, strict=True)
            if fields  # its keys expired before the index learnt of it
        ]
        return LedgerPage(items, int(total))

    async def conversation(self, namespace: str, conversation: str) -> dict[str, Any] | None:
        key, client = _prefix(namespace) + conversation + ":row", self.backend.client
        fields: dict[bytes, bytes] = await self.backend.run(
            lambda: client.hgetall(key),  # type: ignore[arg-type, return-value]
            "ledger_read",
            breaker=self.breaker,
        )
        return {"id": conversation, **_row(fields.items())} if fields else None

    async def requests(
        self, namespace: str, conversation: str, *, offset: int, limit: int
    ) -> LedgerPage:
        key, client = _prefix(namespace) + conversation + ":log", self.backend.client
        start = max(0, offset)

        async def read() -> Any:
            async with client.pipeline(transaction=False) as pipe:
                # LRANGE's stop is inclusive (and a stop of -1 would be the whole list).
                pipe.lrange(key, start, start + max(limit, 1) - 1)
                pipe.llen(key)
                return await pipe.execute()

        items, total = await self.backend.run(read, "ledger_read", breaker=self.breaker)
        if limit <= 0:
            items = []
        return LedgerPage([_summary(item) for item in items], int(total))

    async def request(
        self, namespace: str, conversation: str, request_id: str
    ) -> dict[str, Any] | None:
        base = _prefix(namespace) + conversation
        keys, script = [base + ":log", base + ":detail"], self._request
        found = await self.backend.run(
            lambda: script(keys=keys, args=[request_id]), "ledger_read", breaker=self.breaker
        )
        if not found:
            return None
        item, detail = found
        return {**_summary(item), "detail": unpack(detail)}


def _prefix(namespace: str) -> str:
    """What every key of ``namespace``'s ledger starts with (its hash tag)."""
    return f"cg:{{i:{namespace_id(namespace)}}}:"


def _totals(totals: Totals) -> list[str]:
    """``totals`` as the add script's (operation, kind, name, value) fours."""
    args: list[str] = []
    for operation, values in (
        ("add", totals.add),
        ("latest", totals.latest),
        ("first", totals.first),
    ):
        for name, value in values.items():
            if isinstance(value, str):
                args += [operation, "s", name, value]
            elif isinstance(value, float):
                # HINCRBYFLOAT refuses infinities, and a refused command would leave the
                # script's earlier writes in place.
                if operation != "add" or math.isfinite(value):
                    args += [operation, "f", name, repr(value)]
            else:
                args += [operation, "i", name, str(int(value))]
    return args


def _pairs(flat: list[bytes]) -> Iterable[tuple[bytes, bytes]]:
    """A flat ``HGETALL`` reply (as a script returns it) as field, value pairs."""
    return zip(flat[::2], flat[1::2], strict=True)


def _row(fields: Iterable[tuple[bytes, bytes]]) -> dict[str, Any]:
    """A conversation's row from its hash's typed fields."""
    row: dict[str, Any] = {}
    for field, raw in fields:
        kind, _, name = field.decode().partition(":")
        value: str | int | float = (
            int(raw) if kind == "i" else float(raw) if kind == "f" else raw.decode()
        )
        before = row.get(name)
        if isinstance(before, int | float) and isinstance(value, int | float):
            value += before  # a total added as an int by some requests, a float by others
        row[name] = value
    return row


def _summary(item: bytes) -> dict[str, Any]:
    """An entry's summary from its log item (``<request id>\\n<JSON, zlib-compressed>``)."""
    summary: dict[str, Any] = unpack(item.partition(b"\n")[2])
    return summary
