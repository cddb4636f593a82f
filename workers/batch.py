"""One batch through a model container, with no Kafka or Redis in sight.

``handle_batch`` turns a decoded ``Batch`` record into everything the worker must emit:
``Predictions`` grouped by selector partition, cache entries, dead letters and a
``BatchStats`` record. A bad item never fails its batch-mates; a model failure turns the
batch's valid items into ``error`` predictions and the worker goes on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from clipstream.clock import now_us
from clipstream.errors import ClipstreamError, ModelError
from schemas import encode, from_tensor, to_tensor
from workers.backends import BatchModel
from workers.spec import OutputSpec

STAGE = "worker"


@dataclass
class BatchOutcome:
    """What one batch produces; the adapter only has to write it out."""

    predictions: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    cache: list[tuple[str, bytes]] = field(default_factory=list)
    dead_letters: list[dict[str, Any]] = field(default_factory=list)
    stats: dict[str, Any] | None = None

    def predictions_records(self) -> list[tuple[int, dict[str, Any]]]:
        """(selector partition, ``Predictions`` record) pairs: one record per partition."""
        return [(p, {"selector_partition": p, "items": items}) for p, items in sorted(self.predictions.items())]


def output_rows(spec: OutputSpec, outputs: Any, n: int) -> list[np.ndarray]:
    """Split a batch's outputs into per-item rows in the wire form CONTRACTS.md fixes.

    class_scores -> float32 vector aligned with labels; label -> 0-d array of the label;
    regression -> 0-d float64. A wrong shape is a ModelError (the model broke its contract).
    """
    out = np.asarray(outputs)
    if spec.kind == "class_scores":
        width = len(spec.labels or ())
        if out.shape != (n, width):
            raise ModelError(f"class_scores output must have shape {[n, width]}, got {list(out.shape)}")
        out = out.astype(np.float32, copy=False)
        return [out[i] for i in range(n)]
    if out.ndim == 2 and out.shape[1] == 1:
        out = out[:, 0]
    if out.shape != (n,):
        raise ModelError(f"{spec.kind} output must have shape {[n]}, got {list(out.shape)}")
    if spec.kind == "regression":
        out = out.astype(np.float64, copy=False)
    return [np.asarray(out[i]) for i in range(n)]


def dead_letter(
    reason: str,
    *,
    source: tuple[str, int, int] | None = None,
    query_id: str | None = None,
    payload: bytes | None = None,
) -> dict[str, Any]:
    """A ``DeadLetter`` record from this stage."""
    topic, partition, offset = source if source is not None else (None, None, None)
    return {
        "stage": STAGE,
        "reason": reason,
        "source_topic": topic,
        "source_partition": partition,
        "source_offset": offset,
        "query_id": query_id,
        "payload": payload,
        "created_us": now_us(),
    }


def handle_batch(
    model: BatchModel,
    batch: dict[str, Any],
    *,
    worker_id: str,
    version: str | None = None,
    received_us: int | None = None,
    source: tuple[str, int, int] | None = None,
    selector_partitions: int | None = None,
    clock: Callable[[], int] = now_us,
) -> BatchOutcome:
    """Check inputs, run ``predict_batch`` once over the valid ones, and shape every output.

    An item whose ``selector_partition`` is outside ``[0, selector_partitions)`` cannot be
    answered anywhere: it becomes a dead letter only (producing it would fail forever).
    """
    received_us = clock() if received_us is None else received_us
    spec = model.spec
    version = batch.get("version") or version
    outcome = BatchOutcome()
    items: list[dict[str, Any]] = batch["items"]
    valid: list[tuple[dict[str, Any], np.ndarray]] = []
    errors = 0

    def emit(item: dict[str, Any], status: str, output: dict[str, Any] | None, error: str | None, out_us: int) -> None:
        trace = dict(item.get("trace") or {})
        trace["worker_in"] = received_us
        trace["worker_out"] = out_us
        outcome.predictions.setdefault(int(item["selector_partition"]), []).append(
            {
                "query_id": item["query_id"],
                "model": batch["model"],
                "version": version,
                "status": status,
                "output": output,
                "error": error,
                "trace": trace,
            }
        )

    for item in items:
        part = int(item["selector_partition"])
        if part < 0 or (selector_partitions is not None and part >= selector_partitions):
            errors += 1
            outcome.dead_letters.append(
                dead_letter(
                    f"selector_partition {part} is outside [0, {selector_partitions})",
                    source=source, query_id=item["query_id"], payload=encode("BatchItem", item),
                )
            )
            continue
        try:
            array = from_tensor(item["input"])
            spec.input.check(array)
        except ClipstreamError as exc:
            errors += 1
            reason = f"bad input: {exc}"
            emit(item, "error", None, reason, clock())
            outcome.dead_letters.append(
                dead_letter(reason, source=source, query_id=item["query_id"], payload=encode("BatchItem", item))
            )
            continue
        valid.append((item, array))

    service_us = 0
    if valid:
        inputs = np.stack([a for _, a in valid])
        start = time.perf_counter()
        try:
            rows = output_rows(spec.output, model.predict_batch(inputs), len(valid))
            failure = None
        except Exception as exc:  # any model bug: answer with errors, keep serving
            rows, failure = [], f"model error: {type(exc).__name__}: {exc}"
        service_us = int((time.perf_counter() - start) * 1e6)
        out_us = clock()
        if failure is not None:
            errors += len(valid)
            for item, _ in valid:
                emit(item, "error", None, failure, out_us)
        else:
            for (item, _), row in zip(valid, rows):
                try:
                    tensor = to_tensor(row)
                except ClipstreamError as exc:  # e.g. a string label: no wire dtype for it
                    errors += 1
                    emit(item, "error", None, f"model error: output cannot travel: {exc}", out_us)
                    continue
                emit(item, "ok", tensor, None, out_us)
                if item.get("cache_key"):
                    outcome.cache.append((item["cache_key"], encode("Tensor", tensor)))

    outcome.stats = {
        "batch_id": batch["batch_id"],
        "model": batch["model"],
        "replica": int(batch["replica"]),
        "batch_size": len(items),
        "service_us": service_us,
        "queue_wait_us": max(0, received_us - int(batch["created_us"])),
        "errors": errors,
        "worker_id": worker_id,
        "created_us": clock(),
    }
    return outcome
