"""Stage 6: deterministic compaction, stable from turn to turn.

Clients resend the whole raw history on every request, so compaction must give the same
compacted prefix each time the same history comes back with more appended; otherwise every
turn would break the provider's prompt cache. The stage therefore works in three steps,
each a function of the messages before a point, never of the ones after it:

1. **Dedup** (from 50% utilisation): a tool output of 200+ characters identical to an
   earlier one is replaced by a note naming the earlier call and a ref to the content.
2. **Cut** (from ``trigger``): the compactable span starts after the anchor and ends at a
   *cut*. Cuts sit on a fixed grid: the first group boundary after each multiple of
   ``(trigger - target) x budget`` tokens of the raw span, or, when no grid cut is enough,
   the last group before the protected tail. The stage takes the first grid cut that
   brings the request under ``trigger``. As the history grows the cut stays put: the
   previous request's cut (the conversation's record) is applied again, on the grid or
   not, while the request fits under ``trigger`` with it, and the next one is only taken
   after that much growth, which leaves the request near ``target`` again. So compaction
   events are rare and between them the outgoing prefix does not change. A cut that would
   save less than the room left under the budget (clamped to 500-3,000 tokens), compared
   with the previous cut (or with no cut), is not taken while the request fits.
3. **Span**: inside the span, user messages are kept whole, final answers are kept (long
   ones shortened) while they fit the span's share of the budget, oldest dropped first, and
   tool-call groups and interim assistant text are removed; each removed run becomes one
   short user-role note listing the ref of what it held. Nothing here depends on messages
   after the cut (priorities are taken without the latest user message's goal terms).

Everything removed or shortened is written to the store first; without a store (or if a
write fails) nothing is compacted.

When even the first cut cannot bring the request under the budget (the tail itself is too
big: the emergency case), the largest tool outputs and assistant texts outside the system
prompt and the latest user message are shortened, originals stored first, until it fits.
The report records the level reached (``level``: light, full) and the cut (``cut``), so a
compaction event is visible as a change of either, or as ``emergency_shortened``.

The package, one module per part: ``stage`` (``Compress``: the steps in their order),
``memo`` (the previous cut applied again without recomputing it), ``dedup`` (step 1),
``cut`` (step 2, and ``compactable`` for the summarize stage), ``span`` (step 3),
``emergency``, and ``offload`` (storing what is removed, shortening a text).
"""

from pipelines.stages.compress.cut import MAX_MIN_SAVING, MIN_SAVING_FLOOR, compactable
from pipelines.stages.compress.stage import Compress

__all__ = ["MAX_MIN_SAVING", "MIN_SAVING_FLOOR", "Compress", "compactable"]
