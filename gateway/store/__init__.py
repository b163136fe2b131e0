"""Offload store backends (the ``pipelines.OffloadStore`` Protocol) and their refs, and
the conversation records."""

from gateway.store.conversations import ConversationRecords, MemoryConversations
from gateway.store.memory import MemoryStore
from gateway.store.refs import REF_PATTERN, make_ref
from gateway.store.stores import Stores

__all__ = [
    "REF_PATTERN",
    "ConversationRecords",
    "MemoryConversations",
    "MemoryStore",
    "Stores",
    "make_ref",
]
