"""The worker's Prometheus families: batches, their sizes and device time, per model replica.

Observed once per batch from the ``BatchStats`` the worker reports to the batcher anyway, so
the cost does not grow with the batch.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from schemas import BatchStats
from topics.metrics import BATCH_BUCKETS, LATENCY_BUCKETS


class WorkerMetrics:
    def __init__(self, model: str, replica: int, version: str | None) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        labels = (model, str(replica), version or "")
        names = ("model", "replica", "version")
        self._size = Histogram("clipstream_worker_batch_size", "Requests per batch the model ran.", names,
                               registry=r, buckets=BATCH_BUCKETS).labels(*labels)
        self._device = Histogram("clipstream_worker_device_seconds", "predict_batch wall time per batch.", names,
                                 registry=r, buckets=LATENCY_BUCKETS).labels(*labels)
        self._wait = Histogram("clipstream_worker_batch_wait_seconds",
                               "From the batch's creation in the batcher to the worker reading it.", names,
                               registry=r, buckets=LATENCY_BUCKETS).labels(*labels)
        self._errors = Counter("clipstream_worker_errors", "Requests the model failed on.", names,
                               registry=r).labels(*labels)

    def batch(self, stats: BatchStats) -> None:
        self._size.observe(stats.batch_size)
        self._device.observe(stats.service_us / 1e6)
        self._wait.observe(max(0, stats.queue_wait_us) / 1e6)
        if stats.errors:
            self._errors.inc(stats.errors)
