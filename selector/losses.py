"""Losses in [0, 1] (Clipper 5.1: the bandit algorithms need a bounded loss L(y, yhat)).

- labels: 0/1 (the answer is right or wrong);
- regression: min(1, |y - yhat| / scale), clipped so one wild answer cannot wipe out a weight;
- a reward r in [0, 1] for the answer that was given: loss 1 - r.
"""

from __future__ import annotations

import math
from typing import Any

from selector.types import Feedback, Output, plain, same_label


def label_loss(truth: Any, output: Output) -> float:
    return 0.0 if same_label(truth, output.value) else 1.0


def regression_loss(truth: Any, output: Output, scale: float = 1.0) -> float:
    try:
        err = abs(float(plain(truth)) - float(plain(output.value)))
    except (TypeError, ValueError):
        return 1.0
    if math.isnan(err):
        return 1.0
    return min(1.0, err / scale) if scale > 0 else (0.0 if err == 0 else 1.0)


def reward_loss(reward: float) -> float:
    return 1.0 - min(1.0, max(0.0, float(reward)))


def agrees(a: Output, b: Output, kind: str, tolerance: float = 0.0) -> bool:
    """Two answers agree: same label, or (regression) within ``tolerance`` of each other."""
    if kind == "regression":
        try:
            return abs(float(plain(a.value)) - float(plain(b.value))) <= tolerance
        except (TypeError, ValueError):
            return False
    return same_label(a.value, b.value)


def model_loss(
    output: Output, feedback: Feedback, kind: str, scale: float = 1.0, tolerance: float = 0.0
) -> float | None:
    """One model's loss for one feedback, or None when the feedback says nothing about it.

    A label is compared with the model's own answer. A reward is about the combined answer the
    caller got: a model that agreed with that answer shares its loss 1 - r; one that did not is
    left alone (its loss is unknown).
    """
    if feedback.label is not None:
        if kind == "regression":
            return regression_loss(feedback.label, output, scale)
        return label_loss(feedback.label, output)
    if feedback.reward is not None:
        if output.value is None:  # no answer by the deadline: a reward is about what was answered
            return None
        if feedback.answer is None or agrees(output, feedback.answer, kind, tolerance):
            return reward_loss(feedback.reward)
        return None
    return None
