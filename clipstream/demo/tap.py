"""A read-only tap on the predictions and batch-stats topics: per-model answers and batch sizes.

The gateway tells a caller only the combined answer; the demo's table of per-model accuracy and
the replayed Exp3 curve need each model's own answer, which the predictions topic carries.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Collection, Mapping
from typing import Any

import numpy as np
from confluent_kafka import Consumer

from clipstream.errors import DecodeError
from clipstream.settings import Settings
from schemas import BatchStats, Prediction, Predictions, decode
from topics import Catalogue, consumer_config


class Tap:
    """Reads from the beginning, so nothing the demo causes is missed while the consumer joins,
    but counts only records stamped from ``since_ms`` on (default: when the tap is made, after
    `up` is ready): `up`'s warm-up traffic must not count in the demo's cache hit rate, its
    expired predictions or its batch sizes."""

    def __init__(self, settings: Settings, served: list[str], labels: list[Any],
                 since_ms: int | None = None) -> None:
        """``served``: the models, or groups, whose batches it sizes."""
        cat = Catalogue.from_settings(settings)
        self._topics = [cat.predictions.name] + [cat.batch_stats(m).name for m in served]
        self._consumer = Consumer(
            consumer_config(settings, f"demo-tap-{uuid.uuid4().hex[:8]}", **{"auto.offset.reset": "earliest"})
        )
        self.labels = labels
        self.since_ms = since_ms if since_ms is not None else time.time_ns() // 1_000_000
        self.answers: dict[str, dict[str, Any]] = defaultdict(dict)  # query -> model -> label
        self.status_counts: dict[str, int] = defaultdict(int)
        self.batch_sizes: list[int] = []
        self.evaluated_by: dict[str, str | None] = {}  # model -> version of its latest evaluation
        self._stop = threading.Event()
        self._assigned = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "Tap":
        self._consumer.subscribe(self._topics)
        self._thread.start()
        return self

    def wait_assigned(self, timeout_s: float = 30.0) -> bool:
        return self._assigned.wait(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            msgs = self._consumer.consume(500, 0.1)
            if self._consumer.assignment():
                self._assigned.set()
            for msg in msgs:
                if msg.error() or msg.timestamp()[1] < self.since_ms:
                    continue
                try:
                    record = decode(msg.value())
                except DecodeError:
                    continue
                with self._lock:
                    if isinstance(record, Predictions):
                        for p in record.items:
                            self._prediction(p)
                    elif isinstance(record, BatchStats):
                        self.batch_sizes.append(record.batch_size)
        self._consumer.close()

    def _prediction(self, p: Prediction) -> None:
        self.status_counts[p.status] += 1
        if p.status == "ok":
            self.evaluated_by[p.model] = p.version
        if p.status not in ("ok", "cached") or p.output is None:
            return
        out = p.output.array()
        label = self.labels[int(np.argmax(out))] if out.ndim == 1 else out.item()
        self.answers[p.query_id][p.model] = label

    def snapshot(self) -> tuple[dict[str, dict[str, Any]], dict[str, int], list[int]]:
        with self._lock:
            return (
                {q: dict(m) for q, m in self.answers.items()},
                dict(self.status_counts),
                list(self.batch_sizes),
            )

    def wait_for(self, expected: Mapping[str, Collection[str]], timeout_s: float = 10.0) -> int:
        """Wait until each query's named models have their prediction here (the tap reads the
        predictions topic a fetch behind the gateway's answers); how many queries still lack one
        at the deadline."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                short = sum(1 for q, ms in expected.items() if not set(ms) <= self.answers.get(q, {}).keys())
            if short == 0 or time.monotonic() >= deadline:
                return short
            time.sleep(0.05)

    def serving(self, model: str) -> str | None:
        """The version that evaluated ``model``'s latest query: a new version serves once its
        workers are warm, a few seconds after the registry names it."""
        with self._lock:
            return self.evaluated_by.get(model)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
