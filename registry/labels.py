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


def labels_problem(view: Any, linked: Iterable[str], model: str) -> str | None:
    """Why ``model`` cannot join an app whose models are ``linked``, or None: both answer class
    scores over different sets of labels, which an ensemble cannot combine (the same labels in
    another order are put in the app's order by the selector)."""
    def labels(name: str) -> tuple[str, ...] | None:
        m = view.models.get(name)
        spec = m.spec if m is not None else None
        if spec is None or spec.output.kind != "class_scores" or not spec.output.labels:
            return None
        return tuple(str(label) for label in spec.output.labels)

    theirs = labels(model)
    for other in linked:
        mine = labels(other)
        if theirs is not None and mine is not None and other != model and sorted(mine) != sorted(theirs):
            return (f"its labels {list(theirs)} are not those of {other!r}, {list(mine)}: an ensemble's models "
                    "must answer the same classes")
    return None
