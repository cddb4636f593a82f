"""The gateway's Prometheus families, in a registry of its own per gateway (rendered by
prometheus_client; the per-request ones are ``topics.metrics.Family``).

The HTTP plumbing counts with ``Labelled.inc(*values)``: a label child is bound once per
label values and cached, so a request costs a dict lookup and an add, no string formatting.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from topics.metrics import LATENCY_BUCKETS, Family, StageLatency, expose, render


# a late reply's lateness: the selector's reply budget (3-40 ms) and the gateway's margin (5 ms)
# below, a backlog's seconds above
LATE_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Labelled:
    """A counter or histogram family (``topics.metrics.Family``) with its children cached by
    label values, for call sites that name the values each time."""

    def __init__(self, metric: Any) -> None:
        self.metric = metric
        self.children: dict[tuple[str, ...], Any] = {}

    def child(self, *values: str) -> Any:
        c = self.children.get(values)
        if c is None:
            c = self.children[values] = self.metric.labels(*values)
        return c

    def inc(self, *values: str, by: float = 1.0) -> None:
        self.child(*values).inc(by)

    def observe(self, value: float, *values: str) -> None:
        self.child(*values).observe(value)


# who decided on a default (``clipstream_gateway_defaults_total{source}``), and where to look
DEFAULT_CAUSES = {
    "gateway_timeout": "no answer reached the gateway by the deadline: with no stage restarting or hung and no "
                       "Kafka alert in up's output, the models take longer than the SLO: add replicas "
                       "(set-replicas), or raise the app's slo_ms",
    "selector": "the selector gave the default: each answer's default_reason says why (docs/CONFIGURATION.md)",
    "not_loaded": "no worker has a model loaded: `clipstream inspect` names it, and why",
    "model": "the model failed or was late: each answer's default_reason says which, and its worker's or "
             "batcher's alert says how",
}


class GatewayMetrics:
    """Requests by route and status, queries and answers per app, latency, defaults, refusals."""

    def __init__(self, inflight: Callable[[], float], limit: Callable[[], float] = lambda: 0.0,
                 waiting: Callable[[], float] = lambda: 0.0, reading: Callable[[], float] = lambda: 0.0) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.requests = Labelled(Family(
            "clipstream_gateway_requests", "HTTP requests by route and status code.",
            ("route", "status"), registry=r))
        self.latency = Labelled(Family(
            "clipstream_gateway_request_seconds", "Predict latency as the gateway measured it.",
            ("outcome",), registry=r, buckets=LATENCY_BUCKETS))
        self.defaults = Labelled(Family(
            "clipstream_gateway_defaults",
            "Predict answers that carried the app's default output, by source.", ("source",), registry=r))
        self.late = Labelled(Family(
            "clipstream_gateway_late_responses",
            "Replies that arrived after their caller was answered (or for unknown queries).", registry=r))
        self.late_by = Labelled(Family(
            "clipstream_gateway_late_response_seconds",
            "How long after its query's deadline a late reply arrived: a few milliseconds says the "
            "reply's trip outgrew the selector's reply budget, seconds say a backlog.",
            registry=r, buckets=LATE_BUCKETS))
        self.rejected = Labelled(Family(
            "clipstream_gateway_overload_rejections",
            "Predict requests refused with 503: at the admission limit, or the event loop behind.", registry=r))
        self.cuts = Labelled(Family(
            "clipstream_gateway_admission_cuts",
            "Cuts of the learnt admission limit, by what set them off: late or slow answers, or the "
            "event loop behind.", ("cause",), registry=r))
        self.delivery_errors = Labelled(Family(
            "clipstream_gateway_delivery_errors", "Records Kafka did not accept.", registry=r))
        self.queries = Labelled(Family(
            "clipstream_gateway_queries", "Predict requests for a known app, by app.", ("app",), registry=r))
        self.answers = Labelled(Family(
            "clipstream_gateway_answers",
            "Predict requests by app and outcome: prediction, default or refused (503).",
            ("app", "outcome"), registry=r))
        self.app_latency = Labelled(Family(
            "clipstream_gateway_query_seconds", "Predict latency per app, as the caller saw it.",
            ("app",), registry=r, buckets=LATENCY_BUCKETS))
        g = Gauge("clipstream_gateway_inflight", "Predict requests waiting for a reply.", registry=r)
        g.set_function(lambda: float(inflight()))
        g = Gauge("clipstream_gateway_admission_limit",
                  "Predict requests admitted at once (learnt from how the pipeline keeps up).", registry=r)
        g.set_function(lambda: float(limit()))
        g = Gauge("clipstream_gateway_admission_waiting",
                  "Predict requests waiting for a slot under the admission limit.", registry=r)
        g.set_function(lambda: float(waiting()))
        # bodies still arriving hold no slot (a slow sender must not block the others): seen here
        g = Gauge("clipstream_gateway_reading_bodies",
                  "Predict requests whose body is still being received (they hold no admission slot).", registry=r)
        g.set_function(lambda: float(reading()))
        # queries answered straight from their model, which no selector sees: their stages, and
        # the model late or failed, as the selector counts them for the queries it answers
        self.stages = StageLatency(r)
        self.stragglers = Labelled(Family(
            "clipstream_gateway_stragglers",
            "Queries of one-model apps sent straight to the model whose prediction was late: not back by "
            "the deadline, or given up by its batcher as unable to make it, by app and model.",
            ("app", "model"), registry=r))
        self.failed = Labelled(Family(
            "clipstream_gateway_failed",
            "Queries of one-model apps sent straight to the model whose prediction came back without an "
            "answer because the model failed (it raised, or its output could not be used), by app and model.",
            ("app", "model"), registry=r))
        self._per_app: dict[str, tuple[Any, Any, Any, Any, Any]] = {}

    def late_replies(self, late_by_us: list[int | None]) -> None:
        """Replies that found no caller waiting, each by how long after its deadline it came
        (None: not known, for a prediction sent straight from a model)."""
        self.late.inc(by=len(late_by_us))
        for us in late_by_us:
            if us is not None:
                self.late_by.observe(max(0, us) / 1e6)

    def app(self, name: str) -> tuple[Any, Any, Any, Any, Any]:
        """The children of one app: (queries, prediction, default, refused, latency)."""
        c = self._per_app.get(name)
        if c is None:
            c = self._per_app[name] = (
                self.queries.child(name), self.answers.child(name, "prediction"),
                self.answers.child(name, "default"), self.answers.child(name, "refused"),
                self.app_latency.child(name))
        return c

    def answered_as(self, outcome: str) -> dict[str, tuple[float, float]]:
        """Per app seen: (queries, those answered with ``outcome``: refused with 503, or
        ``default``) so far."""
        sample = self.registry.get_sample_value
        return {app: (sample("clipstream_gateway_queries_total", {"app": app}) or 0.0,
                      sample("clipstream_gateway_answers_total", {"app": app, "outcome": outcome}) or 0.0)
                for app in list(self._per_app)}

    def default_sources(self) -> dict[str, float]:
        """Defaults so far by who decided on them (``DEFAULT_CAUSES``' keys)."""
        sample = self.registry.get_sample_value
        return {s: sample("clipstream_gateway_defaults_total", {"source": s}) or 0.0 for s in DEFAULT_CAUSES}

    def expose(self) -> None:
        """Serve these on the process's metrics port too (``topics.metrics``)."""
        expose(self.registry)

    def render(self) -> str:
        return render(self.registry).decode()
