"""The input budget of one request and the utilisation thresholds measured against it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from pipelines.catalog import ModelInfo
from pipelines.policy import Policy

__all__ = ["BUDGET_FLOOR", "Budget"]

BUDGET_FLOOR: Final = 4_000
"""No budget is smaller: on a tiny model a percentage threshold would otherwise never fire."""


@dataclass(frozen=True, slots=True)
class Budget:
    """Tokens the request's input may use: ``min(window - output reserve, max-input)``,
    never under ``BUDGET_FLOOR``."""

    window: int
    output_reserve: int
    max_input: int | None = None

    @property
    def input_tokens(self) -> int:
        room = self.window - self.output_reserve
        if self.max_input is not None:
            room = min(room, self.max_input)
        return max(BUDGET_FLOOR, room)

    def utilisation(self, tokens: int) -> float:
        """``tokens`` as a share of the input budget."""
        return tokens / self.input_tokens

    @classmethod
    def for_request(cls, model: ModelInfo, policy: Policy, request: Mapping[str, Any]) -> Budget:
        """The budget for ``request`` to ``model``: the reply room is the request's own
        ``max_completion_tokens`` (or ``max_tokens``) when it sets one, else the catalog's."""
        reserve = model.output_reserve
        for key in ("max_completion_tokens", "max_tokens"):
            asked = request.get(key)
            if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0:
                reserve = asked
                break
        return cls(model.context_window, reserve, policy.max_input)
