"""What the benchmarks share: the machine line, quantiles, and writing a results block
into docs/BENCHMARKS.md between its markers (appended the first time)."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from datetime import UTC, datetime
from pathlib import Path


def machine() -> str:
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def short_head(checkout: Path) -> str:
    """The short commit a checkout is at (empty when git cannot tell)."""
    return subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()


def write_block(output: Path, start: str, end: str, block: str, heading: str = "") -> None:
    """Replace the text between ``start`` and ``end`` in ``output`` by ``block`` (which
    carries both markers), or append ``heading`` and ``block`` when the markers are absent."""
    text = output.read_text() if output.exists() else "# Benchmarks\n"
    if start in text:
        head, _, rest = text.partition(start)
        text = head + block + rest.partition(end)[2]
    else:
        text = text.rstrip() + "\n\n" + (heading + "\n\n" if heading else "") + block + "\n"
    output.write_text(text)


def publish(
    output: Path, markers: tuple[str, str], heading: str, how: str, lines: list[str]
) -> None:
    """Print a results block (the markers, "Measured <date> on <machine>; <how>", then
    ``lines``) and write it into ``output`` under ``heading``."""
    date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    start, end = markers
    block = "\n".join([start, f"Measured {date} on {machine()}; {how}", "", *lines, end])
    print(block)
    write_block(output, start, end, block, heading)
