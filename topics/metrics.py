"""Prometheus metrics of a stage process: one /metrics port, the shared families, the exposition.

Every stage keeps its families in a ``CollectorRegistry`` of its own (so two gateways or two
selectors built in one test process never share a count) and hands it to ``expose``; the
process's HTTP server (``serve_metrics``, on ``CLIPSTREAM_METRICS_PORT``) and the gateway's
``/metrics`` route render the union of those with prometheus_client's process collector.

What the hot paths pay is kept small: label children are bound once per app or model and
cached, counts a stage already keeps (batcher counts, selector stats) are read at scrape time
by collectors instead of being counted twice, and the per-stage latency comes from the trace
stamps each answered query already carries.
"""

from __future__ import annotations

import errno
import json
import logging
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, disable_created_metrics, generate_latest, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

log = logging.getLogger("clipstream.metrics")

# seconds; dense around typical SLOs (10-200 ms)
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
    0.5, 1.0, 2.5, 5.0,
)
BATCH_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

# a query's time split by the trace stamps it carries (bench/breakdown.py splits it the same way)
SEGMENTS: tuple[tuple[str, str, str], ...] = (
    ("queries_hop", "produced", "dispatched"),
    ("requests_hop", "dispatched", "batcher_in"),
    ("batcher_queue", "batcher_in", "batched"),
    ("batches_hop", "batched", "worker_in"),
    ("device", "worker_in", "worker_out"),
    ("predictions_hop", "worker_out", "selector_in"),
    ("join", "selector_in", "joined"),
)


class MetricsSettings(BaseSettings):
    """Where a stage serves /metrics: ``CLIPSTREAM_METRICS_PORT`` (0: a free port; unset: none)."""

    model_config = SettingsConfigDict(env_prefix="CLIPSTREAM_METRICS_", extra="ignore")

    port: int | None = Field(None, ge=0, le=65535)
    host: str = "127.0.0.1"
    # the file_sd JSON `clipstream up` writes: the gateway's dashboard reads the targets from it
    targets: str | None = None


class _Union(Collector):
    """Whatever the exposed registries hold, collected in the order they were exposed."""

    def __init__(self) -> None:
        self.parts: list[CollectorRegistry] = [REGISTRY]  # process, platform and GC collectors
        self.lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            parts = list(self.parts)
        seen: set[str] = set()
        for registry in parts:
            for metric in registry.collect():
                if metric.name not in seen:  # a family two parts share is shown once
                    seen.add(metric.name)
                    yield metric


disable_created_metrics()  # the *_created series: noise on every scrape
_UNION = _Union()
PROCESS = CollectorRegistry(auto_describe=False)
PROCESS.register(_UNION)


def expose(registry: CollectorRegistry) -> CollectorRegistry:
    """Add a stage's registry to what this process serves (once; returns it)."""
    with _UNION.lock:
        if registry not in _UNION.parts:
            _UNION.parts.append(registry)
    return registry


def unexpose(registry: CollectorRegistry) -> None:
    with _UNION.lock:
        if registry in _UNION.parts:
            _UNION.parts.remove(registry)


def render(*registries: CollectorRegistry) -> bytes:
    """The text exposition of ``registries`` (default: everything this process exposes)."""
    if not registries:
        return generate_latest(PROCESS)
    union = CollectorRegistry(auto_describe=False)
    part = _Union()
    part.parts = [REGISTRY, *registries]
    union.register(part)
    return generate_latest(union)


def serve_metrics(stage: str, settings: MetricsSettings | None = None) -> int | None:
    """Serve /metrics on ``CLIPSTREAM_METRICS_PORT`` from a daemon thread; the port, or None
    when none is asked for or it is taken (the stage serves on without one)."""
    ms = settings or MetricsSettings()
    if ms.port is None:
        return None
    try:
        server, _ = start_http_server(ms.port, ms.host, registry=PROCESS)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        log.warning("%s: metrics port %s is taken; serving no /metrics port", stage, ms.port)
        return None
    return int(server.server_address[1])


class Cell:
    """One counter's value: a float an add away (a single writer: the stage's own loop)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, by: float = 1.0) -> None:
        self.value += by


class Buckets:
    """One histogram's counts per bucket (the last: +Inf) and sum: a bisect and two adds."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds, self.counts, self.sum = bounds, [0] * (len(bounds) + 1), 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # the first bound >= value: `le`
        self.sum += value


class Family(Collector):
    """A counter or histogram family for the hot paths, rendered by prometheus_client.

    prometheus_client's own children take a lock and several calls per update (microseconds
    each); these are plain attributes updated by the one thread that serves the records and
    read at scrape time, where a count read mid-update is off by one at most. Children are
    bound once per label values (``labels``) and kept by the caller."""

    def __init__(self, name: str, help_: str, labelnames: tuple[str, ...] = (), *,
                 buckets: tuple[float, ...] | None = None, registry: CollectorRegistry | None = None) -> None:
        self.name, self.help, self.labelnames, self.buckets = name, help_, labelnames, buckets
        self.children: dict[tuple[str, ...], Any] = {}
        self._lock = threading.Lock()
        if not labelnames:  # shown (as 0) from the start, as prometheus_client's own
            self.labels()
        if registry is not None:
            registry.register(self)

    def labels(self, *values: str) -> Any:
        child = self.children.get(values)
        if child is None:
            with self._lock:
                child = self.children.setdefault(values, Cell() if self.buckets is None else Buckets(self.buckets))
        return child

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    def _family(self) -> Metric:
        if self.buckets is None:
            return CounterMetricFamily(self.name, self.help, labels=list(self.labelnames))
        return HistogramMetricFamily(self.name, self.help, labels=list(self.labelnames))

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for values, child in list(self.children.items()):
            if isinstance(child, Cell):
                family.add_metric(list(values), child.value)
            else:
                counts, total, running = list(child.counts), child.sum, 0
                cumulative = []
                for bound, n in zip((*child.bounds, float("inf")), counts):
                    running += n
                    cumulative.append((floatToGoString(bound), running))
                family.add_metric(list(values), cumulative, total)
        yield family


