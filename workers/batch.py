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
from registry.spec import OutputSpec
from schemas import encode, from_tensor, to_tensor
from workers.backends import BatchModel

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


@dataclass
class Prepared:
    """A batch checked and stacked, ready for the device: what ``run_batch`` needs and what
    ``finish_batch`` needs afterwards. Items that failed their checks are already answered
    in ``outcome``."""

    batch: dict[str, Any]
    version: str | None
    received_us: int
    source: tuple[str, int, int] | None
    valid: list[dict[str, Any]] = field(default_factory=list)
    inputs: np.ndarray | None = None
    outcome: BatchOutcome = field(default_factory=BatchOutcome)
    errors: int = 0


@dataclass
class Ran:
    """What the device did with a batch: per-item rows, or the model's failure."""

    rows: list[np.ndarray]
    failure: str | None
    service_us: int
    out_us: int


def _prediction(p: Prepared, item: dict[str, Any], status: str, output: dict[str, Any] | None,
                error: str | None, out_us: int) -> None:
    trace = dict(item.get("trace") or {})
    trace["worker_in"] = p.received_us
    trace["worker_out"] = out_us
    p.outcome.predictions.setdefault(int(item["selector_partition"]), []).append({
        "query_id": item["query_id"], "model": p.batch["model"], "version": p.version,
        "status": status, "output": output, "error": error, "trace": trace,
    })


def prepare_batch(
    spec: Any,
    batch: dict[str, Any],
    *,
    version: str | None = None,
    received_us: int,
    source: tuple[str, int, int] | None = None,
    selector_partitions: int | None = None,
    clock: Callable[[], int] = now_us,
) -> Prepared:
    """Check every item against ``model.yaml`` and stack the valid ones (CPU work the worker
    does while the device runs the previous batch).

    An item whose ``selector_partition`` is outside ``[0, selector_partitions)`` cannot be
    answered anywhere: it becomes a dead letter only (producing it would fail forever).
    """
    p = Prepared(batch, batch.get("version") or version, received_us, source)
    arrays: list[np.ndarray] = []
    for item in batch["items"]:
        part = int(item["selector_partition"])
        if part < 0 or (selector_partitions is not None and part >= selector_partitions):
            p.errors += 1
            p.outcome.dead_letters.append(dead_letter(
                f"selector_partition {part} is outside [0, {selector_partitions})",
                source=source, query_id=item["query_id"], payload=encode("BatchItem", item)))
            continue
        try:
            array = from_tensor(item["input"])
            spec.input.check(array)
        except ClipstreamError as exc:
            p.errors += 1
            reason = f"bad input: {exc}"
            _prediction(p, item, "error", None, reason, clock())
            p.outcome.dead_letters.append(
                dead_letter(reason, source=source, query_id=item["query_id"], payload=encode("BatchItem", item)))
            continue
        p.valid.append(item)
        arrays.append(array)
    if arrays:
        p.inputs = np.stack(arrays)
    return p


def run_batch(model: BatchModel, p: Prepared, clock: Callable[[], int] = now_us) -> Ran | None:
    """The device's part: one ``predict_batch`` over the valid items, timed. None: nothing to run."""
    if p.inputs is None:
        return None
    start = time.perf_counter()
    try:
        rows = output_rows(model.spec.output, model.predict_batch(p.inputs), len(p.valid))
        failure = None
    except Exception as exc:  # any model bug: answer with errors, keep serving
        rows, failure = [], f"model error: {type(exc).__name__}: {exc}"
    return Ran(rows, failure, int((time.perf_counter() - start) * 1e6), clock())


def finish_batch(p: Prepared, ran: Ran | None, *, worker_id: str,
                 clock: Callable[[], int] = now_us) -> BatchOutcome:
    """Shape the outputs into predictions, cache entries and the ``BatchStats`` report."""
    if ran is not None and ran.failure is not None:
        p.errors += len(p.valid)
        for item in p.valid:
            _prediction(p, item, "error", None, ran.failure, ran.out_us)
    elif ran is not None:
        for item, row in zip(p.valid, ran.rows):
            try:
                tensor = to_tensor(row)
            except ClipstreamError as exc:  # e.g. a string label: no wire dtype for it
                p.errors += 1
                _prediction(p, item, "error", None, f"model error: output cannot travel: {exc}", ran.out_us)
                continue
            _prediction(p, item, "ok", tensor, None, ran.out_us)
            if item.get("cache_key"):
                p.outcome.cache.append((item["cache_key"], encode("Tensor", tensor)))
    batch = p.batch
    p.outcome.stats = {
        "batch_id": batch["batch_id"],
        "model": batch["model"],
        "replica": int(batch["replica"]),
        "batch_size": len(batch["items"]),
        "service_us": ran.service_us if ran is not None else 0,
        "queue_wait_us": max(0, p.received_us - int(batch["created_us"])),
        "errors": p.errors,
        "worker_id": worker_id,
        "created_us": clock(),
    }
    return p.outcome


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
    """prepare, run and finish one batch in one go (the worker runs the three on different
    threads, so that the device never waits for the CPU work around it)."""
    received_us = clock() if received_us is None else received_us
    p = prepare_batch(model.spec, batch, version=version, received_us=received_us, source=source,
                      selector_partitions=selector_partitions, clock=clock)
    return finish_batch(p, run_batch(model, p, clock), worker_id=worker_id, clock=clock)
