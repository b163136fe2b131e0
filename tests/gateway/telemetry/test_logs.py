"""JSON log lines: one object per record, fields from ``extra=``, tracebacks included,
and anything that looks like a credential masked."""

from __future__ import annotations

import io
import json
import logging
import re
import sys
from collections.abc import Iterator

import orjson
import pytest

from gateway.telemetry.logs import JsonFormatter, configure_logging, redact

RFC3339_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def record(message: str, **extra: object) -> logging.LogRecord:
    made = logging.LogRecord("contextgate.test", logging.WARNING, __file__, 1, message, (), None)
    made.__dict__.update(extra)
    return made


def test_a_record_is_one_json_object_with_its_extra_fields() -> None:
    """Time (RFC 3339, UTC), level, logger, message and the ``extra=`` fields."""
    line = JsonFormatter().format(record("upstream stream failed", request_id="cg-1", status=502))
    assert "\n" not in line
    parsed = json.loads(line)
    assert RFC3339_UTC.fullmatch(parsed.pop("time"))
    assert parsed == {
        "level": "warning",
        "logger": "contextgate.test",
        "message": "upstream stream failed",
        "request_id": "cg-1",
        "status": 502,
    }


def test_a_fields_mapping_gives_fields_of_the_line() -> None:
    """``extra={"fields": {...}}`` adds each of its fields, as separate ``extra`` keys do."""
    made = record("request", request_id="cg-3", fields={"status": 200, "route": "/healthz"})
    parsed = json.loads(JsonFormatter().format(made))
    assert (parsed["request_id"], parsed["status"], parsed["route"]) == ("cg-3", 200, "/healthz")
    assert "fields" not in parsed


def test_an_exception_comes_out_as_fields_of_the_line() -> None:
    """The exception's type and its traceback are fields of the one line."""
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        failed = record("unhandled error", request_id="cg-2")
        failed.exc_info = sys.exc_info()
    parsed = json.loads(JsonFormatter().format(failed))
    assert parsed["error_type"] == "RuntimeError"
    assert "Traceback" in parsed["exception"]
    assert "RuntimeError: boom" in parsed["exception"]


SECRETS = [
    "Authorization: Bearer sk-proj-abcdefghijklmnop",
    "the key sk-ant-api03-abcdefghijklmnopqrstuvwxyz was refused",
    "sent sk-abcdefghijklmnop upstream",
    orjson.dumps({"x-api-key": "plain-secret-value"}).decode(),
    "{'x-api-key': 'plain-secret-value'}",
    "x-api-key: plain-secret-value",
    "authorization=Basic dXNlcjpwYXNzd29yZA==",
    "tenant key cg-" + "k" * 43,
]


@pytest.mark.parametrize("text", SECRETS)
def test_credentials_are_masked_in_messages_and_tracebacks(text: str) -> None:
    """Whatever the shape, the secret part is gone, from the message and from the
    exception's text alike (JSON-escaped there)."""
    try:
        raise ValueError(text)
    except ValueError:
        failed = record(f"failed: {text}")
        failed.exc_info = sys.exc_info()
    line = JsonFormatter().format(failed)
    parsed = json.loads(line)
    for secret in ("abcdefghijklmnop", "plain-secret-value", "dXNlcjpw", "k" * 43):
        assert secret not in line
    assert "[redacted]" in parsed["message"]
    assert "[redacted]" in parsed["exception"]


def test_ordinary_text_is_left_alone() -> None:
    """Request ids, task names and words near ``key`` are not credentials."""
    text = "request cg-0123456789abcdef01234567 task-12345678 keyboard key=short"
    assert redact(text) == text


@pytest.fixture
def logging_state() -> Iterator[None]:
    """Put the root logger and the quieted libraries back as they were."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    levels = {name: logging.getLogger(name).level for name in ("httpx", "httpcore", "hpack")}
    yield
    for handler in root.handlers[:]:
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    for name, old in levels.items():
        logging.getLogger(name).setLevel(old)
    logging.captureWarnings(False)


@pytest.mark.usefixtures("logging_state")
def test_configured_logging_writes_json_lines_and_keeps_httpx_quiet() -> None:
    """Every logger writes JSON lines to the stream from the level up; httpx's
    per-request INFO lines are not written."""
    stream = io.StringIO()
    configure_logging("info", stream)
    logging.getLogger("contextgate.access").info("request", extra={"status": 200})
    logging.getLogger("some.library").info("Started")
    logging.getLogger("contextgate.exchange").debug("not at info")
    logging.getLogger("httpx").info('HTTP Request: POST http://upstream "HTTP/1.1 200 OK"')
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(line["logger"], line["message"]) for line in lines] == [
        ("contextgate.access", "request"),
        ("some.library", "Started"),
    ]
    assert lines[0]["status"] == 200


@pytest.mark.usefixtures("logging_state")
def test_an_unknown_level_is_refused() -> None:
    """A level that is not one of ``LEVELS`` is an error, not a silent default."""
    with pytest.raises(ValueError, match="unknown log level"):
        configure_logging("verbose", io.StringIO())