class StageLatency:
    """``clipstream_stage_latency_seconds{segment}``: a query's time per stage and Kafka hop."""

    def __init__(self, registry: CollectorRegistry) -> None:
        family = Family("clipstream_stage_latency_seconds",
                        "Time of an answered query in each stage and Kafka hop, from its trace stamps.",
                        ("segment",), registry=registry, buckets=LATENCY_BUCKETS)
        self.segments = [(start, end, family.labels(name).observe) for name, start, end in SEGMENTS]

    def observe(self, trace: Mapping[str, int]) -> None:
        get = trace.get
        for start, end, observe in self.segments:
            a, b = get(start), get(end)
            if a is not None and b is not None and b >= a:
                observe((b - a) / 1e6)


class GaugesAtScrape(Collector):
    """Gauge families whose samples a callable reads at scrape time (no cost per record).

    ``read`` returns ``{family name: [(label values, value), ...]}`` for families declared in
    ``families`` as ``name -> (help, label names)``."""

    def __init__(self, families: Mapping[str, tuple[str, tuple[str, ...]]],
                 read: Callable[[], Mapping[str, Iterable[tuple[tuple[str, ...], float]]]],
                 kind: type = GaugeMetricFamily) -> None:
        self.families, self.read, self.kind = dict(families), read, kind

    def collect(self) -> Iterator[Metric]:
        try:
            values = self.read()
        except Exception:  # a scrape must never take the stage down
            log.exception("reading metrics failed")
            values = {}
        for name, (help_, labels) in self.families.items():
            family = self.kind(name, help_, labels=list(labels))
            for label_values, value in values.get(name, ()):
                family.add_metric(list(label_values), float(value))
            yield family


def lag_of(stats_json: str) -> dict[str, float]:
    """Records behind the high watermark per topic, from a librdkafka statistics report (the
    partitions this consumer fetches; -1, unknown yet, counts as none)."""
    try:
        stats = json.loads(stats_json)
    except ValueError:
        return {}
    lag: dict[str, float] = {}
    for topic, t in (stats.get("topics") or {}).items():
        for p in (t.get("partitions") or {}).values():
            n = p.get("consumer_lag", -1)
            if p.get("partition", -1) >= 0 and p.get("fetch_state") not in (None, "none", "stopped") and n >= 0:
                lag[topic] = lag.get(topic, 0.0) + n
    return lag


class ConsumerLag(GaugesAtScrape):
    """``clipstream_consumer_lag_records{group,topic}``, from the statistics librdkafka reports
    on the consumer's own polling thread: a scrape never calls into a consumer (a call from a
    second thread waits on the one that polls)."""

    NAME = "clipstream_consumer_lag_records"
    EVERY_MS = 5000

    def __init__(self) -> None:
        self.lag: dict[str, dict[str, float]] = {}
        super().__init__({self.NAME: ("Records a consumer group is behind the end of a topic, as this "
                                      "process's consumer sees it.", ("group", "topic"))}, self._read)

    def config(self, group: str) -> dict[str, Any]:
        """Consumer settings that report ``group``'s lag here (merge them into its config)."""
        def report(stats_json: str) -> None:
            self.lag[group] = lag_of(stats_json)

        return {"statistics.interval.ms": self.EVERY_MS, "stats_cb": report}

    def _read(self) -> dict[str, list[tuple[tuple[str, ...], float]]]:
        return {self.NAME: [((group, topic), n) for group, lags in list(self.lag.items())
                            for topic, n in sorted(lags.items())]}


LAG = ConsumerLag()
REGISTRY.register(LAG)



def _dead_letters() -> dict[str, list[tuple[tuple[str, ...], float]]]:
    from topics.deadletters import COUNTS  # counted where every dead letter is built

    return {"clipstream_dead_letters": [(key, n) for key, n in list(COUNTS.items())]}


REGISTRY.register(GaugesAtScrape(
    {"clipstream_dead_letters": ("Dead letters this process wrote, by stage and reason (at most the first four "
                                 "words before the reason's first colon, without quoted values: "
                                 "`clipstream deadletters` gives each whole).", ("stage", "reason"))},
    _dead_letters, kind=CounterMetricFamily))


def _redis() -> dict[str, list[tuple[tuple[str, ...], float]]]:
    from clipstream.redisclient import GUARDS

    available: dict[str, float] = {}
    outages: dict[str, float] = {}
    for g in list(GUARDS):  # guards of one name (two stages built in one test process) add up
        available[g.name] = min(available.get(g.name, 1.0), float(g.available()))
        outages[g.name] = outages.get(g.name, 0.0) + g.outages
    return {"clipstream_redis_available": [((n,), v) for n, v in sorted(available.items())],
            "clipstream_redis_outages": [((n,), v) for n, v in sorted(outages.items())]}


# Redis is a cache (docs/design/0016): a stage serves on without it, so only these say it is away
REGISTRY.register(GaugesAtScrape(
    {"clipstream_redis_available": ("1 while this process's users of Redis find it answering; 0 from a failed "
                                    "command until a probe answers again.", ("user",))},
    lambda: {k: v for k, v in _redis().items() if k == "clipstream_redis_available"}))
REGISTRY.register(GaugesAtScrape(
    {"clipstream_redis_outages": ("Times Redis went away for this process's users of it.", ("user",))},
    lambda: {k: v for k, v in _redis().items() if k == "clipstream_redis_outages"}, kind=CounterMetricFamily))
