"""Structural previews of large tool outputs, written without a model call.

A preview tells the model what the whole output was and shows the part most likely to
matter, within ``budget`` characters:

- a JSON array: its first items that fit, then "showing N of M items";
- a JSON object: its shape, key by key (scalars shown short, arrays and objects counted,
  nesting shown two levels deep);
- an error (a traceback, "Error: ...", a failed command): its head and a longer tail, where
  the cause usually is;
- any other text or log: head and tail lines, with line numbers and the count of lines
  left out.

The same output always gives the same preview, byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import re
from functools import lru_cache
from typing import Any, Final

__all__ = ["is_error", "preview", "text_digest", "trim_json"]

_ERROR_START: Final = re.compile(
    r"^\s*(error|exception|fatal|traceback|failed|failure)\b", re.IGNORECASE
)
_ERROR_EARLY: Final = re.compile(
    r"traceback \(most recent call last\)|timed out|connection refused|task failed"
    r"|exit (code|status) [1-9]",
    re.IGNORECASE,
)
_SCALAR_CHARS: Final = 80


def text_digest(text: str) -> bytes:
    """A collision-resistant key for caches of work done on a text (a plain ``hash`` could
    collide and serve one caller's text to another)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def is_error(text: str) -> bool:
    """Whether ``text`` reads as an error report (judged on its first 500 characters)."""
    return _is_error_head(text[:500])


@lru_cache(maxsize=1_024)
def _is_error_head(head: str) -> bool:
    # Cached: a resent history asks about the same tool results on every request.
    return bool(_ERROR_START.match(head) or _ERROR_EARLY.search(head))


def preview(text: str, budget: int) -> str:
    """A preview of ``text`` in at most about ``budget`` characters."""
    stripped = text.lstrip()
    if stripped[:1] in ("[", "{"):
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if isinstance(value, list):
            return _array(value, budget)
        if isinstance(value, dict):
            return _object(value, budget)
    if is_error(text):
        return _lines(text, budget, head_share=0.35, label="error output")
    return _lines(text, budget, head_share=0.6, label="text")


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=False)


def _array(items: list[Any], budget: int) -> str:
    shown: list[str] = []
    used = 0
    for item in items:
        line = _dump(item)
        if shown and used + len(line) + 1 > budget:
            break
        if len(line) > budget:
            line = line[: max(0, budget - 20)] + " ...(item cut)"
        shown.append(line)
        used += len(line) + 1
    total = len(items)
    head = f"JSON array, showing {len(shown)} of {total} items:"
    rest = total - len(shown)
    tail = (
        f"... {rest} more items not shown. They are in the stored output: restore it (or a"
        " range of its lines) rather than guessing what they contain."
        if rest
        else "(all items shown)"
    )
    return "\n".join([head, *shown, tail])


def _object(value: dict[str, Any], budget: int) -> str:
    lines = [f"JSON object with {len(value)} keys; its shape:"]
    used = len(lines[0])
    keys = list(value)
    for position, key in enumerate(keys):
        line = f"  {_dump(key)}: {_shape(value[key], depth=1)}"
        if used + len(line) + 1 > budget:
            rest = ", ".join(_dump(k) for k in keys[position:])
            if len(rest) > budget // 3:
                rest = rest[: budget // 3] + " ..."
            lines.append(f"  ... {len(keys) - position} more keys: {rest}")
            break
        lines.append(line)
        used += len(line) + 1
    lines.append("Values not shown are in the stored output; restore it rather than guessing.")
    return "\n".join(lines)


def _shape(value: Any, depth: int) -> str:
    if isinstance(value, dict):
        if depth >= 2 or not value:
            return f"object with {len(value)} keys"
        inner = ", ".join(f"{_dump(k)}: {_shape(v, depth + 1)}" for k, v in list(value.items())[:8])
        more = f", ... {len(value) - 8} more" if len(value) > 8 else ""
        return "{" + inner + more + "}"
    if isinstance(value, list):
        kinds = sorted({type(item).__name__ for item in value})
        return f"array of {len(value)} ({', '.join(kinds) or 'empty'})"
    text = _dump(value)
    return text if len(text) <= _SCALAR_CHARS else text[: _SCALAR_CHARS - 5] + '..."'


def _lines(text: str, budget: int, *, head_share: float, label: str) -> str:
    lines = text.splitlines()
    total = len(lines)
    head_budget = int(budget * head_share)
    head: list[str] = []
    used = 0
    for line in lines:
        if used + len(line) + 1 > head_budget and head:
            break
        head.append(line[:head_budget])
        used += len(head[-1]) + 1
    tail: list[str] = []
    used = 0
    for line in reversed(lines[len(head) :]):
        if used + len(line) + 1 > budget - head_budget and tail:
            break
        tail.append(line[-(budget - head_budget) :])
        used += len(tail[-1]) + 1
    tail.reverse()
    skipped = total - len(head) - len(tail)
    if skipped <= 0:
        return f"{label.capitalize()}, {total} lines (shortened within lines):\n" + "\n".join(
            head + tail
        )
    return "\n".join(
        [
            f"{label.capitalize()}, {total} lines; lines 1-{len(head)}:",
            *head,
            f"... lines {len(head) + 1}-{total - len(tail)} ({skipped} lines) not shown;"
            " they are in the stored output ...",
            f"lines {total - len(tail) + 1}-{total}:",
            *tail,
        ]
    )


def trim_json(
    value: Any, *, depth: int = 4, keys: int = 12, items: int = 3, chars: int = 400
) -> Any:
    """``value`` made smaller but still valid JSON of the same shape: nesting cut at
    ``depth``, objects to their first ``keys`` keys, arrays to their first and last
    ``items`` items, strings to ``chars`` characters; each cut says what it left out."""
    if isinstance(value, str):
        if len(value) <= chars:
            return value
        return f"{value[: chars - 60]} ...({len(value) - chars + 60} characters cut)"
    if isinstance(value, dict):
        if depth <= 0:
            return f"(object with {len(value)} keys cut)"
        out = {
            k: trim_json(v, depth=depth - 1, keys=keys, items=items, chars=chars)
            for k, v in list(value.items())[:keys]
        }
        if len(value) > keys:
            out["..."] = f"{len(value) - keys} more keys cut"
        return out
    if isinstance(value, list):
        if depth <= 0:
            return [f"(array of {len(value)} items cut)"]
        kept = value if len(value) <= 2 * items else value[:items] + value[-items:]
        out_list = [
            trim_json(v, depth=depth - 1, keys=keys, items=items, chars=chars) for v in kept
        ]
        if len(value) > 2 * items:
            out_list.insert(items, f"... {len(value) - 2 * items} items cut ...")
        return out_list
    return value
