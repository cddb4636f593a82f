"""The policy-facing types of Clipper's Listing 2: the query X, a model's answer Y, and feedback.

They are plain dataclasses with no Kafka or Redis in them, so a policy (built in or a user's)
is written and tested against these alone. ``State`` is a JSON-able dict because it lives in
Redis and is shared by every selector and learner process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from registry.labels import same_label
from registry.outputs import output_json, plain

__all__ = ["Feedback", "Output", "Query", "State", "plain", "same_label"]

# A policy's learned state: JSON-able (lists, floats, str), stored in Redis per (app, context).
State = dict[str, Any]


@dataclass(frozen=True)
class Query:
    """What select/combine see of a query: its id (seeds Exp3's draw), app, context and input."""

    query_id: str
    app: str
    context: str | None = None
    input: Any = None
    deadline_us: int = 0


@dataclass(frozen=True)
class Output:
    """One model's own answer: ``value`` (a label or a float) and, for class scores, the
    ``scores`` vector aligned with the app's label list."""

    value: Any
    scores: tuple[float, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        return output_json(self.value, self.scores)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Output":
        scores = data.get("scores")
        return cls(data.get("value"), tuple(scores) if scores is not None else None)


@dataclass(frozen=True)
class Feedback:
    """The truth about an earlier query: the true ``label`` (or value), or a ``reward`` in [0, 1]
    for the answer that was given. ``answer`` is the combined answer the caller received, which a
    reward is about, and ``confidence`` the one it went out with (both filled in by the learner
    from the stored predictions)."""

    query_id: str
    label: Any = None
    reward: float | None = None
    answer: Output | None = None
    confidence: float | None = None
