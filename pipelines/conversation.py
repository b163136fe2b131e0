"""The conversation a stage receives and returns: the request's messages plus its other fields."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pipelines.messages import Message

__all__ = ["Conversation"]


@dataclass(frozen=True, slots=True)
class Conversation:
    """An immutable view of one chat request.

    ``messages`` is the list a stage rewrites; ``body`` is the whole request as received
    (every field, known or not), which stages read and never mutate. ``changes`` holds
    top-level fields a stage set or replaced (``tools``, ``prompt_cache_key``, ...).
    """

    messages: tuple[Message, ...]
    body: Mapping[str, Any]
    changes: Mapping[str, Any]

    @classmethod
    def from_request(cls, request: Mapping[str, Any]) -> Conversation:
        messages = request.get("messages")
        return cls(tuple(messages) if isinstance(messages, list) else (), request, {})

    @property
    def model(self) -> str:
        model = self.get("model")
        return model if isinstance(model, str) else ""

    @property
    def tools(self) -> list[Any] | None:
        tools = self.get("tools")
        return tools if isinstance(tools, list) else None

    def get(self, key: str, default: Any = None) -> Any:
        """A top-level request field, as changed by earlier stages."""
        if key in self.changes:
            return self.changes[key]
        return self.body.get(key, default)

    def with_messages(self, messages: Iterable[Message]) -> Conversation:
        return Conversation(tuple(messages), self.body, self.changes)

    def with_fields(self, **fields: Any) -> Conversation:
        return Conversation(self.messages, self.body, {**self.changes, **fields})

    def to_request(self) -> dict[str, Any]:
        """The request to send: the original body with the messages and changes applied."""
        request = dict(self.body)
        request.update(self.changes)
        request["messages"] = list(self.messages)
        return request
