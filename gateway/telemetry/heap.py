"""Heap snapshots of a running ``contextgate serve``, for finding what grows.

With ``CONTEXTGATE_TRACEMALLOC`` set to a path prefix, ``serve`` answers ``SIGUSR1``: the
first starts ``tracemalloc`` (16 frames deep; tracing from start-up would slow the imports
many times over, and what grows over hours is allocated while serving), each later one
writes a snapshot to ``<prefix>.<n>.snapshot`` (n = 1, 2, ...), to be compared with
``tracemalloc.Snapshot.load(b).compare_to(Snapshot.load(a), "traceback")``: what was
allocated after tracing began and is still held. Tracing slows the process by about half
and adds its own memory: a tool for a soak, never for serving. Unset, nothing is
installed."""

from __future__ import annotations

import itertools
import os
import signal
from types import FrameType
from typing import Final

__all__ = ["ENV", "watch_heap"]

ENV: Final = "CONTEXTGATE_TRACEMALLOC"
_FRAMES: Final = 16


def watch_heap() -> None:
    """Answer SIGUSR1 as the module says, when ``ENV`` asks for it."""
    prefix = os.environ.get(ENV)
    if not prefix:
        return
    import tracemalloc  # only where asked for

    numbers = itertools.count(1)

    def dump(signum: int, frame: FrameType | None) -> None:
        if not tracemalloc.is_tracing():
            tracemalloc.start(_FRAMES)
            return
        path = f"{prefix}.{next(numbers)}.snapshot"
        tracemalloc.take_snapshot().dump(path + ".part")
        os.replace(path + ".part", path)  # a reader never sees half a snapshot

    signal.signal(signal.SIGUSR1, dump)
