"""The ``contextgate`` command: ``compact`` offline, ``serve`` as a real process, and
``hash-key``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from gateway.cli import main
from gateway.tenancy.tenants import hash_key
from tests.harness import free_port
from tests.mock_upstream import JSONReply, MockUpstream, chat_completion

REQUEST = {
    "model": "gpt-4o",
    "messages": [{"role": "user", "content": "Plan the trip."}],
    "max_tokens": 500,
}


def test_compact_prints_request_and_report(tmp_path: Path, capsys: object) -> None:
    """``contextgate compact FILE --model --policy`` prints {request, report} as JSON."""
    path = tmp_path / "request.json"
    path.write_text(json.dumps(REQUEST))
    assert main(["compact", str(path), "--model", "gpt-4.1", "--policy", "max-input=9000"]) == 0
    output = json.loads(capsys.readouterr().out)  # type: ignore[attr-defined]
    assert output["request"] == REQUEST
    assert output["report"]["model"] == "gpt-4.1"
    assert output["report"]["budget"] == 9_000
    assert len(output["report"]["stages"]) == 11


def test_compact_reports_bad_input_and_exits_2(tmp_path: Path, capsys: object) -> None:
    """A bad request file, a bad policy or a missing file exits 2 with a one-line reason."""
    bad = tmp_path / "bad.json"
    bad.write_text("{oops")
    good = tmp_path / "good.json"
    good.write_text(json.dumps(REQUEST))
    assert main(["compact", str(bad)]) == 2
    assert "invalid_json" in capsys.readouterr().err  # type: ignore[attr-defined]
    assert main(["compact", str(good), "--policy", "trigger=3"]) == 2
    assert "trigger" in capsys.readouterr().err  # type: ignore[attr-defined]
    assert main(["compact", str(tmp_path / "absent.json")]) == 2
    assert "absent.json" in capsys.readouterr().err  # type: ignore[attr-defined]


def test_serve_runs_the_gateway(upstream: MockUpstream, tmp_path: Path) -> None:
    """``contextgate serve --port`` with only CONTEXTGATE_UPSTREAM_BASE_URL set serves the
    SDK, passes the caller's key through, and stops cleanly on SIGTERM."""
    port = free_port()
    env = {**os.environ, "CONTEXTGATE_UPSTREAM_BASE_URL": upstream.base_url}
    env.pop("CONTEXTGATE_CONFIG", None)
    env.pop("REDIS_URL", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None, process.stderr.read()  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "gateway did not start"
            time.sleep(0.1)
        upstream.push(JSONReply(chat_completion("served")))
        with openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-mine", max_retries=0
        ) as client:
            completion = client.chat.completions.create(
                model="gpt-4o", messages=REQUEST["messages"]
            )  # type: ignore[arg-type]
        assert completion.choices[0].message.content == "served"
        assert upstream.received[0].headers["authorization"] == "Bearer sk-mine"
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(15)
        process.stdout.close()  # type: ignore[union-attr]
        errors = process.stderr.read().decode()  # type: ignore[union-attr]
        process.stderr.close()  # type: ignore[union-attr]
    # uvicorn shuts down gracefully, then re-raises the signal it caught.
    assert code in (0, -signal.SIGTERM)
    assert "Traceback" not in errors


def test_serve_refuses_bad_config(tmp_path: Path, capsys: object) -> None:
    """A bad configuration stops ``serve`` before it binds, with exit code 2."""
    path = tmp_path / "bad.yaml"
    path.write_text("upstream:\n  base_url: nope\n")
    assert main(["serve", "--config", str(path), "--port", str(free_port())]) == 2
    assert "http(s) URL" in capsys.readouterr().err  # type: ignore[attr-defined]


def test_serve_refuses_a_port_out_of_range(capsys: object) -> None:
    """A port outside 1-65535 is refused before anything starts."""
    with pytest.raises(SystemExit) as caught:
        main(["serve", "--port", "99999"])
    assert caught.value.code == 2
    assert "not a TCP port" in capsys.readouterr().err  # type: ignore[attr-defined]


def test_serve_refuses_an_unknown_log_level(capsys: object) -> None:
    """A log level that is not one of uvicorn's is refused before anything starts."""
    assert main(["serve", "--port", str(free_port()), "--log-level", "verbose"]) == 2
    assert "unknown log level 'verbose'" in capsys.readouterr().err  # type: ignore[attr-defined]


def test_compact_reports_nesting_too_deep(tmp_path: Path, capsys: object) -> None:
    """A request nested too deeply is refused with its code, not a traceback."""
    path = tmp_path / "deep.json"
    deep = "[" * 300 + "]" * 300
    path.write_text(
        '{"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}], "x": ' + deep + "}"
    )
    assert main(["compact", str(path)]) == 2
    assert "nesting_too_deep" in capsys.readouterr().err  # type: ignore[attr-defined]


ALPHA, BETA = "cg-alpha-key-0123456789abcdef", "cg-beta-key-0123456789abcdef"


def test_hash_key_command() -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "hash-key"],
        input=ALPHA + "\n",
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert printed == hash_key(ALPHA)
    new = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "hash-key", "--new"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert len(new) == 2
    assert hash_key(new[0]) == new[1]
