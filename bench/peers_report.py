"""The peer comparison's results block in docs/BENCHMARKS.md: who was measured and how they
were configured, the latency and throughput table, memory, and what each peer could not
do."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.peers_targets import BARE, Proxy
from bench.report import publish
from pipelines import TokenCounter

START, END = "<!-- peers:start -->", "<!-- peers:end -->"
HEADING = "## Peers: LiteLLM and Headroom in front of the same mock (`make bench-peers`)"

NOTES = [
    "Headroom's own rate limiter (on by default: 60 requests a minute) answers 429 to a"
    " benchmark within seconds; it is turned off (`--no-rate-limit`) so that the proxying"
    " itself is measured. contextgate's admission and overload shedding stay as shipped:"
    ' a 503 with `Retry-After` under load is counted under "What failed".',
    "Headroom also keeps a response cache (on by default): a request identical to an earlier"
    " one is answered from it without reaching the upstream. Every request here ends with a"
    " new user turn, as an agent's next request does, so none is answered from it.",
    "This machine reaches no network but the package registries. tiktoken's o200k and"
    " cl100k rank files are supplied to the peers in a private tiktoken cache (what tiktoken"
    " keeps after its first download); LiteLLM uses its bundled model price map;"
    " Hugging Face downloads are off, so **Headroom's Kompress model (ML compression) could"
    " not be loaded** and Headroom ran with Kompress unavailable (its /health says"
    " `degraded`, optional): its figures leave out whatever Kompress would cost.",
]


@dataclass(frozen=True)
class Sent:
    """One kind of request as the report describes it."""

    name: str
    size: int
    """Bytes of the body."""
    per_round: int
    stream: bool
    messages: int


@dataclass
class Figures:
    """Everything one run measured."""

    rounds: int
    connections: int
    seconds: float
    load_rounds: int
    sent: list[Sent]
    proxies: list[Proxy] = field(default_factory=list)
    forwarded: dict[tuple[str, str], str] = field(default_factory=dict)
    latency: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    """Payload -> target -> p50, p99, added_p50, added_p99, count."""
    latency_in_runs: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    """The same, each target sent its requests back to back."""
    rps: dict[str, dict[str, float]] = field(default_factory=dict)
    rest: dict[str, float] = field(default_factory=dict)
    peak: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    processes: dict[str, int] = field(default_factory=dict)
    failures: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)
    sequential: dict[str, int] = field(default_factory=dict)
    """Bytes of each proxy's log written before the load began (the sequential requests)."""
    load: tuple[tuple[float, ...], tuple[float, ...]] = ((), ())
    minutes: float = 0.0


def compare(sent: dict[str, Any], got: dict[str, Any], counter: TokenCounter) -> str:
    """A short account of how the body the mock received differs from the one sent."""
    added, removed = sorted(set(got) - set(sent)), sorted(set(sent) - set(got))
    fields = (f"; added {', '.join(added)}" if added else "") + (
        f"; removed {', '.join(removed)}" if removed else ""
    )
    messages = got.get("messages", [])
    if messages == sent["messages"]:
        return "messages unchanged" + fields
    if [without_nulls(m) for m in messages] == [without_nulls(m) for m in sent["messages"]]:
        return "messages unchanged but for `null` fields dropped" + fields
    before, after = counter.count_messages(sent["messages"]), counter.count_messages(messages)
    changed = sum(1 for a, b in zip(sent["messages"], messages, strict=False) if a != b)
    return (
        f"messages changed: {len(sent['messages'])} -> {len(messages)} messages,"
        f" {changed} rewritten, {before:,} -> {after:,} tokens{fields}"
    )


def without_nulls(message: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in message.items() if v is not None}


