"""The selector's Prometheus families: queries and answers per app, defaults by reason,
stragglers per app and model, the answer's latency and its split by stage, policy weights,
and the learner's feedback by outcome.

Counting happens where the selector already touches a query (dispatch, answer, reply) through
label children cached per app and model; the policy weights are read at scrape time from the
last state each app's queries were dispatched with.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from clipstream.clock import now_us
from clipstream.weights import policy_weights
from schemas import Response
from schemas.reasons import EXPIRED_ON_ARRIVAL, MODELS_FAILED, MODELS_LATE, NO_TIME_TO_ASK, NOTHING_ARRIVED
from topics.metrics import LATENCY_BUCKETS, Family, GaugesAtScrape, StageLatency

WEIGHT = "clipstream_policy_weight"
UNKNOWN_APP = "_unknown"  # the label of a query for an app the registry does not hold


def default_reason(reason: str | None) -> str:
    """A bounded label for a default answer's free-text reason."""
    if not reason:
        return "unknown"
    if reason == NOTHING_ARRIVED:
        return "nothing_arrived"
    if reason == NO_TIME_TO_ASK:
        return "no_time_to_ask"
    if reason == EXPIRED_ON_ARRIVAL:
        return "expired_on_arrival"
    if reason.startswith(MODELS_FAILED):
        return "models_failed"
    if reason.startswith(MODELS_LATE):
        return "models_late"
    if reason == "the policy selected no model":
        return "no_model_selected"
    if reason.startswith("the selector could not"):
        return "selector_error"
    return "rejected"  # unknown app, bad input: the dispatch refused the query


class SelectorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry or CollectorRegistry(auto_describe=True)
        self._queries = Family("clipstream_selector_queries", "Queries dispatched, by app.", ("app",), registry=r)
        self._answers = Family("clipstream_selector_answers",
                               "Responses sent, by app and outcome (prediction or default).",
                               ("app", "outcome"), registry=r)
        self._defaults = Family("clipstream_selector_defaults",
                                "Default answers by app and reason (nothing arrived, every model failed, ...).",
                                ("app", "reason"), registry=r)
        self._stragglers = Family("clipstream_selector_stragglers",
                                  "Predictions missing from an answer because they were late: cut off by the "
                                  "deadline, or given up by the model's batcher as unable to make it, by app and "
                                  "model.", ("app", "model"), registry=r)
        self._failed = Family("clipstream_selector_failed",
                              "Predictions that came back without an answer because the model failed (it "
                              "raised, or its output could not be used), by app and model.", ("app", "model"),
                              registry=r)
        self._not_asked = Family("clipstream_selector_not_asked",
                                 "Models not asked for a query: their recent trips (a quantile) were longer than the "
                                 "time it had left, by app and model.", ("app", "model"), registry=r)
        self._latency = Family("clipstream_selector_answer_seconds",
                               "From the query's creation (its `produced` stamp) to its Response, by app.",
                               ("app",),
                               registry=r, buckets=LATENCY_BUCKETS)
        self.stages = StageLatency(r)
        self.latest_state: dict[str, Mapping[str, Any] | None] = {}
        self._global_seen: set[str] = set()  # apps with a query in no context lately dispatched
        # app -> its global state as the process knows it now (the store's memory, which the
        # learner's writes reach too); None: what the last dispatch used. Set before the gauge
        # is registered, which reads it at once.
        self.global_state: Callable[[str], Mapping[str, Any] | None] | None = None
        r.register(GaugesAtScrape(
            {WEIGHT: ("Each model's share of the app's policy weight (Exp3/Exp4): its global weights, those "
                      "of queries with no context, as this selector last read or learnt them (the last query's "
                      "context until it has).", ("app", "model"))}, self._weights))
        self._app: dict[str, tuple[Any, Any, Any, Any]] = {}
        self._defaults_by: dict[tuple[str, str], Any] = {}
        self._stragglers_by: dict[tuple[str, str], Any] = {}
        self._not_asked_by: dict[tuple[str, str], Any] = {}
        self._failed_by: dict[tuple[str, str], Any] = {}

    def reply_budget(self, budget_us: Callable[[], int]) -> None:
        """Expose the reply budget as learnt now. Read beside the gateway's late replies, it
        tells a reply trip longer than the budget (replies a few milliseconds late) from a
        backlog (replies hundreds of milliseconds late)."""
        g = Gauge("clipstream_selector_reply_budget_seconds",
                  "How long before a query's deadline the straggler cutoff fires now "
                  "(a query gets at most its share of its SLO).", registry=self.registry)
        g.set_function(lambda: budget_us() / 1e6)

    def _children(self, app: str) -> tuple[Any, Any, Any, Any]:
        c = self._app.get(app)
        if c is None:
            c = self._app[app] = (self._queries.labels(app), self._answers.labels(app, "prediction"),
                                  self._answers.labels(app, "default"), self._latency.labels(app))
        return c

    def dispatched(self, app: str, state: Mapping[str, Any] | None, context: str | None = None) -> None:
        """A query of a known ``app``, selected with policy ``state`` (that of ``context``). The
        gauge shows the app's global weights, not whichever context came last."""
        self._children(app)[0].inc()
        if context is None:
            self._global_seen.add(app)
        elif app in self._global_seen:
            return
        self.latest_state[app] = state

    def arrived_expired(self, app: str) -> None:
        """A query of a known ``app`` that came past its deadline: counted, though no policy
        selected for it (its default's reason tells it apart)."""
        self._children(app)[0].inc()

    def answered(self, record: Response) -> None:
        app = record.app if record.app in self._app else UNKNOWN_APP
        _, prediction, default, latency = self._children(app)
        if record.is_default:
            default.inc()
            key = (app, default_reason(record.default_reason))
            d = self._defaults_by.get(key)
            if d is None:
                d = self._defaults_by[key] = self._defaults.labels(*key)
            d.inc()
        else:
            prediction.inc()
        produced = record.trace.get("produced")  # when the query was made (the Response's own
        if produced is not None:                  # created_us is when it was answered)
            latency.observe(max(0, now_us() - produced) / 1e6)
        self.stages.observe(record.trace)

    def stragglers(self, app: str, models: Iterable[str]) -> None:
        _count(self._stragglers, self._stragglers_by, app, models)

    def failed(self, app: str, models: Iterable[str]) -> None:
        _count(self._failed, self._failed_by, app, models)

    def not_asked(self, app: str, models: Iterable[str]) -> None:
        _count(self._not_asked, self._not_asked_by, app, models)

    def _weights(self) -> dict[str, list[tuple[tuple[str, ...], float]]]:
        """Each app's weights as the process knows them now, else as its last dispatch used
        them; none for an app ``global_state`` gives ``{}``: one that selects nothing now."""
        known, out = self.global_state, []
        for app, state in list(self.latest_state.items()):
            now = known(app) if known else None
            if now == {}:
                continue
            out += [((app, model), w) for model, w in policy_weights(now or state).items()]
        return {WEIGHT: out}


def _count(family: Family, children: dict[tuple[str, str], Any], app: str, models: Iterable[str]) -> None:
    """One more for each of ``models`` of ``app``; each (app, model) child made once."""
    for model in models:
        key = (app, model)
        c = children.get(key)
        if c is None:
            c = children[key] = family.labels(app, model)
        c.inc()


# what became of a feedback record: the learner's outcomes, a bounded label
FEEDBACK_OUTCOMES = ("applied", "repeated", "nothing_to_learn", "unknown_query", "refused", "failed")


class FeedbackMetrics:
    """``clipstream_selector_feedback_total{app, outcome}``: the only sign, outside Redis, that
    feedback sent through Kafka was applied. ``app`` is the app of the query it is about when
    the registry holds it, else ``_unknown``: the caller names the app of unknown queries."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self._family = Family("clipstream_selector_feedback",
                              "Feedback records the learner is done with, by app and outcome (applied, repeated: "
                              "had before, nothing_to_learn: no model was asked, unknown_query, refused: "
                              "dead-lettered, failed: the learner failed).",
                              ("app", "outcome"), registry=self.registry)
        self._by: dict[tuple[str, str], Any] = {}

    def count(self, app: str | None, outcome: str) -> None:
        """One more feedback with ``outcome`` for ``app`` (None or not in the registry: ``_unknown``)."""
        key = (app or UNKNOWN_APP, outcome)
        c = self._by.get(key)
        if c is None:
            c = self._by[key] = self._family.labels(*key)
        c.inc()
