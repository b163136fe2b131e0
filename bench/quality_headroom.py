"""Headroom as one more method of the context-quality replay: its compression, driven in
its own virtualenv by ``bench/headroom_compress.py`` (one process for every session, JSON
over stdin and stdout), so that its dependencies never meet the gateway's."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from bench.peer_envs import python_of, version_of

Messages = list[dict[str, object]]
SCRIPT = Path(__file__).resolve().parent / "headroom_compress.py"


@dataclass(frozen=True, slots=True)
class Compressed:
    """One request as Headroom sent it, and the originals its store restores for it."""

    messages: Messages
    restorable: list[str]


def headroom_version() -> str:
    """The installed release of Headroom (installing it on first use)."""
    return version_of("headroom", "headroom-ai")


def compress_sessions(
    sessions: Sequence[tuple[Messages, list[int]]], *, model: str, budget: int
) -> list[list[Compressed]]:
    """Per session (its messages, the message count of each request), Headroom's
    outgoing requests. (Its compression does not depend on time: a lapsed provider
    cache changes nothing in what it sends.)"""
    job = {
        "model": model,
        "budget": budget,
        "sessions": [{"messages": messages, "ends": ends} for messages, ends in sessions],
    }
    answer = subprocess.run(
        [str(python_of("headroom")), str(SCRIPT)],
        input=orjson.dumps(job),
        capture_output=True,
        check=True,
    )
    lines = answer.stdout.splitlines()
    if len(lines) != len(sessions):
        raise RuntimeError(f"headroom answered {len(lines)} of {len(sessions)} sessions")
    return [
        [_decoded(request, messages) for request in orjson.loads(line)]
        for line, (messages, _) in zip(lines, sessions, strict=True)
    ]


def _decoded(request: dict[str, object], history: Messages) -> Compressed:
    sent = request["messages"]
    restorable = request["restored"]
    assert isinstance(sent, list)
    assert isinstance(restorable, list)
    return Compressed(
        [history[item] if isinstance(item, int) else item for item in sent],
        [str(text) for text in restorable],
    )
