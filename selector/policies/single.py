"""``single``: always the first linked model; the baseline with no selection at all.

It still counts feedback (``n_observed``) so an app can switch to Exp3/Exp4 later and the
operator can see feedback arriving.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from selector.types import Feedback, Output, Query, State


class Single:
    stateless = True  # select/combine ignore the state: the selector never loads it
    name = "single"

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        self.config = dict(config or {})

    def init(self, models: list[str]) -> State:
        return {"policy": self.name, "models": list(models), "n_observed": 0}

    def select(self, state: State, query: Query) -> list[str]:
        return list(state["models"][:1])

    def combine(self, state: State, query: Query, predictions: dict[str, Output]) -> tuple[Output, float]:
        first = state["models"][0] if state["models"] else None
        if first in predictions:
            return predictions[first], 1.0
        if predictions:
            return next(iter(predictions.values())), 1.0
        return Output(None), 0.0

    def observe(self, state: State, query: Query, feedback: Feedback, predictions: dict[str, Output]) -> State:
        out = dict(state)
        out["n_observed"] = int(state.get("n_observed", 0)) + 1
        return out
