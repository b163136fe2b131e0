"""Small requests: what contextgate adds to a one-message request and to a stream's first
byte, beside the bare relay on its own server stack (``bench/passthrough.py``), in one run.

    python -m bench.small [--rounds 7] [--requests 40] [--baseline DIR] [--litellm]
                          [--output docs/BENCHMARKS.md]

The targets: the mock upstream itself (``bench/peers_upstream.py``), the bare relay,
contextgate (this checkout) and, with ``--baseline``, contextgate served from the checkout
in DIR (with DIR/.venv's interpreter when there is one), so that a change is measured
against the code before it with both up at once; with ``--litellm``, LiteLLM's proxy as
``make bench-peers`` runs it (installed by ``bench/peer_envs.py`` on first use). Every
gateway is started as ``make bench-peers`` starts contextgate (default settings and
pipeline, in-memory store, ``--log-level warning``).

The requests are those of ``make bench-peers``: one user message on ``gpt-4.1``, not
streamed and streamed (timed to the first body bytes), each ending with a new numbered
turn. Two passes, each of ``--rounds`` rounds:

- *in turn*: every request goes to every target, in an order shuffled from request to
  request (seeded), so each target sits idle while the others answer;
- *back to back*: each target is sent its round's requests in a row (3 more first, not
  counted), the targets' order shuffled from round to round: a gateway with steady traffic.

A target's *added* latency in a round is the median of its requests less the median of the
mock's in the same round; the figures are the medians over rounds. The ratio the issue sets
(contextgate's added latency at most 1.25 times the bare relay's) is taken per round and
its median reported beside the ratio of the medians.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import statistics
import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from bench.overhead import ROOT, free_port
from bench.peers import DIRECT, Payload, Target, attempt, mock
from bench.peers_targets import BARE, Proxy, bare, contextgate, litellm, started
from bench.report import machine, short_head, write_block

START, END = "<!-- small:start -->", "<!-- small:end -->"
HEADING = "## Small requests beside the bare relay"
BASELINE = "contextgate before"
OURS = "contextgate"
LITELLM = "LiteLLM"

PAYLOADS = (
    Payload("1 message", (), 0),
    Payload("1 message, streamed (time to first byte)", (), 0, True),
)


def baseline(port: int, upstream: str, checkout: Path) -> Proxy:
    """contextgate served from ``checkout``, with its own virtualenv when it has one."""
    ours = contextgate(port, upstream)
    python = checkout / ".venv" / "bin" / "python"
    executable = str(python) if python.exists() else sys.executable
    env = {**ours.env, "PYTHONPATH": str(checkout.resolve())}
    return replace(ours, name=BASELINE, args=[executable, *ours.args[1:]], env=env)


def in_turn(
    targets: list[Target], payload: Payload, requests: int, shuffle: random.Random
) -> dict[str, list[float]]:
    """Milliseconds of each target's requests of one round, the order shuffled per request."""
    times: dict[str, list[float]] = {t.name: [] for t in targets}
    order = targets[:]
    for _ in range(requests):
        shuffle.shuffle(order)
        for target in order:
            if (ms := attempt(target, payload)) is not None:
                times[target.name].append(ms)
    return times


def back_to_back(
    targets: list[Target], payload: Payload, requests: int, shuffle: random.Random
) -> dict[str, list[float]]:
    """The same, each target sent its requests in a row (after 3 not counted)."""
    times: dict[str, list[float]] = {t.name: [] for t in targets}
    order = targets[:]
    shuffle.shuffle(order)
    for target in order:
        for n in range(3 + requests):
            ms = attempt(target, payload)
            if ms is not None and n >= 3:
                times[target.name].append(ms)
    return times


def added(rounds: list[dict[str, list[float]]]) -> dict[str, list[float]]:
    """Per target, per round: its median less the mock's (ms)."""
    out: dict[str, list[float]] = {}
    for times in rounds:
        direct = statistics.median(times[DIRECT])
        for name, series in times.items():
            if name != DIRECT and series:
                out.setdefault(name, []).append(statistics.median(series) - direct)
    out[DIRECT] = [statistics.median(times[DIRECT]) for times in rounds]
    return out


def ratio(a: list[float], b: list[float]) -> float:
    """The median over rounds of ``a / b``."""
    return statistics.median(x / y for x, y in zip(a, b, strict=True) if y > 0)


