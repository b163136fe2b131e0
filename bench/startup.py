"""Start-up and memory at rest: how soon ``contextgate serve`` answers ``/readyz`` after
exec, what its first request costs against warm ones, how much memory it holds idle, and
how long ``contextgate compact FILE`` takes, from a new process each time.

    python -m bench.startup [--starts 10] [--output docs/BENCHMARKS.md]
    python -m bench.startup --baseline DIR    # beside a checkout of another commit

Each start: exec ``python -m gateway.cli serve`` (in front of this module's mock upstream,
``tests.mock_upstream``, in its own process), poll ``/readyz`` every 5 ms until it answers
200 (the time from exec), wait until the background warm-up has had time to finish, then
send one small chat request (the first) and 20 more (warm; their median), read the
process's RSS, then twice leave it idle for as long again and time one more request (warm
after the same rest: on this machine a request after a few idle seconds costs about twice
one sent back to back, the mock's own included, since the idle cores' caches and clocks
have to come back; the first request's ratio to these is what the gateway's start-up
itself costs it), and stop it. With ``--baseline`` the checkout in DIR is started the same
way in alternation (its own .venv's interpreter when it has one, else this one with DIR
first on the path), so both are measured in the same minutes. ``compact`` runs over a
20K-token request built from the tau-bench airline trajectories.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.overhead import answers, free_port, history, process
from bench.report import publish
from pipelines import TokenCounter

ROOT = Path(__file__).resolve().parent.parent
RESULTS_START = "<!-- startup:start -->"
RESULTS_END = "<!-- startup:end -->"
HEADING = "## Start-up and memory at rest"
SMALL = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Hi"}]}
SETTLE = 3.0
"""Seconds after ``/readyz`` before the first request: the background warm-up's time (the
o200k encoding, about 0.5 s) with room for a loaded host."""


@dataclass
class Target:
    name: str
    python: str
    env: dict[str, str]
    cwd: Path
    ready: list[float] = field(default_factory=list)
    first: list[float] = field(default_factory=list)
    warm: list[float] = field(default_factory=list)
    rss_idle: list[float] = field(default_factory=list)
    rss_after: list[float] = field(default_factory=list)
    rested: list[float] = field(default_factory=list)
    compact: list[float] = field(default_factory=list)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def start_once(target: Target, upstream: str) -> None:
    port = free_port()
    env = {**target.env, "CONTEXTGATE_UPSTREAM_BASE_URL": upstream}
    args = [target.python, "-m", "gateway.cli", "serve", "--port", str(port)]
    args += ["--log-level", "warning"]
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as stderr:
        began = time.perf_counter()
        proc = subprocess.Popen(
            args, env=env, cwd=target.cwd, stdout=subprocess.DEVNULL, stderr=stderr
        )
        try:
            with httpx.Client(timeout=30) as client:
                while True:
                    try:
                        if client.get(f"{url}/readyz", timeout=1).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    if proc.poll() is not None or time.perf_counter() - began > 60:
                        stderr.seek(0)
                        raise RuntimeError(f"{target.name} did not start: {stderr.read()!r}")
                    time.sleep(0.005)
                target.ready.append(time.perf_counter() - began)
                time.sleep(SETTLE)
                target.rss_idle.append(rss_mib(proc.pid))
                timings = [small_ms(client, f"{url}/v1") for _ in range(21)]
                target.first.append(timings[0])
                target.warm.append(statistics.median(timings[1:]))
                target.rss_after.append(rss_mib(proc.pid))
                for _ in range(2):
                    time.sleep(SETTLE)
                    target.rested.append(small_ms(client, f"{url}/v1"))
        finally:
            proc.terminate()
            proc.wait(15)


def mock_at_rest(upstream: str, rests: int = 5) -> tuple[float, float]:
    """The mock alone, asked directly: its median after ``SETTLE`` seconds at rest and
    back to back (ms), to show what a rest costs a request on this machine anyway."""
    rested, warm = [], []
    with httpx.Client(timeout=30) as client:
        for _ in range(rests):
            time.sleep(SETTLE)
            for i in range(21):
                (warm if i else rested).append(small_ms(client, upstream))
    return statistics.median(rested), statistics.median(warm)


def small_ms(client: httpx.Client, base: str) -> float:
    """Milliseconds one small chat request to ``base`` (a ``/v1`` URL) took to answer."""
    sent = time.perf_counter()
    answer = client.post(f"{base}/chat/completions", json=SMALL)
    took = (time.perf_counter() - sent) * 1000
    answer.raise_for_status()
    return took


def compact_once(target: Target, request: Path) -> None:
    began = time.perf_counter()
    subprocess.run(
        [target.python, "-m", "gateway.cli", "compact", str(request)],
        env=target.env,
        cwd=target.cwd,
        stdout=subprocess.DEVNULL,
        check=True,
    )
    target.compact.append(time.perf_counter() - began)


def table(targets: list[Target]) -> list[str]:
    def med(values: list[float]) -> float:
        return statistics.median(values)

    lines = [
        "| target | `/readyz` after exec: median (min-max) | first request | warm request"
        " (median of 20) | first / warm | warm after the same rest | first / warm after"
        " rest | RSS idle | RSS after 21 requests | `compact FILE` (20K tokens) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in targets:
        first, warm, rested = med(t.first), med(t.warm), med(t.rested)
        lines.append(
            f"| {t.name} | {med(t.ready):.2f} s ({min(t.ready):.2f}-{max(t.ready):.2f})"
            f" | {first:.1f} ms | {warm:.1f} ms | {first / warm:.2f}"
            f" | {rested:.1f} ms | {first / rested:.2f}"
            f" | {med(t.rss_idle):.0f} MiB | {med(t.rss_after):.0f} MiB"
            f" | {med(t.compact):.2f} s ({min(t.compact):.2f}-{max(t.compact):.2f}) |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--baseline", type=Path, help="a checkout of another commit")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "BENCHMARKS.md")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONTEXTGATE_", "OTEL_"))}
    targets = [Target("contextgate", sys.executable, env, ROOT)]
    if args.baseline is not None:
        baseline = args.baseline.resolve()
        own = baseline / ".venv" / "bin" / "python"
        targets.insert(
            0,
            Target(
                f"before ({baseline.name})",
                str(own) if own.exists() else sys.executable,
                {**env, "PYTHONPATH": str(baseline)},
                baseline,
            ),
        )
    # Byte-compiled as an installed package is (where PYTHONDONTWRITEBYTECODE is set, each
    # start would compile the sources again).
    for target in targets:
        subprocess.run(
            [target.python, "-m", "compileall", "-q", "gateway", "pipelines"],
            cwd=target.cwd,
            env=target.env,
            stdout=subprocess.DEVNULL,
            check=True,
        )
    mock_port = free_port()
    mock = [sys.executable, "-m", "tests.mock_upstream", "--port", str(mock_port)]
    body = {"model": "gpt-4o", "messages": history(20_000, TokenCounter("o200k_base"))}
    with (
        tempfile.NamedTemporaryFile("w", suffix=".json") as request,
        process(mock, env, answers(f"http://127.0.0.1:{mock_port}/v1/models"), cwd=ROOT),
    ):
        json.dump(body, request)
        request.flush()
        upstream = f"http://127.0.0.1:{mock_port}/v1"
        mock_rested, mock_warm = mock_at_rest(upstream)
        for round_ in range(args.starts):
            for target in targets if round_ % 2 == 0 else targets[::-1]:
                start_once(target, upstream)
                compact_once(target, Path(request.name))
            print(f"round {round_ + 1}/{args.starts}", file=sys.stderr)
    how = (
        f"{args.starts} starts of each, alternating; load average at the end"
        f" {os.getloadavg()[0]:.1f}. `python -m bench.startup"
        + (f" --baseline {args.baseline}" if args.baseline else "")
        + f"`. The mock alone, asked directly: {mock_rested:.1f} ms after {SETTLE:.0f} s"
        f" at rest, {mock_warm:.1f} ms back to back (medians of 5 and 100)."
    )
    publish(args.output, (RESULTS_START, RESULTS_END), HEADING, how, table(targets))


if __name__ == "__main__":
    main()
