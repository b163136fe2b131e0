"""Stage 9: provider prompt-cache hints, and cache-break prediction.

**Anthropic and Qwen/DashScope** cache only where told to: ``cache_control`` breakpoints,
at most 4 per request counting the client's own. The stage adds 5-minute (``ephemeral``)
ones, in this order of priority while slots last:

1. ``rolling``: the newest message. It writes the cache entry the next turn reads.
2. ``prefix``: the last system message (or, for Anthropic, with none, the last tool): the
   tools and system prompt, which new conversations with the same ones share too.
3. ``protective``: a breakpoint only finds entries up to about 20 blocks before it, so
   when a request added more than ``protect_after`` blocks since the previous request of
   the conversation (a long tool loop), the previous request's last message is marked
   again, where the previous rolling breakpoint wrote its entry. Without a record of the
   previous request, a message ``protect_after`` blocks before the end is marked instead.
4. ``compaction``: the last message of the compacted part (``StageContext.boundary``).

A breakpoint other than the rolling one is placed only when the prompt between it and the
breakpoint before it (or the start) holds ``min_tokens`` (an entry for less would not be
written, or would save little over the one before); the rolling one only needs the whole
prefix to hold ``min_tokens``. The client's markers are never moved or removed, a message
it marked is not marked again, and none is placed before a client's ``ttl: "1h"`` marker
(the API wants 1-hour entries before 5-minute ones). Every breakpoint other than the
rolling one stays where it is from turn to turn: on the system prompt, the compaction
boundary or the previous request's rolling message, so between compaction events no
breakpoint lands on a message that did not carry one before.

Where the markers go (a contract with the codecs): for Anthropic, a message-level
``cache_control`` key on the message (meaning its last Messages API block that can carry
one: not a thinking block, nor an empty text, which the codec leaves out) and a
tool-level one on the last tool; for Qwen, on the message's last content part (a string
content becomes one text part; a thinking or empty text part takes none), as DashScope
takes them over the OpenAI wire. The client's markers count wherever they are, nested
blocks included (a search result's text, a document's content).

Anthropic's automatic caching, a top-level ``cache_control``, is one of the client's
markers: the API puts it on the last block that can carry one, so it sits on the newest
message the rolling breakpoint would mark, with its TTL. It takes the rolling breakpoint's
place (none is added there), and a 1-hour one leaves no place for the stage's 5-minute
ones. The codecs must send it on as the client gave it: the inbound ``/v1/messages``
codec keeps it in the chat request for this stage and sends it back from ``native``.

**OpenAI** caches automatically (prompts of 1,024 tokens and more); the stage sets a
``prompt_cache_key`` per conversation (a hash of the namespace and the conversation's
identity) on requests that long unless the client set one, so that the conversation's
requests are routed to the same cache.

A policy with ``cache-markers=?0`` adds neither (the client places its own).

**Every family**: the stage predicts cache breaks (``pipelines.cache_break``) against the
conversation's record, and records the fingerprints for the next request.
"""

from pipelines.stages.cache_markers.stage import CacheMarkers, cache_key

__all__ = ["CacheMarkers", "cache_key"]
