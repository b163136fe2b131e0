"""What compress's tests share: the tau-bench traces and the ref pattern."""

from __future__ import annotations

import re
from pathlib import Path

TRACES = Path(__file__).resolve().parents[4] / "bench" / "data" / "tau-bench-gpt-4o-airline.json"
REF = re.compile(r"ctx_[A-Za-z0-9_-]{22,}")
