"""The dashboard's numbers: scrapes of every stage's /metrics turned into time series.

Pure logic, no I/O: ``merge`` sums the samples of several scrapes (two selector members'
counters add up; a gauge that must not add up, a policy weight or the AIMD limit each batcher
member keeps for a replica, is averaged), and ``Series``
turns successive merged scrapes into one row per scrape of rates, quantiles and gauges, kept
for the last ``keep`` scrapes. Rates and quantiles are taken over a window of a few scrapes,
as Prometheus' ``rate()`` and ``histogram_quantile()`` would be.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

Key = tuple[str, tuple[tuple[str, str], ...]]  # (sample name, sorted labels)
Samples = dict[Key, float]
Row = dict[str, dict[str, float | None]]  # panel id -> series name -> value

AVERAGED = frozenset({"clipstream_policy_weight", "clipstream_batcher_aimd_limit"})

# (panel id, title, unit): the order the page shows them in
PANELS: tuple[tuple[str, str, str], ...] = (
    ("throughput", "Throughput per app", "answers/s"),
    ("latency", "Latency per app: p50 and p99 (dashed: SLO)", "ms"),
    ("outcomes", "Answers by outcome", "answers/s"),
    ("batch_size", "Batch size per model replica (mean) and AIMD limit", "requests"),
    ("queue", "Queue depth per model", "requests"),
    ("cache", "Cache hit rate per model", "share"),
    ("device", "Device busy per model replica (share of time in predict_batch)", "share"),
    ("weights", "Policy weights per app (Exp3/Exp4)", "share"),
    ("breakdown", "Latency by stage (mean of recent queries)", "ms"),
    ("stragglers", "Stragglers, failed models, the selector's defaults by reason", "per s"),
    ("feedback", "Feedback per app, by what the learner did with it", "per s"),
    ("admission", "Gateway admission: limit, in flight, cuts/s by cause", "requests"),
)


def parse(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample in a text exposition."""
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]


def merge(scrapes: Iterable[list[tuple[str, dict[str, str], float]]]) -> Samples:
    """One sample set from several processes' scrapes: summed, except ``AVERAGED`` gauges."""
    total: Samples = {}
    seen: dict[Key, int] = {}
    for samples in scrapes:
        for name, labels, value in samples:
            if math.isnan(value):
                continue
            key = (name, tuple(sorted(labels.items())))
            total[key] = total.get(key, 0.0) + value
            seen[key] = seen.get(key, 0) + 1
    for key, n in seen.items():
        if key[0] in AVERAGED and n > 1:
            total[key] /= n
    return total


Scrape = list[tuple[str, dict[str, str], float]]
# the samples of a counter or a histogram: they only grow while their process lives
_GROWING = ("_total", "_bucket", "_count", "_sum")


class Continuity:
    """Each stage's counters as one unbroken count across the scrapes it missed and its
    restarts, as Prometheus' ``rate()`` reads each series on its own. Summed as they come, a
    stage that does not answer one scrape (hung, restarting) drops its counters from the total,
    and the next scrape shows them all again as one burst of work that never happened."""

    def __init__(self) -> None:
        self._last: dict[str, Samples] = {}  # stage -> its latest scrape
        self._offset: dict[str, Samples] = {}  # stage -> what its counters had before a restart

    def samples(self, scraped: Mapping[str, Scrape | None]) -> list[Scrape]:
        """Each stage's samples to merge: ``scraped`` maps every stage listed now to its scrape,
        None for one that did not answer (its last counters stand, its gauges too)."""
        out: list[Scrape] = []
        for stage, scrape in scraped.items():
            last = self._last.get(stage)
            if scrape is not None:
                now = {(name, tuple(sorted(labels.items()))): value for name, labels, value in scrape}
                offset = self._offset.setdefault(stage, {})
                for key, before in (last or {}).items():
                    value = now.get(key)
                    if key[0].endswith(_GROWING) and (value is None or value < before):  # restarted
                        offset[key] = offset.get(key, 0.0) + before
                self._last[stage] = last = now
            if last is None:
                continue
            offset = self._offset.get(stage, {})
            totals = {**dict.fromkeys(offset, 0.0), **last}
            out.append([(name, dict(pairs), value + offset.get((name, pairs), 0.0))
                        for (name, pairs), value in totals.items()])
        for stage in set(self._last) - set(scraped):  # no longer listed: removed or retired
            self._last.pop(stage, None)
            self._offset.pop(stage, None)
        return out


def by(samples: Samples, name: str, *labels: str) -> dict[tuple[str, ...], float]:
    """``name``'s samples summed over every label but ``labels``, keyed by those labels' values."""
    out: dict[tuple[str, ...], float] = {}
    for (n, pairs), value in samples.items():
        if n != name:
            continue
        d = dict(pairs)
        key = tuple(d.get(label, "") for label in labels)
        out[key] = out.get(key, 0.0) + value
    return out


def quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """``histogram_quantile``: linear within the bucket the rank falls in; None with no data."""
    bounds = sorted(buckets)
    if not bounds:
        return None
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    rank, prev_bound, prev_count = q * total, 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return prev_bound
            if count == prev_count:
                return bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = bound, count
    return prev_bound


class Series:
    """Successive merged scrapes -> rows of the dashboard's panels (the last ``keep``)."""

    def __init__(self, keep: int = 900, window: int = 5) -> None:
        self.rows: deque[tuple[float, Row]] = deque(maxlen=keep)
        self.scrapes: deque[tuple[float, Samples]] = deque(maxlen=window + 1)

    def add(self, t: float, samples: Samples, slos: Mapping[str, float] | None = None) -> Row:
        self.scrapes.append((t, samples))
        t0, old = self.scrapes[0]
        dt = t - t0
        row = self.row(old, samples, dt, slos or {})
        self.rows.append((t, row))
        return row

    @staticmethod
    def row(old: Samples, new: Samples, dt: float, slos: Mapping[str, float]) -> Row:
        w = _Window(old, new, dt, frozenset(slos))
        row: Row = {pid: {} for pid, _, _ in PANELS}
        _answers(w, row, slos)
        _models(w, row)
        _cutoffs(w, row)
        return row

    def to_json(self, since: float | None = None) -> dict[str, Any]:
        """``{"t": [...], "panels": [{"id", "title", "unit", "series": {name: [...]}}]}`` of the
        rows after ``since`` (all: None), every series as long as ``t`` (None where it had no
        value). The page asks for what it has not seen, so a poll costs a row, not the history."""
        rows = [(t, row) for t, row in self.rows if since is None or t > since]
        times = [t for t, _ in rows]
        panels = []
        for pid, title, unit in PANELS:
            names: dict[str, None] = {}
            for _, row in rows:
                names.update(dict.fromkeys(row[pid]))
            series = {name: [row[pid].get(name) for _, row in rows] for name in sorted(names)}
            panels.append({"id": pid, "title": title, "unit": unit, "series": series})
        return {"t": times, "panels": panels}


class _Window:
    """Two merged scrapes ``dt`` seconds apart: counters as increases or rates over the window,
    gauges as the newer scrape holds them. With ``apps`` (the registry's), series of other apps
    are left out: a removed app's counters and weights stay in the stages' metrics until they
    restart, and would draw flat lines."""

    def __init__(self, old: Samples, new: Samples, dt: float, apps: frozenset[str] = frozenset()) -> None:
        self.old, self.new, self.dt, self.apps = old, new, dt, apps

    def _ours(self, values: dict[tuple[str, ...], float], labels: tuple[str, ...]) -> dict[tuple[str, ...], float]:
        if not self.apps or "app" not in labels:
            return values
        at = labels.index("app")
        return {k: v for k, v in values.items() if k[at] in self.apps}

    def delta(self, name: str, *labels: str) -> dict[tuple[str, ...], float]:
        a, b = by(self.old, name, *labels), self._ours(by(self.new, name, *labels), labels)
        return {k: max(0.0, v - a.get(k, 0.0)) for k, v in b.items()}

    def rate(self, name: str, *labels: str) -> dict[tuple[str, ...], float]:
        return {k: v / self.dt for k, v in self.delta(name, *labels).items()} if self.dt > 0 else {}

    def gauge(self, name: str, *labels: str) -> dict[tuple[str, ...], float]:
        return self._ours(by(self.new, name, *labels), labels)


def _answers(w: _Window, row: Row, slos: Mapping[str, float]) -> None:
    """Throughput, latency and outcomes as callers got them: the gateway's counts for the apps
    it answers, the selector's for apps no gateway asked (Kafka clients alone). The selector
    also answers queries whose caller the gateway has already answered by the deadline (a
    backlog drained after an outage): counted beside the gateway's, they would draw answers
    nobody received."""
    gateway_answers = w.rate("clipstream_gateway_answers_total", "app", "outcome")
    via_gateway = {app for (app, _) in gateway_answers}
    answers: dict[tuple[str, ...], float] = {}
    for (app, outcome), v in gateway_answers.items():
        if outcome != "refused":  # a 503 is no answer: it has its own line below
            answers[(app,)] = answers.get((app,), 0.0) + v
    kafka_only = {k: v for k, v in w.rate("clipstream_selector_answers_total", "app").items() if k[0] not in via_gateway}
    row["throughput"] = {app: v for (app,), v in {**answers, **kafka_only}.items()}
    buckets = {k: v for k, v in w.delta("clipstream_selector_answer_seconds_bucket", "app", "le").items()
               if k[0] not in via_gateway}
    buckets.update(w.delta("clipstream_gateway_query_seconds_bucket", "app", "le"))
    per_app: dict[str, dict[float, float]] = {}
    for (app, le), v in buckets.items():
        per_app.setdefault(app, {})[float(le)] = v
    for app, b in sorted(per_app.items()):
        for q in (0.5, 0.99):
            v = quantile(q, b)
            row["latency"][f"{app} p{int(q * 100)}"] = None if v is None else v * 1000.0
        if app in slos:
            row["latency"][f"{app} SLO"] = float(slos[app])
    outcomes = row["outcomes"]
    for (app, outcome), v in gateway_answers.items():
        if outcome == "prediction":
            outcomes["prediction"] = outcomes.get("prediction", 0.0) + v
    for (source,), v in w.rate("clipstream_gateway_defaults_total", "source").items():
        if source in GATEWAY_DEFAULTS:
            outcomes[GATEWAY_DEFAULTS[source]] = v
    for (app, outcome), v in w.rate("clipstream_selector_answers_total", "app", "outcome").items():
        if app not in via_gateway:  # Kafka clients': the selector's counts are the callers'
            key = "prediction" if outcome == "prediction" else "default: decided by the selector"
            outcomes[key] = outcomes.get(key, 0.0) + v
    for (outcome,), v in w.rate("clipstream_gateway_answers_total", "outcome").items():
        if outcome == "refused":
            outcomes["refused (503)"] = v


