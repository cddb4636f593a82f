"""A model is not asked when its recent trips are longer than the time a query has left."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from clipstream.clock import now_us
from frontend.admission import verdict
from schemas import ModelRequest, Prediction, Predictions, QueryEvent, Response, Tensor, decode_as, encode
from schemas.reasons import NO_TIME_TO_ASK
from selector.join import NOT_ASKED
from selector.metrics import default_reason
from selector.service import Selector
from selector.store import StateStore
from selector.trips import ModelTrips
from selector.types import Output
from tests.fakes import FakeMsg as Msg
from tests.unit.test_selector_state_loading import FakeProducer
from topics.catalogue import Catalogue


def test_a_model_is_hopeless_only_below_the_quantile_of_its_trips_in_the_window() -> None:
    trips = ModelTrips(0.1, horizon_us=1_000_000, min_trips=5, every=1)
    for i in range(4):
        trips.observe("m", 20_000 + i * 1_000, now_us=0)
    assert not trips.hopeless("m", 1, 0)  # four trips: too few to judge by
    for i in range(4, 10):
        trips.observe("m", 20_000 + i * 1_000, now_us=0)
    assert trips.typical_us("m", 0) == 20_000  # the 10th percentile of 20..29 ms, nearest rank
    assert trips.hopeless("m", 19_999, 0) and not trips.hopeless("m", 20_000, 0)
    assert not trips.hopeless("other", 1, 0)  # a model never heard of is asked
    assert not trips.hopeless("m", 1, 1_000_001)  # its trips have left the window: asked again
    for _ in range(5):
        trips.observe("m", 2_000, now_us=1_000_002)
    assert trips.typical_us("m", 1_000_002) == 2_000  # judged by the new trips alone
    assert trips.hopeless("m", 1_999, 1_000_002) and not trips.hopeless("m", 3_000, 1_000_002)
    off = ModelTrips(0.0, min_trips=1)
    off.observe("m", 50_000, 0)
    assert not off.hopeless("m", 1, 0)
    with pytest.raises(ValueError):
        ModelTrips(1.0)
    with pytest.raises(ValueError):
        ModelTrips(0.5, horizon_us=0)


def test_a_backlogs_slow_trips_leave_the_window_however_few_trips_follow_them() -> None:
    # a burst of slow trips, then one quick trip every 100 ms: a window of count would keep the
    # slow ones (and the skip they make) for as long as the trickle lasts
    trips = ModelTrips(0.5, horizon_us=1_000_000, min_trips=4, every=16)
    for i in range(100):
        trips.observe("m", 300_000, now_us=i * 1_000)
    assert trips.hopeless("m", 100_000, 100_000)
    t = 100_000
    while t < 1_100_000:
        t += 100_000
        trips.observe("m", 2_000, now_us=t)
    assert trips.typical_us("m", t) == 2_000 and not trips.hopeless("m", 100_000, t)


def test_the_quantile_is_taken_again_every_few_changes_not_on_each_read() -> None:
    trips = ModelTrips(0.75, horizon_us=10_000_000, min_trips=1, every=4)
    for _ in range(4):
        trips.observe("m", 10_000, now_us=0)
    assert trips.typical_us("m", 0) == 10_000
    for _ in range(3):  # three changes: the quantile read is the one taken before them
        trips.observe("m", 90_000, now_us=1)
    assert trips.typical_us("m", 1) == 10_000
    trips.observe("m", 90_000, now_us=2)  # the fourth: taken again
    assert trips.typical_us("m", 2) == 90_000


class BothModels:
    """A stateless policy that asks every model and answers with the first one's output."""

    stateless = True

    def init(self, models: list[str]) -> dict[str, Any]:
        return {}

    def select(self, state: Any, query: Any) -> list[str]:
        return ["m1", "m2"]

    def combine(self, state: Any, query: Any, arrived: dict[str, Output]) -> tuple[Output, float]:
        return next(iter(arrived.values())), 1.0


