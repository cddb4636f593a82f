"""Between the wire and the policies: a Prediction's tensor as an ``Output``, the app's output
kind and labels from its models' specs, and the Response record."""

from __future__ import annotations

import functools
from typing import Any

from clipstream.errors import DecodeError
from registry.outputs import AppOutputs, answer_record, app_outputs, read_row, wire_value
from schemas import Response, Tensor
from selector.join import Asked
from selector.types import Output

__all__ = ["AppOutputs", "app_outputs", "response_record", "to_output", "wire_value"]


def to_output(tensor: Tensor, kind: str | None, labels: tuple[Any, ...] | None,
              own: tuple[Any, ...] | None = None) -> Output:
    """A model's row as an Output: class scores -> (argmax label, scores); a 0-d tensor -> its value.

    ``own``: the model's own labels, when the app's (``labels``, which the policies combine
    scores by) list them in another order: its scores are put in the app's order, so that an
    ensemble adds up each class's scores, not whatever sits in the same column. Labels that
    are not the app's are a DecodeError: that model's prediction cannot be combined."""
    order = _order(own, labels) if own is not None and labels is not None and kind == "class_scores" else None
    if order is None:
        return Output(*read_row(tensor, kind, labels))
    value, scores = read_row(tensor, kind, own)
    if scores is None or len(scores) != len(order):
        return Output(value, scores)
    return Output(value, tuple(scores[i] for i in order))


@functools.lru_cache(maxsize=1024)
def _order(own: tuple[Any, ...], labels: tuple[Any, ...]) -> tuple[int, ...] | None:
    """Where each of the app's labels sits in a model's own list (None: the same order), worked
    out once per pair of lists, not per prediction; a DecodeError for other labels."""
    names = [str(label) for label in own]
    if names == [str(label) for label in labels]:
        return None
    if sorted(names) != sorted(map(str, labels)):
        raise DecodeError(f"its labels {list(own)} are not the app's {list(labels)}: an ensemble's models must "
                          "answer the same classes")
    at = {name: i for i, name in enumerate(names)}
    return tuple(at[str(label)] for label in labels)


def response_record(
    query_id: str,
    asked: Asked,
    output: Output | None,
    confidence: float,
    answered: list[str],
    missing: list[str],
    labels: tuple[Any, ...] | None,
    now_us: int,
    default: Any = None,
    default_reason: str | None = None,
) -> Response:
    """The Response to query ``query_id``, from what the join kept of it."""
    is_default = default_reason is not None
    return answer_record(
        query_id, asked.app, default if is_default or output is None else output.value,
        output.scores if output is not None else None, labels, confidence, answered, missing,
        int(asked.deadline_us or 0), asked.trace, now_us, default_reason)
