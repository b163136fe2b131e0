"""Gateway overhead: the same requests sent directly to a mock upstream, through a bare
passthrough proxy (``bench/passthrough.py``) and through contextgate, interleaved in one
run, so the differences are the cost of the extra hop and of contextgate's own work.

    python -m bench.overhead [--requests 300] [--output docs/BENCHMARKS.md]
    python -m bench.overhead --baseline DIR   # beside a checkout of another commit
    python -m bench.overhead --config FILE    # this gateway with a YAML configuration

With ``--baseline``, a fourth target joins the rotation: the gateway served from the
checkout in DIR (with DIR/.venv's interpreter when there is one), so that a change is
measured against the code before it in one run, both servers up, their requests
interleaved; the comparison goes to its own block of the output. ``--config`` serves this
checkout's gateway (not the baseline's) with a configuration file, e.g. to measure with a
feature off beside the baseline; the block then names the file.

The mock upstream, the passthrough and the gateway (``contextgate serve``, uvicorn with
its default event loop and HTTP parser) each run in their own process on loopback; this
process is the client. Histories are built from the real tau-bench airline trajectories
in bench/data.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.load import closed_loop
from bench.report import machine, quantile, short_head, write_block
from pipelines import TokenCounter

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "bench" / "data" / "tau-bench-gpt-4o-airline.json"
RESULTS_START = "<!-- overhead:start -->"
RESULTS_END = "<!-- overhead:end -->"
BASELINE_START = "<!-- overhead-baseline:start -->"
BASELINE_END = "<!-- overhead-baseline:end -->"
BASELINE_HEADING = "## Overhead against the commit before"


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def process(
    args: list[str], env: dict[str, str], ready: Callable[[], bool], cwd: Path | None = None
) -> Iterator[None]:
    # stderr to a file, not a pipe nobody reads: the gateway logs a line per request.
    with tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=stderr, cwd=cwd)
        try:
            deadline = time.monotonic() + 30
            while not ready():
                if proc.poll() is not None or time.monotonic() > deadline:
                    stderr.seek(0)
                    raise RuntimeError(f"{args[:3]} did not start: {stderr.read()!r}")
                time.sleep(0.05)
            yield
        finally:
            proc.terminate()
            proc.wait(15)


def answers(url: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            httpx.get(url, timeout=0.5)
        except httpx.TransportError:
            return False
        return True

    return check


def history(target_tokens: int, counter: TokenCounter) -> list[dict[str, Any]]:
    """Real agent messages (system prompt, then whole trajectories) up to about ``target``."""
    trajectories = json.loads(DATA.read_text())
    messages: list[dict[str, Any]] = [trajectories[0]["traj"][0]]
    total = counter.count_messages(messages)
    for trajectory in trajectories:
        for message in trajectory["traj"][1:]:
            message = {k: v for k, v in message.items() if v is not None or k == "content"}
            cost = counter.count_message(message)
            if total + cost > target_tokens and message["role"] == "user":
                return messages
            messages.append(message)
            total += cost
    return messages


def uniquely(messages: list[dict[str, Any]], nonce: str) -> list[dict[str, Any]]:
    """The same history with every message's text made unique (a cold cache)."""
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            message = {**message, "content": f"[{nonce}] {content}"}
        out.append(message)
    return out


IDLE = 0.02


@dataclass
class Scenario:
    name: str
    bodies: Callable[[int], bytes]
    stream: bool = False
    cold: bool = False
    """Each request gets a body never sent before, on either path."""
    idle: float = 0.0
    """Seconds every target sits idle before each request: as in ``bench/peers.py``, where
    each proxy waits while the others answer, so its caches are cold and its process must
    be woken (on this machine that doubles what a hop costs)."""