# the gateway's defaults (``clipstream_gateway_defaults_total{source}``) as the outcomes panel
# names them: who decided on each; the selector's reasons are in the stragglers panel
GATEWAY_DEFAULTS = {
    "selector": "default: decided by the selector",
    "gateway_timeout": "default: no answer reached the gateway by the deadline",
    "not_loaded": "default: no worker has the model loaded",
    "model": "default: the model failed or was late (one-model app)",
}


def _models(w: _Window, row: Row) -> None:
    """The batchers', workers' and policies' panels: batch sizes and limits, queues, cache
    hits, device time, weights, and each stage's share of the latency."""
    batches = w.delta("clipstream_batcher_batches_total", "model", "replica")
    items = w.delta("clipstream_batcher_batched_requests_total", "model", "replica")
    for (model, replica), n in sorted(batches.items()):
        row["batch_size"][f"{model}.{replica} mean"] = items.get((model, replica), 0.0) / n if n else None
    for (model, replica), v in sorted(w.gauge("clipstream_batcher_aimd_limit", "model", "replica").items()):
        row["batch_size"][f"{model}.{replica} limit"] = v
    row["queue"] = {m: v for (m,), v in sorted(w.gauge("clipstream_batcher_queue_depth", "model").items())}
    hits = w.delta("clipstream_batcher_cache_hits_total", "model")
    misses = w.delta("clipstream_batcher_cache_misses_total", "model")
    looked_up = {m: hits.get(m, 0.0) + misses.get(m, 0.0) for m in {*hits, *misses}}
    row["cache"] = {m: (hits.get((m,), 0.0) / n if n else None) for (m,), n in sorted(looked_up.items())}
    # a worker per replica: its seconds in predict_batch a second is the share of time its device was busy
    busy = w.rate("clipstream_worker_device_seconds_sum", "model", "replica")
    row["device"] = {f"{model}.{replica}": v for (model, replica), v in sorted(busy.items())}
    weights = w.gauge("clipstream_policy_weight", "app", "model")
    row["weights"] = {f"{app}: {model}": v for (app, model), v in sorted(weights.items())}
    sums = w.delta("clipstream_stage_latency_seconds_sum", "segment")
    counts = w.delta("clipstream_stage_latency_seconds_count", "segment")
    row["breakdown"] = {s: (sums.get((s,), 0.0) / n * 1000.0 if n else None) for (s,), n in counts.items()}


def _cutoffs(w: _Window, row: Row) -> None:
    """Where queries were cut short: stragglers and defaults at the selector, and the gateway's
    admission (its gauges summed over the gateway members)."""
    # a one-model app's queries sent straight to its model are the gateway's to count
    for kind in ("stragglers", "failed"):
        both = [w.rate(f"clipstream_{stage}_{kind}_total", "app", "model") for stage in ("selector", "gateway")]
        for app, model in sorted({*both[0], *both[1]}):
            row["stragglers"][f"{kind} {app}: {model}"] = sum(b.get((app, model), 0.0) for b in both)
    for (reason,), v in sorted(w.rate("clipstream_selector_defaults_total", "reason").items()):
        row["stragglers"][f"selector defaults: {reason}"] = v
    for (model,), v in sorted(w.rate("clipstream_worker_errors_total", "model").items()):
        row["stragglers"][f"failed in the worker: {model}"] = v  # one-model apps' too, which no selector sees
    for (app, outcome), v in sorted(w.rate("clipstream_selector_feedback_total", "app", "outcome").items()):
        row["feedback"][f"{app} {outcome}"] = v
    for name, family in (("limit", "clipstream_gateway_admission_limit"),
                         ("in flight", "clipstream_gateway_inflight"),
                         ("waiting", "clipstream_gateway_admission_waiting")):
        total = w.gauge(family).get(())
        if total is not None:
            row["admission"][name] = total
    for (cause,), v in sorted(w.rate("clipstream_gateway_admission_cuts_total", "cause").items()):
        row["admission"][f"cuts: {cause}"] = v
