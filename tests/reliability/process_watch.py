"""For the reliability tests: the mock upstream as a process of its own, and what a running
``contextgate serve`` process holds (RSS, open descriptors, its gauges at ``/metrics``)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import httpx

from tests.harness import free_port

LONG = os.environ.get("CONTEXTGATE_RELIABILITY") == "long"
"""``make soak`` sets ``CONTEXTGATE_RELIABILITY=long``: the long versions run."""


@contextlib.contextmanager
def mock_upstream_process(*args: str) -> Iterator[str]:
    """``python -m tests.mock_upstream`` on a free port (``args`` added: ``--delay``,
    ``--stream-interval``); yields its base URL (``.../v1``)."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.mock_upstream", "--port", str(port), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith(b"ready"):
            raise RuntimeError("the mock upstream did not start")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        process.wait(10)
        if process.stdout is not None:
            process.stdout.close()


@dataclass(frozen=True)
class Sample:
    """What the gateway process held at one moment."""

    at: float
    rss_mib: float
    fds: int
    tasks: int
    in_flight: int


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def gauge(text: str, name: str) -> float:
    """The value of an unlabelled gauge in a Prometheus exposition."""
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    if match is None:
        raise AssertionError(f"{name} is not in /metrics")
    return float(match.group(1))


def sample(pid: int, url: str, at: float) -> Sample:
    text = httpx.get(f"{url}/metrics", timeout=60).text  # slow under tracemalloc
    return Sample(
        at=round(at, 1),
        rss_mib=round(rss_mib(pid), 1),
        fds=open_fds(pid),
        tasks=int(gauge(text, "contextgate_event_loop_tasks")),
        in_flight=int(gauge(text, "contextgate_admitted_in_flight")),
    )