def measure(client: httpx.Client, url: str, body: bytes, stream: bool) -> tuple[float, float]:
    """Milliseconds to the whole response (or, streaming, to the first body bytes), and the
    gateway's own time as it reports it (0 for the direct path)."""
    headers = {"content-type": "application/json", "authorization": "Bearer sk-bench"}
    started = time.perf_counter()
    if stream:
        with client.stream("POST", url, content=body, headers=headers) as response:
            chunks = response.iter_raw()
            next(chunks)
            elapsed = time.perf_counter() - started
            for _ in chunks:
                pass
    else:
        response = client.post(url, content=body, headers=headers)
        elapsed = time.perf_counter() - started
    if response.status_code != 200:
        raise RuntimeError(f"{url} answered {response.status_code}: {response.text[:200]}")
    return elapsed * 1000, float(response.headers.get("x-contextgate-overhead-ms", 0))


def run_scenario(
    client: httpx.Client, targets: dict[str, str], scenario: Scenario, n: int
) -> dict[str, Any]:
    """``n`` rounds; each round sends the scenario's request to every target, in an order
    shuffled from round to round (seeded), never starting with the target the round before
    ended with. A rotating order would have each target always follow the same other one,
    and what a process does after its answer (its access line, a ledger entry) competes
    for the cores with whichever request comes next. Cold scenarios send every target a
    new body."""
    names = list(targets)
    for i in range(5):  # open and warm every path's connections
        for name in names:
            measure(
                client,
                targets[name],
                scenario.bodies(-1 - i - 10 * names.index(name)),
                scenario.stream,
            )
    times: dict[str, list[float]] = {name: [] for name in names}
    own: list[float] = []
    shuffle = random.Random(n).shuffle
    order = names  # the warm-up's
    for i in range(n):
        previous, order = order[-1], names[:]
        shuffle(order)
        while order[0] == previous:
            shuffle(order)
        for position, name in enumerate(order):
            index = i * len(names) + position if scenario.cold else i
            if scenario.idle:
                time.sleep(scenario.idle)
            elapsed, reported = measure(
                client, targets[name], scenario.bodies(index), scenario.stream
            )
            times[name].append(elapsed)
            if name == "gateway":
                own.append(reported)
    row: dict[str, Any] = {"name": scenario.name, "bytes": len(scenario.bodies(0))}
    for name in names:
        row[f"{name}_p50"] = statistics.median(times[name])
        row[f"{name}_p99"] = quantile(times[name], 0.99)
    row["own_p50"] = statistics.median(own)
    return row


def tokenizer_floor(messages: list[dict[str, Any]], runs: int = 15) -> float:
    """Median milliseconds to tokenize every message of ``messages`` exactly, uncached,
    in this process: the least a cold exact count can cost."""
    counter = TokenCounter()
    times = []
    for run in range(runs):
        fresh = uniquely(messages, f"floor-{run}")
        started = time.perf_counter()
        for message in fresh:
            counter.measure(message)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def write_results(
    output: Path,
    rows: list[dict[str, Any]],
    rps: dict[int, dict[str, float]],
    n: int,
    floor: float,
) -> str:
    date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        RESULTS_START,
        f"Measured {date} on {machine()}; `make bench` (`python -m bench.overhead"
        f" --requests {n}`). Each row: {n} rounds (a third of that for the long histories),"
        " each sending the request straight to the mock, through the bare passthrough and"
        " through contextgate, in an order shuffled from round to round; sequential,"
        " keep-alive; milliseconds.",
        "",
        "| scenario | body | direct p50 | bare passthrough p50 | contextgate p50 |"
        " contextgate overhead p50 | passthrough overhead p50 | contextgate's own p50 |"
        " contextgate p99 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines.extend(
        f"| {row['name']} | {row['bytes'] / 1024:.0f} KB | {row['direct_p50']:.2f} |"
        f" {row['passthrough_p50']:.2f} | {row['gateway_p50']:.2f} |"
        f" **{row['gateway_p50'] - row['direct_p50']:.2f}** |"
        f" {row['passthrough_p50'] - row['direct_p50']:.2f} | {row['own_p50']:.2f} |"
        f" {row['gateway_p99']:.2f} |"
        for row in rows
    )
    lines += [
        "",
        "Throughput, small request, closed loop (`bench/load.py`, keep-alive connections,"
        " 8 s each): "
        + "; ".join(
            f"{c} connections: direct {r['direct']:.0f} req/s, bare passthrough"
            f" {r['passthrough']:.0f} req/s, contextgate {r['gateway']:.0f} req/s"
            for c, r in rps.items()
        )
        + ". The load generator, the gateway and the mock share the machine's 2 cores, and the"
        " gateway is one process on one core.",
        "",
        f"Exact tokenization of the 60K-token history's messages, uncached, in one process in"
        f" the same run: {floor:.2f} ms (the least any exact cold count costs; the gateway's own"
        " time on that row is this plus the warm-path work).",
        RESULTS_END,
    ]
    block = "\n".join(lines)
    write_block(output, RESULTS_START, RESULTS_END, block)
    return block


