"""The peers contextgate is measured against, each installed at a pinned release into its
own virtualenv under ``.bench/venvs/`` (ignored by git), so their dependencies never meet
the gateway's.

``python_of("litellm")`` returns the interpreter of that peer's virtualenv, creating it on
first use; a marker file records the requirement it was built from, so changing a pin
rebuilds the environment.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENVS = ROOT / ".bench" / "venvs"

# 1.82.7 and 1.82.8 were the compromised releases; this pin is well past them. It is the
# newest release whose proxy extra installs from PyPI: later ones pin companion packages
# (`litellm-proxy`, `litellm-proxy-extras` 0.4.110.post1 and up, `litellm-enterprise`
# 0.1.79.post2 and up) that PyPI does not have.
LITELLM = "1.108.7"

PEERS: dict[str, tuple[str, ...]] = {
    "litellm": (f"litellm[proxy]=={LITELLM}",),
    # Headroom depends on litellm (>=1.96.2); the same release keeps its install repeatable.
    "headroom": ("headroom-ai[proxy]==0.42.0", f"litellm=={LITELLM}"),
}


def python_of(peer: str) -> Path:
    """The interpreter of ``peer``'s virtualenv, installed at its pinned release."""
    requirements = PEERS[peer]
    venv = VENVS / peer
    python = venv / "bin" / "python"
    marker = venv / ".installed"
    wanted = "\n".join(requirements)
    if marker.exists() and marker.read_text() == wanted:
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, *requirements], check=True)
    marker.write_text(wanted)
    return python


def version_of(peer: str, distribution: str) -> str:
    """The installed version of ``distribution`` in ``peer``'s virtualenv."""
    script = f"import importlib.metadata as m; print(m.version({distribution!r}))"
    answer = subprocess.run(
        [str(python_of(peer)), "-c", script], check=True, capture_output=True, text=True
    )
    return answer.stdout.strip()


if __name__ == "__main__":
    for name in sys.argv[1:] or list(PEERS):
        print(name, python_of(name))
