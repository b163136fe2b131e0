"""JSON log lines for ``contextgate serve``: one object per line, credentials masked.

Every logger (the gateway's ``contextgate.*``, uvicorn's, the libraries') writes through one
handler on stderr whose ``JsonFormatter`` makes each record a line such as::

    {"time":"2026-01-02T03:04:05.678Z","level":"warning","logger":"contextgate.relay",
     "message":"upstream stream failed: upstream_stream_error","request_id":"cg-..."}

Fields given with ``extra=`` become fields of the line, and so do those of a ``fields``
mapping given that way (cheaper for many: the access line's); an exception adds
``error_type`` and ``exception`` (the traceback). As a safety net the finished line is
searched for what looks like a credential (``Bearer <token>``, ``sk-...`` keys,
``x-api-key``/``api_key`` and ``authorization`` values, gateway keys of ``contextgate
hash-key --new``), which is masked, tracebacks included. It is a net, not a licence: the
gateway does not log headers, keys or prompts in the first place
(``docs/OBSERVABILITY.md``).
"""

from __future__ import annotations

import logging
import re
import sys
import time
from typing import Any, Final, TextIO

import orjson

__all__ = ["LEVELS", "JsonFormatter", "configure_logging", "redact"]

LEVELS: Final = ("critical", "error", "warning", "info", "debug", "trace")
"""The levels ``--log-level`` takes (uvicorn's names; ``trace`` is uvicorn's level 5)."""

_TRACE: Final = 5
_QUIET: Final = ("httpx", "httpcore", "hpack")
"""Libraries that log every upstream request at INFO: kept at WARNING, off the hot path."""

_RECORD_FIELDS: Final = frozenset(
    {
        *logging.LogRecord("", 0, "", 0, "", None, None).__dict__,
        "message",
        "asctime",
        "taskName",
        "color_message",  # uvicorn's ANSI-coloured copy of the message
    }
)
"""Attributes every record has: anything else on a record came from ``extra=``."""

_SECRET: Final = re.compile(
    r"(?i)"
    r"(?P<bearer>\bbearer\s+)[A-Za-z0-9._~+/=-]{4,}"
    r"|(?P<header>\b(?:x-api-key|api[_-]?key|authorization)(?:\\?[\"'])?\s*[:=]\s*(?:\\?[\"'])?)"
    r"(?!\s|bearer\s)[^\"'\\,;}]{4,}"
    r"|\bsk-[A-Za-z0-9_-]{6,}"
    r"|\bcg-[A-Za-z0-9_-]{32,}"
)
_GATEWAY_KEY: Final = re.compile(r"cg-[A-Za-z0-9_-]{32,}")
_MASK: Final = "[redacted]"


def _mask(match: re.Match[str]) -> str:
    kept = match.group("bearer") or match.group("header") or ""
    return kept + _MASK


def redact(text: str) -> str:
    """``text`` with anything that looks like a credential replaced by ``[redacted]``."""
    lower = text.lower()
    # The full search costs ~50 us a line; these substring checks, a few: most lines have
    # nothing of the kind.
    if (
        "bearer" in lower
        or "sk-" in lower
        or "key" in lower
        or "authorization" in lower
        or _GATEWAY_KEY.search(text)
    ):
        return _SECRET.sub(_mask, text)
    return text


class JsonFormatter(logging.Formatter):
    """A record as one JSON object: time (RFC 3339, UTC), level, logger, message, the
    record's ``extra=`` fields, and the exception if any; credentials masked."""

    def __init__(self) -> None:
        super().__init__()
        self._second = -1
        self._stamp = ""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": self._time(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(
            (key, value) for key, value in record.__dict__.items() if key not in _RECORD_FIELDS
        )
        fields = line.pop("fields", None)
        if isinstance(fields, dict):
            line.update(fields)
        if record.exc_info and record.exc_info[0] is not None:
            line["error_type"] = record.exc_info[0].__name__
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = record.stack_info
        text = orjson.dumps(line, default=repr).decode()
        return redact(text)

    def _time(self, created: float) -> str:
        second = int(created)
        if second != self._second:  # the date part changes once a second, not per line
            self._second = second
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._stamp}.{int((created - second) * 1000):03d}Z"


def configure_logging(level: str, stream: TextIO | None = None) -> None:
    """Send every logger's records to ``stream`` (stderr) as JSON lines, from ``level``
    (one of ``LEVELS``) up; the chatty HTTP libraries from WARNING up."""
    logging.addLevelName(_TRACE, "TRACE")
    # No line carries the caller's file and line, thread or process: not looking them up
    # saves a fifth of each record's cost (the logging HOWTO's "Optimization").
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    number = _TRACE if level == "trace" else logging.getLevelName(level.upper())
    if not isinstance(number, int):
        raise ValueError(f"unknown log level {level!r}; one of {', '.join(LEVELS)}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(number)
    logging.captureWarnings(True)
    for name in _QUIET:
        logging.getLogger(name).setLevel(max(number, logging.WARNING))
