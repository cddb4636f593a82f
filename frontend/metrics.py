"""A few Prometheus metrics in text exposition format, without the prometheus_client package.

The gateway needs counters, gauges and one latency histogram; all are updated from the event
loop thread only (the reply thread hands its counts over with ``call_soon_threadsafe``), so
plain ints suffice and no lock sits on the hot path.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable

# seconds; dense around typical SLOs (10-200 ms)
LATENCY_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0,
)


def _labels(names: tuple[str, ...], values: tuple[str, ...], extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Counter:
    def __init__(self, name: str, help_: str, labels: tuple[str, ...] = ()) -> None:
        self.name, self.help, self.labelnames = name, help_, labels
        self.values: dict[tuple[str, ...], float] = {} if labels else {(): 0.0}

    def inc(self, *labels: str, by: float = 1.0) -> None:
        self.values[labels] = self.values.get(labels, 0.0) + by

    def get(self, *labels: str) -> float:
        return self.values.get(labels, 0.0)

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} counter"
        for key, v in sorted(self.values.items()):
            yield f"{self.name}{_labels(self.labelnames, key)} {v:g}"


class Gauge:
    """A gauge read at scrape time from a callable (in-flight count, readiness)."""

    def __init__(self, name: str, help_: str, read: Callable[[], float]) -> None:
        self.name, self.help, self.read = name, help_, read

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} gauge"
        yield f"{self.name} {float(self.read()):g}"


class Histogram:
    def __init__(
        self, name: str, help_: str, buckets: tuple[float, ...] = LATENCY_BUCKETS,
        labels: tuple[str, ...] = (),
    ) -> None:
        self.name, self.help, self.buckets, self.labelnames = name, help_, buckets, labels
        self.series: dict[tuple[str, ...], list[float]] = {}  # counts per bucket + [sum, count]

    def observe(self, value: float, *labels: str) -> None:
        s = self.series.get(labels)
        if s is None:
            s = self.series[labels] = [0.0] * (len(self.buckets) + 2)
        i = bisect.bisect_left(self.buckets, value)
        if i < len(self.buckets):
            s[i] += 1
        s[-2] += value
        s[-1] += 1

    def count(self, *labels: str) -> int:
        s = self.series.get(labels)
        return int(s[-1]) if s else 0

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} histogram"
        for key, s in sorted(self.series.items()):
            cumulative = 0.0
            for bound, n in zip(self.buckets, s):
                cumulative += n
                le = _labels(self.labelnames, key, 'le="%g"' % bound)
                yield f"{self.name}_bucket{le} {cumulative:g}"
            le = _labels(self.labelnames, key, 'le="+Inf"')
            yield f"{self.name}_bucket{le} {s[-1]:g}"
            yield f"{self.name}_sum{_labels(self.labelnames, key)} {s[-2]:.6f}"
            yield f"{self.name}_count{_labels(self.labelnames, key)} {s[-1]:g}"


class GatewayMetrics:
    """Everything /metrics shows: requests by route and status, latency, defaults, late replies."""

    def __init__(self, inflight: Callable[[], float], limit: Callable[[], float] = lambda: 0.0) -> None:
        self.requests = Counter(
            "clipstream_gateway_requests_total", "HTTP requests by route and status code.",
            ("route", "status"),
        )
        self.latency = Histogram(
            "clipstream_gateway_request_seconds", "Predict latency as the gateway measured it.",
            labels=("outcome",),
        )
        self.defaults = Counter(
            "clipstream_gateway_defaults_total",
            "Predict answers that carried the app's default output, by source.", ("source",),
        )
        self.late = Counter(
            "clipstream_gateway_late_responses_total",
            "Replies that arrived after their caller was answered (or for unknown queries).",
        )
        self.rejected = Counter(
            "clipstream_gateway_overload_rejections_total",
            "Predict requests refused with 503: at the admission limit, or the event loop behind.",
        )
        self.delivery_errors = Counter(
            "clipstream_gateway_delivery_errors_total", "Records Kafka did not accept."
        )
        self.inflight = Gauge(
            "clipstream_gateway_inflight", "Predict requests waiting for a reply.", inflight
        )
        self.limit = Gauge(
            "clipstream_gateway_admission_limit",
            "Predict requests admitted at once (learnt from how the pipeline keeps up).", limit,
        )

    def render(self) -> str:
        parts = [
            self.requests, self.latency, self.defaults, self.late, self.rejected,
            self.delivery_errors, self.inflight, self.limit,
        ]
        return "\n".join(line for m in parts for line in m.render()) + "\n"