def _selector() -> tuple[Selector, FakeProducer, FakeProducer, Catalogue]:
    from clipstream.settings import get_settings

    settings = get_settings()
    cat = Catalogue.from_settings(settings)
    app = SimpleNamespace(name="app", models=("m1", "m2"), default_output=-1)
    apps = SimpleNamespace(versions=lambda name: {}, get=lambda name: (app, BothModels(), SimpleNamespace(kind="label", labels=None)),
                           view=lambda: SimpleNamespace(models={}, apps={"app": app}))
    requests, replies = FakeProducer(), FakeProducer()
    sel = Selector(None, requests, StateStore(None), apps, SimpleNamespace(send=lambda *a, **k: None),  # type: ignore[arg-type]
                   cat, settings, reply_producer=replies,  # type: ignore[arg-type]
                   trips=ModelTrips(0.05, every=1, min_trips=4))
    sel._model_topics |= {"m1", "m2"}
    sel.save = lambda *a: None
    return sel, requests, replies, cat


def asked(requests: FakeProducer) -> list[str]:
    """The models the request records sent name (an ensemble's go in one record: docs/design/0082)."""
    return [m for _, v in requests.sent for r in [decode_as(ModelRequest, v)] for m in (r.model, *r.also)]


def _query(cat: Catalogue, qid: str, left_us: int) -> Msg:
    ev = QueryEvent(query_id=qid, app="app", context=None, input=Tensor.of(np.zeros(2, np.float32)),
                    created_us=now_us(), deadline_us=now_us() + left_us)
    return Msg(encode(ev), cat.queries.name)


def _predictions(cat: Catalogue, trips_us: dict[str, int], qid: str = "old") -> Msg:
    """Predictions that came back ``trips_us`` after their dispatch (for queries long answered)."""
    now = now_us()
    items = [Prediction(qid, m, None, "ok", Tensor.of(np.array(1, np.int64)), None, {"dispatched": now - t})
             for m, t in trips_us.items()]
    return Msg(encode(Predictions(0, items)), cat.predictions.name)


def test_the_selector_asks_only_the_models_that_can_answer_in_the_time_left() -> None:
    sel, requests, replies, cat = _selector()
    for _ in range(4):  # m1 comes back in about 2 ms, m2 in about 300 ms
        sel.collect(_predictions(cat, {"m1": 2_000, "m2": 300_000}))
    sel.dispatch(_query(cat, "q", left_us=100_000))
    assert asked(requests) == ["m1"]
    assert sel.join.get("q").failed == {"m2": NOT_ASKED} and sel.stats["not_asked"] == 1
    assert sel.metrics.registry.get_sample_value("clipstream_selector_not_asked_total",
                                                 {"app": "app", "model": "m2"}) == 1
    assert replies.sent == []  # m1 may still answer: no Response yet


def test_a_query_no_model_can_answer_in_time_is_answered_at_once_as_behind() -> None:
    sel, requests, replies, cat = _selector()
    for _ in range(4):
        sel.collect(_predictions(cat, {"m1": 30_000, "m2": 40_000}))
    sel.dispatch(_query(cat, "q", left_us=20_000))
    assert requests.sent == [] and "q" not in sel.join  # nothing asked, nothing left waiting
    (_, value), = replies.sent
    response = decode_as(Response, value)
    assert response.is_default and response.default_reason == NO_TIME_TO_ASK
    assert sorted(response.missing) == ["m1", "m2"]
    assert default_reason(response.default_reason) == "no_time_to_ask"
    # the gateway reads it as a pipeline behind, and admits fewer queries
    said = {"latency_ms": 5.0, "default": True, "default_reason": NO_TIME_TO_ASK, "models": {"missing": []}}
    assert verdict(said, False, 50.0, 0.6) == "late"
    # with time enough, both are asked again
    sel.dispatch(_query(cat, "q2", left_us=1_000_000))
    assert sorted(asked(requests)) == ["m1", "m2"]


def test_expired_and_error_reports_teach_no_trips() -> None:
    sel, requests, _, cat = _selector()
    now = now_us()
    for status in ("expired", "error"):
        for _ in range(8):
            item = Prediction("old", "m1", None, status, None, "x", {"dispatched": now - 500_000})
            sel.collect(Msg(encode(Predictions(0, [item])), cat.predictions.name))
    assert sel.trips.typical_us("m1", now_us()) is None
    sel.dispatch(_query(cat, "q", left_us=20_000))
    assert sorted(asked(requests)) == ["m1", "m2"]