def write_baseline(
    output: Path, rows: list[dict[str, Any]], n: int, baseline: Path, config: Path | None = None
) -> str:
    """The comparison with the baseline checkout, as its own block of ``output``."""
    date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    head = short_head(baseline)
    ours = short_head(ROOT)
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    changes = " (with the working tree's changes)" if dirty else ""
    lines = [
        BASELINE_START,
        f"Measured {date} on {machine()}; `python -m bench.overhead --requests {n}"
        f" --baseline <checkout of {head}>{' --config ' + config.name if config else ''}`"
        f" from {ours}{changes}{' (the configuration for this gateway only)' if config else ''}:"
        " both gateways up at once, every round sending the request to the mock, the bare"
        " passthrough, this gateway and the baseline's, in an order shuffled from round to"
        " round; milliseconds,"
        " medians of the round's requests; added = p50 less the direct p50.",
        "",
        "| scenario | direct p50 | baseline p50 | contextgate p50 | baseline added |"
        " contextgate added | added, contextgate / baseline |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        base = row["baseline_p50"] - row["direct_p50"]
        mine = row["gateway_p50"] - row["direct_p50"]
        ratio = f"{mine / base:.2f}" if base > 0 else "-"
        lines.append(
            f"| {row['name']} | {row['direct_p50']:.2f} | {row['baseline_p50']:.2f} |"
            f" {row['gateway_p50']:.2f} | {base:.2f} | {mine:.2f} | {ratio} |"
        )
    lines.append(BASELINE_END)
    block = "\n".join(lines)
    write_block(output, BASELINE_START, BASELINE_END, block, BASELINE_HEADING)
    return block


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "BENCHMARKS.md")
    parser.add_argument("--baseline", type=Path, help="a checkout of the code to compare with")
    parser.add_argument(
        "--config", type=Path, help="a YAML configuration for this gateway (not the baseline's)"
    )
    args = parser.parse_args()
    n = args.requests

    counter = TokenCounter()
    small = [{"role": "user", "content": "Say hello."}]
    mid = history(20_000, counter)
    big = history(120_000, counter)
    near = history(60_000, counter)
    print(f"histories: {counter.count_messages(mid)} and {counter.count_messages(big)} tokens")

    def body(model: str, messages: list[dict[str, Any]], stream: bool = False) -> bytes:
        return orjson.dumps({"model": model, "messages": messages, "stream": stream})

    small_body = body("gpt-4o", small)
    stream_body = body("gpt-4o", small, stream=True)
    mid_body = body("gpt-4o", mid)

    def warm(i: int) -> bytes:
        turn = {"role": "user", "content": f"And what about reservation number {i}?"}
        return body("gpt-4.1", [*big, turn])

    def cold(i: int) -> bytes:
        return body("gpt-4.1", uniquely(big, f"run-{i}"))

    def cold_exact(i: int) -> bytes:
        return body("gpt-4o", uniquely(near, f"run-{i}"))

    scenarios = [
        Scenario("1 message", lambda i: small_body),
        Scenario("1 message, streamed (time to first byte)", lambda i: stream_body, stream=True),
        Scenario("20K-token history", lambda i: mid_body),
        Scenario("120K-token history on gpt-4.1, warm", warm),
        Scenario("120K-token history on gpt-4.1, cold (estimated)", cold, cold=True),
        Scenario("60K-token history on gpt-4o, cold (counted exactly)", cold_exact, cold=True),
        Scenario("1 message, each after 20 ms idle", lambda i: small_body, idle=IDLE),
        Scenario("20K-token history, each after 20 ms idle", lambda i: mid_body, idle=IDLE),
        Scenario("120K-token history on gpt-4.1, warm, each after 20 ms idle", warm, idle=IDLE),
    ]

    mock_port, gateway_port, passthrough_port = free_port(), free_port(), free_port()
    baseline_port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("REDIS_URL", None)
    env.pop("CONTEXTGATE_CONFIG", None)
    targets = {
        name: f"http://127.0.0.1:{port}/v1/chat/completions"
        for name, port in (
            ("direct", mock_port),
            ("passthrough", passthrough_port),
            ("gateway", gateway_port),
        )
    }
    if args.baseline is not None:
        targets["baseline"] = f"http://127.0.0.1:{baseline_port}/v1/chat/completions"
    upstream = f"http://127.0.0.1:{mock_port}/v1"
    passthrough_cmd = [
        sys.executable,
        "-m",
        "bench.passthrough",
        "--port",
        str(passthrough_port),
        "--upstream",
        upstream,
    ]
    mock_cmd = [sys.executable, "-m", "tests.mock_upstream", "--port", str(mock_port)]
    gateway_cmd = [sys.executable, "-m", "gateway.cli", "serve", "--port", str(gateway_port)]
    configured = [] if args.config is None else ["--config", str(args.config.resolve())]
    gateway_env = {**env, "CONTEXTGATE_UPSTREAM_BASE_URL": upstream}
    baseline = contextlib.nullcontext()
    if args.baseline is not None:
        # The checkout's own virtualenv when it has one (``make install`` there), so that
        # nothing of this tree's can be imported in its place.
        python = args.baseline / ".venv" / "bin" / "python"
        executable = str(python) if python.exists() else sys.executable
        baseline_cmd = [executable, *gateway_cmd[1:-1], str(baseline_port)]
        baseline_env = {**gateway_env, "PYTHONPATH": str(args.baseline.resolve())}
        ready = answers(f"http://127.0.0.1:{baseline_port}/healthz")
        baseline = process(baseline_cmd, baseline_env, ready, cwd=args.baseline)
    with (
        process(mock_cmd, env, answers(f"http://127.0.0.1:{mock_port}/v1/models")),
        process(
            [*gateway_cmd, *configured],
            gateway_env,
            answers(f"http://127.0.0.1:{gateway_port}/healthz"),
        ),
        process(passthrough_cmd, env, answers(f"http://127.0.0.1:{passthrough_port}/")),
        baseline,
        httpx.Client(timeout=60) as client,
    ):
        rows = []
        for scenario in scenarios:
            count = n if "K-token" not in scenario.name else max(20, n // 3)
            row = run_scenario(client, targets, scenario, count)
            print(
                f"{row['name']:52s} direct {row['direct_p50']:6.2f}  passthrough"
                f" {row['passthrough_p50']:6.2f}  contextgate {row['gateway_p50']:6.2f}"
                f"  (own {row['own_p50']:.2f}) ms"
                + (f"  baseline {row['baseline_p50']:6.2f}" if "baseline_p50" in row else "")
            )
            rows.append(row)
        if args.baseline is not None:
            print(write_baseline(args.output, rows, n, args.baseline, args.config))
            return
        rps: dict[int, dict[str, float]] = {}
        ports = {"direct": mock_port, "passthrough": passthrough_port, "gateway": gateway_port}
        for concurrency in (8, 64):
            rps[concurrency] = {
                name: asyncio.run(
                    closed_loop(
                        port, "/v1/chat/completions", small_body, concurrency=concurrency, seconds=8
                    )
                )[0]
                for name, port in ports.items()
            }
            print(f"throughput at {concurrency} connections (req/s): {rps[concurrency]}")
    floor = tokenizer_floor(near)
    print(f"exact tokenization of the 60K history, in process: {floor:.2f} ms")
    print(write_results(args.output, rows, rps, n, floor))


if __name__ == "__main__":
    main()
