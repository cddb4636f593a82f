"""One batch through a model container, with no Kafka or Redis in sight.

``handle_batch`` turns a decoded ``Batch`` record into everything the worker must emit:
``Predictions`` grouped by selector partition, cache entries, dead letters and a
``BatchStats`` record. A bad item never fails its batch-mates; a model failure is narrowed
down to the inputs it fails on, which get ``error`` predictions, and the worker goes on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from clipstream.clock import now_us
from clipstream.errors import ClipstreamError, InputError, ModelError
from registry.spec import ModelSpec, OutputSpec, not_finite
from schemas import Batch, BatchItem, BatchStats, DeadLetter, Prediction, Predictions, Route, Tensor, encode, route_of
from schemas.reasons import MODEL_BAD_INPUT
from topics.catalogue import Catalogue
from topics.deadletters import dead_letter_record
from workers.backends import BatchModel
from workers.failures import ModelFailures

STAGE = "worker"


@dataclass
class BatchOutcome:
    """What one batch produces; the adapter only has to write it out."""

    predictions: dict[Route, list[Prediction]] = field(default_factory=dict)  # by destination
    cache: list[tuple[str, bytes]] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    stats: BatchStats | None = None

    def predictions_records(self) -> list[tuple[str | None, int, Predictions]]:
        """(reply topic or None for ``predictions``, partition, ``Predictions`` record): one
        record per destination."""
        return [(topic, part, Predictions(part, items))
                for (topic, part), items in sorted(self.predictions.items(), key=lambda kv: (kv[0][0] or "", kv[0][1]))]


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


BAD_INPUT = MODEL_BAD_INPUT  # a failure that is the caller's input's, not the model's


def answer_tensor(row: np.ndarray) -> Tensor:
    """A row's tensor: an answer is numbers (a label, a value or class scores), which the
    selector scores and combines; text is a ``class_scores`` model's ``labels``, not its rows."""
    if row.dtype.kind in "OUS":
        raise ModelError(f"an answer of {'text' if row.dtype.kind in 'US' else 'objects'} ({row.dtype.name}) is not "
                         "a number")
    return Tensor.of(row)


def dead_letter(
    reason: str,
    *,
    source: tuple[str, int, int] | None = None,
    query_id: str | None = None,
    payload: bytes | None = None,
) -> DeadLetter:
    """A ``DeadLetter`` record from this stage."""
    return dead_letter_record(stage=STAGE, reason=reason, source=source, query_id=query_id, payload=payload)


@dataclass
class Prepared:
    """A batch checked and stacked, ready for the device: what ``run_batch`` needs and what
    ``finish_batch`` needs afterwards. Items that failed their checks are already answered
    in ``outcome``."""

    batch: Batch
    version: str | None
    received_us: int
    source: tuple[str, int, int] | None
    valid: list[BatchItem] = field(default_factory=list)
    inputs: np.ndarray | None = None
    outcome: BatchOutcome = field(default_factory=BatchOutcome)
    errors: int = 0


@dataclass
class Ran:
    """What the device did with a batch: per-item rows, or the model's failure (``error``: what
    it raised, kept for its traceback until the failure is reported)."""

    rows: list[np.ndarray]
    failure: str | None
    service_us: int
    out_us: int
    error: BaseException | None = field(default=None, repr=False, compare=False)
    # after a failed batch was split to find the inputs it failed on: each row's own failure
    # (None: that row is good), with ``rows`` holding None for the failed ones
    row_failures: list[str | None] | None = None
    finite: bool = False  # every output is a finite number, checked once for the batch


# who answers: (model name, version); None is the batch's own model at its version
Answerer = tuple[str, str | None]


def add_prediction(p: Prepared, item: BatchItem, status: str, output: Tensor | None,
                   error: str | None, out_us: int, by: Answerer | None = None) -> None:
    # a copy: the item itself may still be written whole into a dead letter
    trace = dict(item.trace)
    trace["worker_in"] = p.received_us
    trace["worker_out"] = out_us
    model, version = by or (p.batch.model, p.version)
    p.outcome.predictions.setdefault(route_of(item), []).append(
        Prediction(item.query_id, model, version, status, output, error, trace))


