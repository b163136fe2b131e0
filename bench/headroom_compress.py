"""Headroom's compression over replayed sessions, run by Headroom's own interpreter
(``bench.peer_envs.python_of("headroom")``) so that its dependencies never meet the
gateway's; ``bench.compaction`` drives it.

Reads one JSON object on stdin, ``{"model", "budget", "sessions": [{"messages",
"ends"}]}``; for each session writes one JSON line: per request, the outgoing messages
(an int stands for the history's message at that index, sent unchanged) and the original
texts that Headroom's compression store returns for the hashes in them.

Each session goes as Headroom's OpenAI proxy handles a conversation in token mode: a
per-session ``CompressionCache``; per request ``prepare_turn`` (policy "replayable": the
tool outputs it compressed before are swapped back in, byte for byte, and the replayable
prefix is frozen), ``headroom.compress`` on that input, then ``update_from_result``. Its ML text
compressor (Kompress) is disabled: its weights are fetched from a model hub at run time,
which this benchmark cannot reach; JSON (SmartCrusher) and the other deterministic
transforms run as released.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HEADROOM_TELEMETRY", "off")
logging.disable(logging.WARNING)

from headroom import compress  # noqa: E402
from headroom.cache.compression_cache import CompressionCache  # noqa: E402
from headroom.cache.compression_store import get_compression_store  # noqa: E402
from headroom.proxy.session_engine import FREEZE_POLICY_REPLAYABLE, prepare_turn  # noqa: E402

HASH = re.compile(r"hash=([0-9A-Za-z_-]+)|<<ccr:([^>\s]+)")


def restored(messages: list[dict[str, Any]]) -> list[str]:
    """The originals Headroom's store returns for the hashes named in ``messages``."""
    store = get_compression_store()
    texts = []
    for key in sorted({m.group(1) or m.group(2) for m in HASH.finditer(json.dumps(messages))}):
        entry = store.retrieve(key)
        if entry is not None:
            texts.append(entry.original_content)
    return texts


def session(model: str, budget: int, item: dict[str, Any]) -> list[dict[str, Any]]:
    messages = item["messages"]
    out = []
    cache = CompressionCache()
    for end in item["ends"]:
        history = messages[:end]
        prep = prepare_turn(cache, history, policy=FREEZE_POLICY_REPLAYABLE)
        result = compress(
            prep.pipeline_input,
            model=model,
            model_limit=budget,
            frozen_message_count=prep.frozen_message_count,
            kompress_model="disabled",
        )
        if result.messages != prep.pipeline_input:
            cache.update_from_result(history, result.messages)
        sent: list[Any] = [
            index if index < end and message == history[index] else message
            for index, message in enumerate(result.messages)
        ]
        out.append({"messages": sent, "restored": restored(result.messages)})
    return out


def main() -> None:
    job = json.load(sys.stdin)
    for item in job["sessions"]:
        print(json.dumps(session(job["model"], job["budget"], item)), flush=True)


if __name__ == "__main__":
    main()