def cell(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def row_cells(row: dict[str, float] | None, *, over: bool) -> str:
    """p50, p99, added p50 (bold) and added p99 of one target, as table cells."""
    if row is None:
        return "— | — | " + ("— | —" if over else " | ")
    head = f"{cell(row['p50'])} | {cell(row['p99'])}"
    if not over:
        return head + " |  | "
    return head + f" | **{cell(row['added_p50'])}** | {cell(row['added_p99'])}"


def latency_table(figures: Figures) -> list[str]:
    lines = [
        "| request | target | p50 ms | p99 ms | added p50 | added p99 | req/s |"
        " what the mock received |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    names = ["direct", *(p.name for p in figures.proxies)]
    for sent in figures.sent:
        title = f"{sent.name} ({sent.size / 1024:,.0f} KB)" if sent.size > 4096 else sent.name
        for name in names:
            row = figures.latency.get(sent.name, {}).get(name)
            rps = figures.rps.get(sent.name, {}).get(name)
            lines.append(
                f"| {title} | {name} | {row_cells(row, over=name != 'direct')} |"
                f" {cell(rps, 0) if not sent.stream else ''} |"
                f" {figures.forwarded.get((name, sent.name), '') if name != 'direct' else ''} |"
            )
    return lines


def in_runs_table(figures: Figures) -> list[str]:
    """Added p50 per request kind and target, each target sent its requests back to back."""
    names = [p.name for p in figures.proxies]
    lines = [
        "| request | direct p50 | " + " | ".join(f"{n} added p50" for n in names) + " |",
        "|---|---:|" + "---:|" * len(names),
    ]
    for sent in figures.sent:
        rows = figures.latency_in_runs.get(sent.name, {})
        direct = rows.get("direct")
        cells = [cell(rows[n]["added_p50"]) if n in rows else "—" for n in names]
        lines.append(
            f"| {sent.name} | {cell(direct['p50']) if direct else '—'} | {' | '.join(cells)} |"
        )
    return lines


def ratios(
    figures: Figures, latency: dict[str, dict[str, dict[str, float]]] | None = None
) -> list[str]:
    """contextgate's added p50 as a share of each peer's, per request kind (of ``latency``:
    by default the rotating pass's), and the bare stack's beside it: the least any gateway
    on that stack could get."""
    latency = figures.latency if latency is None else latency
    lines = []
    for sent in figures.sent:
        rows = latency.get(sent.name, {})
        ours, floor = rows.get("contextgate"), rows.get(BARE)
        parts = []
        for peer, target in (("LiteLLM", 1 / 5), ("Headroom", 1 / 10)):
            theirs = rows.get(peer)
            if ours is None or theirs is None or theirs["added_p50"] <= 0:
                parts.append(f"{peer}: —")
                continue
            share = ours["added_p50"] / theirs["added_p50"]
            verdict = "met" if share <= target else "not met"
            least = (
                ""
                if floor is None
                else f", bare stack {floor['added_p50'] / theirs['added_p50']:.2f}"
            )
            parts.append(f"{share:.2f} of {peer}'s (target {target:.1f}: {verdict}{least})")
        lines.append(f"- {sent.name}: " + "; ".join(parts))
    return lines


def memory_table(figures: Figures) -> list[str]:
    lines = [
        "| proxy | processes | RSS at rest | peak RSS during the run | RSS after the load |",
        "|---|---:|---:|---:|---:|",
    ]
    for proxy in figures.proxies:
        name = proxy.name
        lines.append(
            f"| {name} | {figures.processes.get(name, 0)} | {cell(figures.rest.get(name), 0)} |"
            f" {cell(figures.peak.get(name), 0)} | {cell(figures.after.get(name), 0)} |"
        )
    return lines


def could_not(figures: Figures) -> list[str]:
    """One line per target that failed anything, with the first error of each kind."""
    lines = []
    for name, failures in figures.failures.items():
        for payload, errors in failures.items():
            lines.append(f"- {name}, {payload}: {len(errors)} failed; first: `{errors[0][:240]}`")
    for name, log in figures.logs.items():
        text = log.read_text(errors="replace") if log.exists() else ""
        count = sum(1 for line in text.splitlines() if " ERROR " in line or "Traceback" in line)
        if count:
            lines.append(
                f"- {name}'s log (`{log.relative_to(log.parents[2])}`): {count} lines"
                " with ERROR or a traceback."
            )
    return lines or ["- Every target answered every request."]


def headroom_own(figures: Figures) -> list[str]:
    """What Headroom's own per-request log line (``PERF``) says it did with each request
    kind: its optimisation time and total time (medians), tokens before and after, and the
    transforms it applied."""
    log = figures.logs.get("Headroom")
    if log is None or not log.exists():
        return []
    seen: dict[int, list[dict[str, str]]] = {}
    before_load = log.read_bytes()[: figures.sequential.get("Headroom")]
    for line in before_load.decode(errors="replace").splitlines():
        if " PERF " in line:
            fields = dict(f.split("=", 1) for f in line.split(" PERF ", 1)[1].split() if "=" in f)
            seen.setdefault(int(fields.get("msgs", "0")), []).append(fields)
    lines = []
    for sent in figures.sent:
        rows = seen.get(sent.messages, [])
        if not rows or sent.stream:
            continue

        def median(key: str, rows: list[dict[str, str]] = rows) -> float:
            return statistics.median(float(r.get(key, "nan")) for r in rows)

        transforms = sorted({r.get("transforms", "?") for r in rows})
        lines.append(
            f"- {sent.name}: optimisation {median('opt_ms'):.0f} ms of {median('total_ms'):.0f} ms"
            f" in the proxy; tokens {median('tok_before'):,.0f} -> {median('tok_after'):,.0f};"
            f" transforms: {', '.join(transforms)} (medians of {len(rows)} requests)"
        )
    return lines


def write(figures: Figures, output: Path | None) -> None:
    """Print the results block, and write it into ``output`` unless that is ``None``."""
    before, after = figures.load
    how = (
        f"`make bench-peers` (`python -m bench.peers --rounds {figures.rounds}`),"
        f" {figures.minutes:.1f} minutes with start-ups. Load average (1, 5, 15 min) before the"
        f" run {', '.join(f'{x:.2f}' for x in before)}, after it"
        f" {', '.join(f'{x:.2f}' for x in after)}. Latency: sequential, keep-alive,"
        f" {figures.rounds} rounds of "
        + ", ".join(f"{s.per_round}" for s in figures.sent)
        + " requests per target (in the order of the table's request kinds), the targets in"
        " turn from request to request, then again with each target's requests of a round"
        " back to back; added p50: median over rounds of the round's difference of medians"
        " against direct; added p99: p99 over all rounds minus direct's; milliseconds."
        " req/s: closed loop"
        f" (`bench/load.py`), {figures.connections} connections, {figures.seconds:g} s,"
        f" median of {figures.load_rounds} round{'s' if figures.load_rounds > 1 else ''}."
    )
    lines = [
        "| proxy | version | configuration |",
        "|---|---|---|",
        *(f"| {p.name} | {p.version} | {p.config} |" for p in figures.proxies),
        "",
        *latency_table(figures),
        "",
        "contextgate's added p50 as a share of each peer's (targets: a fifth of LiteLLM's, a"
        " tenth of Headroom's), with the bare stack's share beside it (the least a gateway"
        " on contextgate's server stack adds):",
        "",
        *ratios(figures),
        "",
        "Back to back (each target sent its round's requests in a row, after 3 not counted;"
        " the busy regime), added p50, milliseconds:",
        "",
        *in_runs_table(figures),
        "",
        "contextgate's added p50 back to back as a share of each peer's:",
        "",
        *ratios(figures, figures.latency_in_runs),
        "",
        "Memory (MiB, the proxy's whole process group, from /proc):",
        "",
        *memory_table(figures),
        "",
        "What failed:",
        "",
        *could_not(figures),
        "",
        "Headroom's own account of its work, from its per-request log line (`PERF`;"
        " medians over the requests sent one at a time, before the load; the one-message"
        " line includes the streamed ones):",
        "",
        *headroom_own(figures),
        "",
        *(f"- {note}" for note in NOTES),
    ]
    if output is None:
        print("\n".join(lines))
        print(how)
        return
    publish(output, (START, END), HEADING, how, lines)
