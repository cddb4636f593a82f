"""Whether a feedback label fits what an app's models answer, and whether its reward is one.

A label of the wrong type (a list for a class, text for a regression) would be scored as
"every model wrong" and teach the policy nonsense, so the gateway refuses it (422) and the
learner dead-letters it. Shared by both through the registry, the layer they have in common.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any

from registry.outputs import plain

# the Feedback record holds an integer label as an Avro long: a larger one would be silently
# written as a double, or not at all (OverflowError) past the double range
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def same_label(a: Any, b: Any) -> bool:
    """Labels agree if equal as values or as text (feedback may say "3" for the label 3). A
    boolean equals only a boolean: ``True == 1`` in Python, but an answer of 1 is not ``true``."""
    a, b = plain(a), plain(b)
    if a is None or b is None:
        return False
    return (a == b and isinstance(a, bool) == isinstance(b, bool)) or str(a) == str(b)


def label_problem(label: Any, kind: str, labels: tuple[Any, ...] | None) -> str | None:
    """Why ``label`` cannot be feedback for outputs of ``kind`` with these ``labels``; None if it can.

    Regression takes a finite number; class scores take one of the declared labels, matched as
    value or as text (``"3"`` for ``3``); plain labels take any scalar. Every kind refuses an
    integer outside int64 (the Feedback record holds a long) and a float that is not finite
    (no answer can be scored against it)."""
    if label is None:
        return None
    if isinstance(label, (list, tuple, dict, bytes)):
        return f"a label is one value, not a {type(label).__name__}"
    if isinstance(label, int) and not INT64_MIN <= label <= INT64_MAX:
        # the size, not the value: a JSON integer may have thousands of digits
        return (f"an integer label must be in the int64 range [{INT64_MIN}, {INT64_MAX}], "
                f"not one of {label.bit_length()} bits")
    if isinstance(label, float) and not math.isfinite(label):
        return f"a label must be a finite number, not {label!r}"
    if kind == "regression":
        if isinstance(label, bool) or not isinstance(label, (int, float)):  # not finite: refused above
            return f"the app answers a regression value: the label must be a finite number, not {label!r}"
        return None
    if kind == "class_scores" and labels:
        if not any(same_label(label, known) for known in labels):
            shown = ", ".join(repr(k) for k in labels[:20]) + (", ..." if len(labels) > 20 else "")
            return f"label {label!r} is not one of the app's labels [{shown}]"
    return None


def reward_problem(reward: float | None) -> str | None:
    """Why a feedback's reward is refused, or None: a reward is a number in [0, 1] (the REST
    gateway's bound, and the Avro schema's doc); a NaN or infinity would poison the weights."""
    if reward is None:
        return None
    # a NaN compares false, so the range refuses it along with the infinities
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not 0.0 <= reward <= 1.0:
        return f"feedback reward refused: {reward!r} is not a number in [0, 1]"
    return None


def join_problem(view: Any, linked: Iterable[str], model: str) -> str | None:
    """Why ``model`` cannot join an app whose models are ``linked``, or None. An app's models
    take the same input, since the gateway checks each query against one of them; they answer
    the same kind of thing (a value, or a class: by label or by scores); and class scores over
    different sets of labels cannot be combined (the same labels in another order are put in
    the app's order by the selector)."""
    def spec(name: str) -> Any:
        m = view.models.get(name)
        return m.spec if m is not None else None

    def labels(s: Any) -> tuple[str, ...] | None:
        if s is None or s.output.kind != "class_scores" or not s.output.labels:
            return None
        return tuple(str(label) for label in s.output.labels)

    mine = spec(model)
    for other in linked:
        theirs = spec(other)
        if mine is None or theirs is None or other == model:
            continue
        if mine.input != theirs.input:
            return (f"it takes {mine.input.dtype} {list(mine.input.shape)} and {other!r} takes {theirs.input.dtype} "
                    f"{list(theirs.input.shape)}: an app's models must take the same input")
        if (mine.output.kind == "regression") != (theirs.output.kind == "regression"):
            return (f"it answers {mine.output.kind} and {other!r} answers {theirs.output.kind}: an app's models must "
                    "answer the same kind of thing, values or classes")
        if labels(mine) is not None and labels(theirs) is not None and sorted(labels(mine)) != sorted(labels(theirs)):
            return (f"its labels {list(labels(mine))} are not those of {other!r}, {list(labels(theirs))}: an "
                    "ensemble's models must answer the same classes")
    return None
