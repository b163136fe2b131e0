"""Where a gateway process's memory and start-up time go: the largest holders of memory
(``tracemalloc``, by package) and of import time (``python -X importtime``, by package)
in a new process that imports the server ``contextgate serve`` runs, builds the
application (``create_app``, the defaults) and loads what its first request needs (the
o200k_base encoding), with the process's RSS after each step.

    python -m bench.footprint [--baseline DIR] [--output docs/BENCHMARKS.md]

With ``--baseline``, the same is measured for the checkout in DIR (its .venv's interpreter
when it has one, else this one with DIR first on the path), and the tables put the two
side by side. Memory is measured with tracemalloc on, which makes the RSS larger: the RSS
column is read in a second process without it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

from bench.report import publish

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ("<!-- footprint:start -->", "<!-- footprint:end -->")
HEADING = "## Where the memory and the start-up time go"
SHOWN = 14

_IMPORTS = """import gateway.cli, gateway.app
try:
    import gateway.edge.server  # the server, as `serve` loads it (older checkouts: gateway.app)
except ImportError:
    pass
"""
_PROBE = r"""
import json, sys, time, tracemalloc
traced = sys.argv[1] == "traced"
if traced:
    tracemalloc.start(1)
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
steps = {"interpreter": rss()}
began = time.perf_counter()
IMPORTS
steps["imported"] = rss()
imported = time.perf_counter() - began
from gateway.config import load_settings
app = gateway.app.create_app(load_settings(None))
steps["application built"] = rss()
app.state.gateway.pipeline.counter("o200k_base").count_text("warm")
steps["o200k_base loaded"] = rss()
holders = {}
if traced:
    for stat in tracemalloc.take_snapshot().statistics("filename"):
        holders[stat.traceback[0].filename] = holders.get(stat.traceback[0].filename, 0) + stat.size
print(json.dumps({"steps": steps, "holders": holders, "modules": len(sys.modules),
                  "import_s": imported}))
""".replace("IMPORTS\n", _IMPORTS)


def _package(filename: str) -> str:
    """The package a source file belongs to: ``litestar``, ``gateway.routes``, the
    standard library's module, or Python's import machinery (code objects)."""
    if "site-packages/" in filename:
        return filename.split("site-packages/")[1].split("/")[0].removesuffix(".py")
    for own in ("gateway", "pipelines"):
        marker = f"/{own}/"
        if marker in filename:
            rest = filename.split(marker, 1)[1].split("/")
            return f"{own}.{rest[0].removesuffix('.py')}" if len(rest) > 1 else own
    if filename.startswith("<frozen importlib"):
        return "code objects (imports)"
    if "/lib/python3" in filename:
        return "stdlib " + filename.split("/lib/python3")[1].split("/")[1].removesuffix(".py")
    return filename


def _import_times(python: str, env: dict[str, str], cwd: Path) -> Counter[str]:
    """Self import time (ms) by top-level package (``gateway.x`` and ``pipelines.x`` kept
    apart), from ``-X importtime``."""
    done = subprocess.run(
        [python, "-X", "importtime", "-c", _IMPORTS],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    times: Counter[str] = Counter()
    for line in done.stderr.splitlines():
        found = re.match(r"import time:\s+(\d+) \|\s+\d+ \|\s*(\S+)", line)
        if found:
            parts = found[2].split(".")
            key = ".".join(parts[:2]) if parts[0] in ("gateway", "pipelines") else parts[0]
            times[key] += int(found[1]) / 1000
    return times


def measure(python: str, env: dict[str, str], cwd: Path) -> dict[str, object]:
    def probe(mode: str) -> dict[str, object]:
        done = subprocess.run(
            [python, "-c", _PROBE, mode], env=env, cwd=cwd, capture_output=True, check=True
        )
        result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
        return result

    traced = probe("traced")
    plain = probe("plain")
    holders: Counter[str] = Counter()
    for filename, size in traced["holders"].items():  # type: ignore[attr-defined]
        holders[_package(filename)] += size / 2**20
    return {
        "steps": plain["steps"],
        "modules": plain["modules"],
        "holders": holders,
        "traced": sum(holders.values()),
        "imports": _import_times(python, env, cwd),
    }


def _rows(results: dict[str, dict[str, object]], key: str, unit: str) -> list[str]:
    names = list(results)
    totals: Counter[str] = Counter()
    for result in results.values():
        totals.update(result[key])  # type: ignore[arg-type]
    lines = [
        "| " + " | ".join(["holder", *names]) + " |",
        "|---|" + "---|" * len(names),
    ]
    for holder, _ in totals.most_common(SHOWN):
        cells = [f"{result[key].get(holder, 0):.1f} {unit}" for result in results.values()]  # type: ignore[attr-defined]
        lines.append(f"| {holder} | " + " | ".join(cells) + " |")
    cells = [f"**{sum(result[key].values()):.1f} {unit}**" for result in results.values()]  # type: ignore[attr-defined]
    lines.append("| all | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, help="a checkout of another commit")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "BENCHMARKS.md")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONTEXTGATE_", "OTEL_"))}
    results: dict[str, dict[str, object]] = {}
    if args.baseline is not None:
        baseline = args.baseline.resolve()
        own = baseline / ".venv" / "bin" / "python"
        python = str(own) if own.exists() else sys.executable
        results[f"before ({baseline.name})"] = measure(
            python, {**env, "PYTHONPATH": str(baseline)}, baseline
        )
    results["contextgate"] = measure(sys.executable, env, ROOT)
    names = list(results)
    lines = [
        "RSS of a new process after each step (without tracemalloc):",
        "",
        "| step | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for step in results[names[-1]]["steps"]:  # type: ignore[attr-defined]
        cells = [f"{result['steps'][step]:.0f} MiB" for result in results.values()]  # type: ignore[index]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    modules = " | ".join(str(result["modules"]) for result in results.values())
    lines += [
        f"| modules loaded | {modules} |",
        "",
        "Largest holders of the memory Python allocated (tracemalloc, MiB, by the package"
        ' whose code allocated it; "code objects" is the bytecode of every module'
        " imported; a native library's own allocations, such as the encoding's tables in"
        " tiktoken's Rust core, are not traced):",
        "",
        *_rows(results, "holders", "MiB"),
        "",
        "Largest holders of import time (`-X importtime`, self time by package, ms; one"
        " run each, so read the shares rather than the absolute times):",
        "",
        *_rows(results, "imports", "ms"),
    ]
    how = "`python -m bench.footprint" + (
        f" --baseline {args.baseline}`." if args.baseline else "`."
    )
    publish(args.output, RESULTS, HEADING, how, lines)


if __name__ == "__main__":
    main()