def prepare_batch(
    spec: ModelSpec,
    batch: Batch,
    *,
    version: str | None = None,
    received_us: int,
    source: tuple[str, int, int] | None = None,
    selector_partitions: int | None = None,
    catalogue: Catalogue | None = None,
    answerers: Callable[[BatchItem], list[Answerer]] | None = None,
    clock: Callable[[], int] = now_us,
) -> Prepared:
    """Check every item against ``model.yaml`` and stack the valid ones (CPU work the worker
    does while the device runs the previous batch).

    An item whose prediction could go nowhere (``Catalogue.route_problem``: a partition
    ``predictions`` lacks, or a reply target that is no gateway's reply topic) becomes a dead
    letter only (producing it would fail forever, or write into a topic not for predictions).

    ``answerers`` names who answers an item that fails its checks, one error prediction each
    (a group's members, whose names the selector knows); by default the batch's model.
    """
    p = Prepared(batch, batch.version or version, received_us, source)
    arrays: list[np.ndarray] = []
    for item in batch.items:
        part, reply = item.selector_partition, item.reply_topic
        nowhere = catalogue.route_problem(reply, part, selector_partitions) if catalogue is not None else None
        if nowhere is not None:
            p.errors += 1
            p.outcome.dead_letters.append(dead_letter(nowhere, source=source, query_id=item.query_id,
                                                      payload=encode(item)))
            continue
        try:
            array = item.input.array()
            spec.input.check(array)
        except ClipstreamError as exc:
            reason, at = f"{BAD_INPUT}{exc}", clock()
            by = answerers(item) if answerers is not None else [(batch.model, p.version)]
            p.errors += max(1, len(by))
            for who in by:
                add_prediction(p, item, "error", None, reason, at, who)
            p.outcome.dead_letters.append(
                dead_letter(reason, source=source, query_id=item.query_id, payload=encode(item)))
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
    return predict_rows(model, p.inputs, clock)


# models whose last failed batch failed on every input alone: their next failed batch is not
# split again, so a model that fails on everything costs one call a batch, not two per input
_FAILING_EVERYTHING: set[int] = set()


def predict_rows(model: BatchModel, inputs: np.ndarray, clock: Callable[[], int] = now_us,
                 isolate: bool = True) -> Ran:
    """One timed ``predict_batch`` over ``inputs``, split into rows; a model's failure is caught
    and reported, so one broken model never stops the worker. A batch that fails is split in
    halves to find the inputs it fails on (``_isolate``), so one caller's bad input does not
    fail, or show its data to, the callers batched with it (not with ``isolate`` false: the
    start's check that a model takes a batch at all)."""
    start = time.perf_counter()
    try:
        outputs = model.predict_batch(inputs)
        rows = output_rows(model.spec.output, outputs, len(inputs))
    except Exception as exc:  # any model bug: answer with errors, keep serving (reported in answer_items)
        # returned from here, so this frame keeps no reference to ``exc`` (no cycle through its traceback)
        failure = f"model error: {type(exc).__name__}: {exc}"
        if isolate and len(inputs) == 1 and isinstance(exc, InputError):  # the caller's input, the model says
            return Ran([None], None, int((time.perf_counter() - start) * 1e6), clock(), None, [_failure(exc)])
        if isolate and len(inputs) > 1:
            if id(model) not in _FAILING_EVERYTHING:
                found, failures = _isolate(model, inputs)
                # some were good, or bad input: each answered as it alone went
                if any(f is None or f.startswith(BAD_INPUT) for f in failures):
                    return Ran(found, None, int((time.perf_counter() - start) * 1e6), clock(), exc, failures)
                _FAILING_EVERYTHING.add(id(model))
            failure = f"model error: {type(exc).__name__} on a batch of {len(inputs)} (the model fails on every input)"
        return Ran([], failure, int((time.perf_counter() - start) * 1e6), clock(), exc)
    _FAILING_EVERYTHING.discard(id(model))
    # the batch's outputs at once; its rows are checked one by one only when they are not all
    # finite numbers (or not numbers: an object array, read row by row)
    raw = np.asarray(outputs)
    finite = raw.dtype.kind in "iub" or (raw.dtype.kind == "f" and not not_finite(raw))
    return Ran(rows, None, int((time.perf_counter() - start) * 1e6), clock(), finite=finite)


def _isolate(model: BatchModel, inputs: np.ndarray) -> tuple[list[Any], list[str | None]]:
    """Rows and per-row failures of a batch that failed as a whole, found by running its halves
    apart, and a failing half's halves, down to the inputs it fails on: each gets its own error,
    whose text is about its own input. k bad inputs in n cost about 2k·log2(n/k) more calls."""
    n = len(inputs)
    rows: list[Any] = [None] * n
    failures: list[str | None] = [None] * n

    def split(lo: int, hi: int) -> None:
        mid = (lo + hi) // 2
        for a, b in ((lo, mid), (mid, hi)):
            try:
                rows[a:b] = output_rows(model.spec.output, model.predict_batch(inputs[a:b]), b - a)
            except Exception as exc:
                if b - a > 1:
                    split(a, b)
                else:
                    failures[a] = _failure(exc)

    split(0, n)
    return rows, failures


