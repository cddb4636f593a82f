"""A model's output row read as an answer, and the records an answer is written as.

The selector's join and the gateway (for a query its one model answered straight,
docs/design/0083) both answer queries: they read a prediction's tensor, build the Response and
store what they answered for the feedback join the same way, so the rules live below both.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from clipstream.errors import DecodeError
from schemas import OutputKind, Response, Tensor

WIRE_SCALARS = (bool, int, float, str)


@dataclass(frozen=True)
class AppOutputs:
    """What the app's linked models answer: their kind, and the label list scores align with."""

    kind: OutputKind = "label"
    labels: tuple[Any, ...] | None = None


def app_outputs(view: Any, models: Iterable[str]) -> AppOutputs:
    """Regression if any model is; else class scores (labels of the first such model); else labels.
    The selector, the gateway and the Kafka producer read an app's answers and labels by it."""
    specs = [view.models[m].spec for m in models if m in view.models and view.models[m].spec is not None]
    kinds = [s.output.kind for s in specs]
    if "regression" in kinds:
        return AppOutputs("regression", None)
    for wanted in ("class_scores", "label"):
        for spec in specs:
            if spec.output.kind == wanted and spec.output.labels:
                return AppOutputs(wanted, tuple(spec.output.labels))
    return AppOutputs(kinds[0] if kinds else "label", None)


def app_input(view: Any, models: Sequence[str]) -> Any:
    """The input an app's queries must be (a ``TensorSpec``): its first linked model's declared
    one, which the gateway, the Kafka producer and ``up``'s warm-up all go by. None: the app
    has no model yet, or its first one declares none."""
    model = view.models.get(models[0]) if models else None
    return model.spec.input if model is not None and model.spec is not None else None


def plain(value: Any) -> Any:
    """A numpy scalar (or 0-d array) as the Python value it holds, so answers compare and encode."""
    item = getattr(value, "item", None)
    if item is not None and getattr(value, "ndim", 0) == 0:
        return item()
    return value


def read_row(tensor: Tensor, kind: str | None, labels: tuple[Any, ...] | None) -> tuple[Any, tuple[float, ...] | None]:
    """A model's row as (value, scores): class scores -> (argmax label, scores); a 0-d tensor
    -> (its value, None). An empty row holds no answer: a DecodeError, which the reader turns
    into that model's failure rather than losing the rest of its record."""
    arr = tensor.array()
    if arr.ndim == 0 or (arr.size == 1 and kind in ("label", "regression")):
        value = plain(arr.reshape(()))
        return (float(value) if kind == "regression" else value), None
    row = np.asarray(arr, dtype=np.float64).ravel()
    if row.size == 0:
        raise DecodeError(f"an empty output tensor (shape {list(arr.shape)})")
    scores = tuple(row.tolist())
    best = int(row.argmax())
    return (labels[best] if labels and len(labels) == len(scores) else best), scores


def wire_value(value: Any) -> Any:
    """A value the Response's union (null, boolean, long, double, string) can carry."""
    value = plain(value)
    if value is None or isinstance(value, WIRE_SCALARS):
        return value
    return str(value)


def output_json(value: Any, scores: tuple[float, ...] | None) -> dict[str, Any]:
    """One answer (or one model's prediction) as stored for the feedback join."""
    return {"value": plain(value), "scores": list(scores) if scores is not None else None}


def stored_answer(app: str, context: str | None, answer: dict[str, Any] | None,
                  predictions: dict[str, dict[str, Any]], confidence: float | None = None,
                  missing: list[str] | None = None, versions: dict[str, str | None] | None = None) -> dict[str, Any]:
    """What is stored under ``cs:pred:<query_id>`` for ``selector.learn``: the answer and each
    model's prediction (``output_json``), with the query's app and context; the confidence the
    answer went out with (Exp3 learns with the probability its model was chosen with, not the one
    the weights give when the feedback comes); the models asked that gave no answer in time,
    which learn as a wrong answer; and the version each prediction came from, which learns."""
    return {"app": app, "context": context, "answer": answer, "predictions": predictions, "confidence": confidence,
            "missing": list(missing or []), "versions": dict(versions or {})}


def answer_record(query_id: str, app: str, value: Any, scores: tuple[float, ...] | None,
                  labels: tuple[Any, ...] | None, confidence: float, answered: list[str], missing: list[str],
                  deadline_us: int, trace: dict[str, int], now_us: int,
                  default_reason: str | None = None) -> Response:
    """The Response to a query: ``value`` is the app's default output when ``default_reason``
    says why the answer is one; labels go with scores only."""
    is_default = default_reason is not None
    wire_scores = list(scores) if scores is not None else None
    return Response(
        query_id=query_id,
        app=app,
        output=wire_value(value),
        scores=wire_scores,
        labels=[str(lab) for lab in labels] if wire_scores is not None and labels else None,
        confidence=0.0 if is_default else float(confidence),
        is_default=is_default,
        default_reason=default_reason,
        answered=list(answered),
        missing=list(missing),
        created_us=now_us,
        deadline_us=deadline_us,
        trace={**trace, "joined": now_us},
    )
