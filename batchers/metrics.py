"""The batcher's Prometheus families, read at scrape time from the counts each model's
``BatcherService`` already keeps: nothing is added to the per-request path.

Per model: requests, cache hits and misses, expired requests, queue depth. Per model replica:
batches, the requests they carried (their ratio is the mean batch size) and the AIMD batch-size
limit, whose gauge over time is the saw-tooth.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily

from topics.metrics import GaugesAtScrape

Samples = dict[str, list[tuple[tuple[str, ...], float]]]

COUNTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "clipstream_batcher_requests": ("Model requests accepted, by model.", ("model",)),
    "clipstream_batcher_cache_hits": ("Requests answered from the prediction cache, by model.", ("model",)),
    "clipstream_batcher_cache_misses": ("Requests sent to a model in a batch, not answered from the cache, by model "
                                        "(hits over hits plus misses: the cache's share).", ("model",)),
    "clipstream_batcher_expired": ("Requests dropped in the queue: their deadline could not be met, by model.",
                                   ("model",)),
    "clipstream_batcher_forwarded": ("Requests of an ensemble's record passed on to the topic of a model this process "
                                     "does not serve, by the model whose topic carried the record.", ("model",)),
    "clipstream_batcher_batches": ("Batches sent, by model and replica.", ("model", "replica")),
    "clipstream_batcher_batched_requests": ("Requests sent in batches, by model and replica (over batches: the "
                                            "mean batch size).", ("model", "replica")),
}
GAUGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "clipstream_batcher_queue_depth": ("Requests waiting in the model's queue.", ("model",)),
    "clipstream_batcher_aimd_limit": ("The AIMD batch-size limit of a model replica.", ("model", "replica")),
    "clipstream_batcher_in_flight": ("Batches sent to a replica and not yet reported done.", ("model", "replica")),
}


def read(services: Mapping[str, Any]) -> tuple[Samples, Samples]:
    """(counters, gauges) of the batcher services by model name."""
    counters: Samples = {name: [] for name in COUNTERS}
    gauges: Samples = {name: [] for name in GAUGES}
    for model, svc in list(services.items()):
        counts = svc.counts
        counters["clipstream_batcher_requests"].append(((model,), counts["requests"]))
        counters["clipstream_batcher_cache_hits"].append(((model,), counts["cached"]))
        counters["clipstream_batcher_cache_misses"].append(((model,), counts["batched"]))  # each its own count: never falls
        counters["clipstream_batcher_expired"].append(((model,), counts["expired"]))
        counters["clipstream_batcher_forwarded"].append(((model,), counts["forwarded"]))
        gauges["clipstream_batcher_queue_depth"].append(((model,), len(svc.core.queue)))
        for r in svc.core.dispatcher.stats():
            key = (model, str(r["replica"]))
            counters["clipstream_batcher_batches"].append((key, r["batches"]))
            counters["clipstream_batcher_batched_requests"].append((key, r["items"]))
            gauges["clipstream_batcher_aimd_limit"].append((key, r["max_batch_size"]))
            gauges["clipstream_batcher_in_flight"].append((key, r["in_flight"]))
    return counters, gauges


def batcher_registry(services: Callable[[], Mapping[str, Any]]) -> CollectorRegistry:
    """A registry whose families are read from ``services()`` at each scrape."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GaugesAtScrape(COUNTERS, lambda: read(services())[0], kind=CounterMetricFamily))
    registry.register(GaugesAtScrape(GAUGES, lambda: read(services())[1]))
    return registry