def _failure(exc: Exception) -> str:
    """One input's failure: ``bad input`` when the model raised ``clipstream.InputError`` (a
    corrupt image: the caller's to mend, not the model's), else a model error."""
    if isinstance(exc, InputError):
        return f"{BAD_INPUT}{exc}"
    return f"model error: {type(exc).__name__}: {exc}"


def finish_batch(p: Prepared, ran: Ran | None, *, worker_id: str, clock: Callable[[], int] = now_us,
                 failures: ModelFailures | None = None) -> BatchOutcome:
    """Shape the outputs into predictions, cache entries and the ``BatchStats`` report; a
    failed model call is told to ``failures`` (the worker's log)."""
    if ran is not None:
        answer_items(p, p.valid, ran, failures=failures)
    return batch_stats(p, ran.service_us if ran is not None else 0, worker_id=worker_id, clock=clock)


def answer_items(p: Prepared, items: list[BatchItem], ran: Ran, *, by: Answerer | None = None,
                 key: Callable[[BatchItem], str | None] = lambda item: item.cache_key,
                 failures: ModelFailures | None = None) -> None:
    """``ran``'s rows as ``items``' predictions by ``by`` (default: the batch's model), each ok
    one cached under ``key(item)`` when it has one; a failed run answers every item with it,
    and is told to ``failures``: error predictions alone would leave a broken model silent."""
    if ran.failure is not None:
        if failures is not None:
            model, version = by or (p.batch.model, p.version)
            failures.failed(model, version, ran.failure, ran.error, group=p.batch.model if by else None)
        ran.error = None  # its traceback holds the batch's arrays
        p.errors += len(items)
        for item in items:
            add_prediction(p, item, "error", None, ran.failure, ran.out_us, by)
        return
    told = False
    for i, (item, row) in enumerate(zip(items, ran.rows)):
        if ran.row_failures is not None and ran.row_failures[i] is not None:
            p.errors += 1
            add_prediction(p, item, "error", None, ran.row_failures[i], ran.out_us, by)
            if ran.row_failures[i].startswith(BAD_INPUT):  # no alert to roll the model back
                continue
            if failures is not None and not told:  # once a batch, with what was raised
                model, version = by or (p.batch.model, p.version)
                failures.failed(model, version, ran.row_failures[i], ran.error,
                                group=p.batch.model if by else None)
                told = True
            continue
        try:
            if not ran.finite and not_finite(row):  # JSON has no NaN: it would read as null
                raise ClipstreamError(f"it is not a finite number ({_first_not_finite(row)})")
            tensor = answer_tensor(row)
        except ClipstreamError as exc:  # e.g. a string label: answers are numbers
            p.errors += 1
            failure = f"model error: output cannot travel: {exc}"
            add_prediction(p, item, "error", None, failure, ran.out_us, by)
            if failures is not None and not told:  # as loud as a model that raises: once a batch
                model, version = by or (p.batch.model, p.version)
                failures.failed(model, version, failure, None, group=p.batch.model if by else None)
                told = True
            continue
        add_prediction(p, item, "ok", tensor, None, ran.out_us, by)
        cache_key = key(item)
        if cache_key:
            p.outcome.cache.append((cache_key, encode(tensor)))
    ran.error = None  # its traceback holds the batch's arrays


def _first_not_finite(row: np.ndarray) -> str:
    values = np.asarray(row).ravel()
    return str(values[~np.isfinite(values)][0])


def batch_stats(p: Prepared, service_us: int, *, worker_id: str,
                clock: Callable[[], int] = now_us) -> BatchOutcome:
    """Close ``p``'s outcome with its ``BatchStats`` report (one per batch, whatever it served)."""
    batch = p.batch
    p.outcome.stats = BatchStats(
        batch_id=batch.batch_id,
        model=batch.model,
        replica=batch.replica,
        batch_size=len(batch.items),
        service_us=service_us,
        queue_wait_us=max(0, p.received_us - batch.created_us),
        errors=p.errors,
        worker_id=worker_id,
        created_us=clock(),
    )
    return p.outcome


def handle_batch(
    model: BatchModel,
    batch: Batch,
    *,
    worker_id: str,
    version: str | None = None,
    received_us: int | None = None,
    source: tuple[str, int, int] | None = None,
    selector_partitions: int | None = None,
    catalogue: Catalogue | None = None,
    clock: Callable[[], int] = now_us,
    failures: ModelFailures | None = None,
) -> BatchOutcome:
    """prepare, run and finish one batch in one go (the worker runs the three on different
    threads, so that the device never waits for the CPU work around it)."""
    received_us = clock() if received_us is None else received_us
    p = prepare_batch(model.spec, batch, version=version, received_us=received_us, source=source,
                      selector_partitions=selector_partitions, catalogue=catalogue, clock=clock)
    return finish_batch(p, run_batch(model, p, clock), worker_id=worker_id, clock=clock, failures=failures)
