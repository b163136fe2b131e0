"""Offload store backends (the ``pipelines.OffloadStore`` Protocol) and their refs."""

from gateway.store.memory import MemoryStore
from gateway.store.refs import REF_PATTERN, make_ref

__all__ = ["REF_PATTERN", "MemoryStore", "make_ref"]
