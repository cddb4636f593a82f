"""A model's output row read as an answer: the value and scores a caller gets.

The selector's join and the gateway (for a query its one model answered straight,
docs/design/0083) read a prediction's tensor the same way, so the rule lives below both.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from schemas import Tensor

WIRE_SCALARS = (bool, int, float, str)


def plain(value: Any) -> Any:
    """A numpy scalar (or 0-d array) as the Python value it holds, so answers compare and encode."""
    item = getattr(value, "item", None)
    if item is not None and getattr(value, "ndim", 0) == 0:
        return item()
    return value


def read_row(tensor: Tensor, kind: str | None, labels: tuple[Any, ...] | None) -> tuple[Any, tuple[float, ...] | None]:
    """A model's row as (value, scores): class scores -> (argmax label, scores); a 0-d tensor
    -> (its value, None)."""
    arr = tensor.array()
    if arr.ndim == 0 or (arr.size == 1 and kind in ("label", "regression")):
        value = plain(arr.reshape(()))
        return (float(value) if kind == "regression" else value), None
    row = np.asarray(arr, dtype=np.float64).ravel()
    scores = tuple(row.tolist())
    best = int(row.argmax())
    return (labels[best] if labels and len(labels) == len(scores) else best), scores


def wire_value(value: Any) -> Any:
    """A value the Response's union (null, boolean, long, double, string) can carry."""
    value = plain(value)
    if value is None or isinstance(value, WIRE_SCALARS):
        return value
    return str(value)