def report(
    results: dict[tuple[str, str], dict[str, list[float]]],
    names: list[str],
    args: argparse.Namespace,
    load: tuple[tuple[float, ...], tuple[float, ...]],
) -> str:
    date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    head = short_head(ROOT)
    command = f"python -m bench.small --rounds {args.rounds} --requests {args.requests}"
    if args.baseline is not None:
        base = short_head(args.baseline)
        command += f" --baseline <checkout of {base}>"
    if args.litellm:
        command += " --litellm"
    before, after = (", ".join(f"{x:.2f}" for x in avg) for avg in load)
    lines = [
        START,
        f"Measured {date} on {machine()}; `{command}` from {head}. Load average (1, 5, 15 min)"
        f" before the run {before}, after it {after}. Sequential requests on keep-alive"
        f" connections; {args.rounds} rounds of {args.requests} requests per target and pass;"
        " added = a round's median less the mock's in the same round, then the median over"
        " rounds; milliseconds. Ratios: of the medians, and in brackets the median of the"
        " rounds' ratios.",
        "",
    ]
    others = [n for n in names if n not in (DIRECT, BARE)]
    columns = " | ".join(f"{n} added" for n in others)
    ratios = [n for n in others if n != LITELLM]
    lines.append(
        "| request | pass | direct p50 | bare relay added | "
        + columns
        + "".join(f" | {n} / bare relay" for n in ratios)
        + (f" | {OURS} / {LITELLM}" if LITELLM in names else "")
        + " |"
    )
    width = 2 + len(others) + len(ratios) + (LITELLM in names)
    lines.append("|---|---|" + "---:|" * width)
    for (payload, mode), figures in results.items():
        med = {n: statistics.median(v) for n, v in figures.items()}
        cells = [payload, mode, f"{med[DIRECT]:.2f}", f"{med[BARE]:.2f}"]
        cells += [f"{med[n]:.2f}" for n in others]
        cells += [
            f"**{med[n] / med[BARE]:.2f}** ({ratio(figures[n], figures[BARE]):.2f})" for n in ratios
        ]
        if LITELLM in names:
            cells.append(
                f"{med[OURS] / med[LITELLM]:.3f} ({ratio(figures[OURS], figures[LITELLM]):.3f})"
            )
        lines.append("| " + " | ".join(cells) + " |")
    lines.append(END)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=40, help="per target, round and pass")
    parser.add_argument("--baseline", type=Path, help="a checkout of the code to compare with")
    parser.add_argument("--litellm", action="store_true", help="LiteLLM's proxy too")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "BENCHMARKS.md")
    parser.add_argument("--quick", action="store_true", help="a smoke run; writes nothing")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.requests = 2, 5
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    load_before = os.getloadavg()
    mock_port = free_port()
    upstream = f"http://127.0.0.1:{mock_port}/v1"
    proxies = [bare(free_port(), upstream), contextgate(free_port(), upstream)]
    if args.baseline is not None:
        proxies.append(baseline(free_port(), upstream, args.baseline))
    if args.litellm:
        proxies.append(litellm(free_port(), upstream))
    ports = {p.name: int(p.args[p.args.index("--port") + 1]) for p in proxies}
    results: dict[tuple[str, str], dict[str, list[float]]] = {}
    with contextlib.ExitStack() as stack:
        stack.enter_context(started(mock(mock_port), mock_port))
        for proxy in proxies:
            stack.enter_context(started(proxy, ports[proxy.name]))
        targets = [Target(DIRECT, mock_port, None)]
        targets += [Target(p.name, ports[p.name], None) for p in proxies]
        names = [t.name for t in targets]
        shuffle = random.Random(29)
        for payload in PAYLOADS:
            for target in targets:  # connections, caches and lazy imports, on every path
                for _ in range(5):
                    attempt(target, payload)
            passes: dict[str, list[dict[str, list[float]]]] = {"in turn": [], "back to back": []}
            for _ in range(args.rounds):
                # The two passes alternate round by round, so both see the same phases.
                passes["in turn"].append(in_turn(targets, payload, args.requests, shuffle))
                passes["back to back"].append(
                    back_to_back(targets, payload, args.requests, shuffle)
                )
            for mode, rounds in passes.items():
                figures = results[(payload.name, mode)] = added(rounds)
                print(
                    f"{payload.name}, {mode}: "
                    + ", ".join(f"{n} {statistics.median(v):.2f}" for n, v in figures.items())
                )
        for target in targets:
            for name, errors in target.failures.items():
                print(f"{target.name} failed {len(errors)} x {name}: {errors[0]}")
            target.client.close()
    block = report(results, names, args, (load_before, os.getloadavg()))
    print(block)
    if not args.quick:
        write_block(args.output, START, END, block, HEADING)


if __name__ == "__main__":
    main()
