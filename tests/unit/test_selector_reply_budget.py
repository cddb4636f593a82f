"""The reply budget: a quantile of recent reply trips, between a floor and a cap."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from clipstream.clock import now_us
from schemas import ModelRequest, QueryEvent, Tensor, decode_as, encode
from selector.policies import Single
from selector.reply_budget import ReplyBudget
from selector.service import Selector
from selector.store import StateStore
from tests.unit.test_selector_state_loading import FakeProducer, Msg
from topics.catalogue import Catalogue


def test_quiet_trips_keep_the_floor_and_slow_ones_raise_it_to_their_quantile() -> None:
    b = ReplyBudget(3_000, 10_000, quantile=0.9, window=100, every=1)
    assert b.us == 3_000 and b.adaptive
    for _ in range(100):
        b.observe(800)  # every trip well under the floor
    assert b.us == 3_000
    for i in range(100):  # the window now holds 0..99 ms/10: its 90th percentile (nearest rank) is 8.9 ms
        b.observe(i * 100)
    assert b.us == 8_900
    for _ in range(100):
        b.observe(50_000)  # a stalled broker: the budget stops at the cap
    assert b.us == 10_000
    for _ in range(100):  # and comes back down once the trips are quick again
        b.observe(500)
    assert b.us == 3_000


def test_budget_is_recomputed_every_n_trips_once_the_window_has_them() -> None:
    b = ReplyBudget(0, 10_000, quantile=1.0, window=8, every=4)
    for t in (1_000, 2_000, 3_000):  # a short history: each trip counts at once
        b.observe(t)
        assert b.us == t
    for _ in range(3):
        b.observe(9_000)
    assert b.us == 3_000  # not yet
    b.observe(9_000)  # the 4th since the last recomputation
    assert b.us == 9_000


def test_fixed_budget_ignores_trips_and_bad_arguments_are_refused() -> None:
    b = ReplyBudget(3_000, 0)
    assert not b.adaptive and b.cap_us == 3_000
    b.observe(50_000)
    assert b.us == 3_000
    with pytest.raises(ValueError):
        ReplyBudget(1, 2, quantile=0.0)
    with pytest.raises(ValueError):
        ReplyBudget(1, 2, window=0)


def test_selector_cuts_off_earlier_after_slow_acknowledgements() -> None:
    """The cutoff sent to the models and kept in the join moves with the acknowledged trips."""
    from clipstream.settings import get_settings

    settings = get_settings()
    cat = Catalogue.from_settings(settings)
    app = SimpleNamespace(name="app", models=("m1",), default_output=-1)
    apps = SimpleNamespace(versions=lambda name: {}, get=lambda name: (app, Single(), SimpleNamespace(kind="label", labels=None)))
    requests, replies = FakeProducer(), FakeProducer()
    budget = ReplyBudget(3_000, 10_000, quantile=0.5, window=16, every=1)
    sel = Selector(None, requests, StateStore(None), apps, SimpleNamespace(send=lambda *a, **k: None),  # type: ignore[arg-type]
                   cat, settings, reply_budget=budget, reply_producer=replies, save=lambda *a: None)  # type: ignore[arg-type]
    sel._model_topics.add("m1")
    deadline = now_us() + 30_000_000  # far enough never to come during the test

    def query(qid: str) -> Msg:
        ev = QueryEvent(query_id=qid, app="app", context=None, input=Tensor.of(np.zeros(2, np.float32)),
                        created_us=deadline - 1_000_000, deadline_us=deadline)
        return Msg(encode(ev), cat.queries.name)

    sel.dispatch(query("q0"))
    assert sel.join.get("q0").deadline_us == deadline - 3_000
    sel.answer(sel.join.get("q0"), late_us=0)  # answered by the cutoff timer, on time
    (kw,) = replies.options
    for _ in range(8):  # the broker acknowledged Responses 7 ms after they were produced
        kw["on_delivery"](None, SimpleNamespace(latency=lambda: 0.007))
    kw["on_delivery"]("delivery failed", None)  # a failed delivery teaches nothing
    sel.dispatch(query("q1"))
    assert sel.join.get("q1").deadline_us == deadline - 7_000
    # with nothing arrived by then, the query waits to the floor: the models' deadline is that
    assert sel.join.get("q1").last_resort_us == deadline - 3_000
    assert decode_as(ModelRequest, requests.sent[-1][1]).deadline_us == deadline - 3_000
    app.models = ()  # the policy's choice is no model: nothing was sent, nothing to wait for
    sel.dispatch(query("q2"))
    assert sel.join.get("q2").expected == () and sel.join.get("q2").last_resort_us is None


def test_a_cutoff_answered_late_teaches_the_budget_its_lateness_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reply reaches the caller late by the trip and by how late the timer was served;
    only answers made at the cutoff, which the budget is for, teach it."""
    import selector.service
    from clipstream.clock import now_us

    budget, replies = ReplyBudget(3_000, 50_000, quantile=0.5, window=16, every=1), FakeProducer()
    sel, cat = _one_model_selector(budget, FakeProducer(), replies)
    created = now_us()
    deadline = created + 1_000_000
    ev = QueryEvent(query_id="q", app="app", context=None, input=Tensor.of(np.zeros(2, np.float32)),
                    created_us=created, deadline_us=deadline)
    sel.dispatch(Msg(encode(ev), cat.queries.name))
    # the loop comes back 7 ms past the deadline: its cutoff (3 ms before) was due 10 ms ago
    monkeypatch.setattr(selector.service, "now_us", lambda: now_us() - created + deadline + 7_000)
    sel.answer_expired()
    (kw,) = replies.options
    kw["on_delivery"](None, SimpleNamespace(latency=lambda: 0.001))  # 1 ms to the broker and back
    assert 11_000 <= budget.us < 20_000, budget.us
    sel.dispatch(Msg(encode(dataclasses.replace(ev, query_id="q2", created_us=deadline,
                                                deadline_us=deadline + 30_000_000)), cat.queries.name))
    taught = budget.us
    sel.answer(sel.join.get("q2"))  # complete before its cutoff: it teaches the budget nothing
    replies.options[-1]["on_delivery"](None, SimpleNamespace(latency=lambda: 0.040))
    assert budget.us == taught


def test_slow_query_crossings_raise_the_budget_where_the_acknowledgements_are_quick() -> None:
    """The acknowledgement sees the selector's half of the trip; a query's crossing to the
    selector also holds a fetch and a consumer waking, the half the caller waits for."""
    b = ReplyBudget(3_000, 40_000, quantile=0.9, window=100, every=1)
    for _ in range(100):
        b.observe(1_000)  # the broker acknowledges every Response within a millisecond
    assert b.us == 3_000
    for _ in range(100):
        b.observe_crossing(20_000)  # but queries take 20 ms to reach the selector
    assert b.us == 20_000
    for _ in range(100):
        b.observe(25_000)  # whichever side is slower sets it
    assert b.us == 25_000
    for _ in range(100):
        b.observe(500)
        b.observe_crossing(500)
    assert b.us == 3_000
    fixed = ReplyBudget(3_000, 0)
    fixed.observe_crossing(50_000)
    assert fixed.us == 3_000


def test_a_query_gets_at_most_its_share_of_its_slo_and_never_less_than_the_floor() -> None:
    b = ReplyBudget(3_000, 40_000, quantile=1.0, window=4, every=1, max_share=0.2)
    b.observe_crossing(30_000)
    assert b.us == 30_000
    assert b.for_slo(200_000) == 30_000  # a 200 ms SLO has room for the whole budget
    assert b.for_slo(50_000) == 10_000  # a 50 ms one gives it a fifth
    assert b.for_slo(5_000) == 3_000  # the floor is the last resort, whatever the SLO
    with pytest.raises(ValueError):
        ReplyBudget(1, 2, max_share=0.0)


def test_the_selector_learns_the_crossing_from_each_query_it_reads() -> None:
    """A poll group's queries stamped ``produced`` 25 ms before the poll returned move the
    cutoff of the queries after them 25 ms before their deadline; one with no stamp, or read past
    its deadline, teaches nothing."""
    from clipstream.clock import now_us
    from clipstream.settings import get_settings

    settings = get_settings()
    cat = Catalogue.from_settings(settings)
    app = SimpleNamespace(name="app", models=("m1",), default_output=-1)
    apps = SimpleNamespace(versions=lambda name: {}, get=lambda name: (app, Single(), SimpleNamespace(kind="label", labels=None)))
    budget = ReplyBudget(3_000, 40_000, quantile=1.0, window=16, every=1, max_share=0.2)
    sel = Selector(None, FakeProducer(), StateStore(None), apps, SimpleNamespace(send=lambda *a, **k: None),  # type: ignore[arg-type]
                   cat, settings, reply_budget=budget, reply_producer=FakeProducer(), save=lambda *a: None)  # type: ignore[arg-type]
    sel._model_topics.add("m1")
    received, slo = now_us(), 10_000_000

    def query(qid: str, **trace: int) -> Msg:
        ev = QueryEvent(query_id=qid, app="app", context=None, input=Tensor.of(np.zeros(2, np.float32)),
                        created_us=received, deadline_us=received + slo, trace=trace)
        return Msg(encode(ev), cat.queries.name)

    sel.handle([query("unstamped")], received_us=received)
    assert budget.us == 3_000
    sel.handle([query("replayed", produced=received - 30_000_000)], received_us=received + slo)
    assert budget.us == 3_000  # read at its deadline: a replay, not a trip
    sel.handle([query("q0", produced=received - 25_000)], received_us=received)
    assert budget.us == 25_000
    sel.handle([query("q1", produced=received - 1_000)], received_us=received)
    assert sel.join.get("q1").deadline_us == received + slo - 25_000


def test_a_query_with_no_produced_stamp_is_timed_from_its_making_and_teaches_the_budget_nothing() -> None:
    """A Kafka client's query with an empty trace (docs/KAFKA_CLIENTS.md): its requests carry
    `produced` = its `created_us`, which the answer's latency is timed from, while the reply
    budget, which needs the trip's own time, learns nothing from it."""
    from clipstream.clock import now_us

    budget, requests = ReplyBudget(3_000, 50_000, quantile=0.5, window=16, every=1), FakeProducer()
    sel, cat = _one_model_selector(budget, requests, FakeProducer())
    created = now_us() - 40_000  # made 40 ms ago: far more than any trip the budget knows
    ev = QueryEvent(query_id="q", app="app", context=None, input=Tensor.of(np.zeros(2, np.float32)),
                    created_us=created, deadline_us=created + 1_000_000)
    sel.handle([Msg(encode(ev), cat.queries.name)])
    (topic, value), = requests.sent
    assert decode_as(ModelRequest, value).trace["produced"] == created
    assert budget.us == 3_000  # no crossing observed


def _one_model_selector(budget: ReplyBudget, requests: FakeProducer, replies: FakeProducer) -> tuple[Selector, Catalogue]:
    """A selector of one `single` app over model m1, with ``budget``, sending to the fakes."""
    from clipstream.settings import get_settings

    settings = get_settings()
    cat = Catalogue.from_settings(settings)
    app = SimpleNamespace(name="app", models=("m1",), default_output=-1)
    apps = SimpleNamespace(versions=lambda name: {}, get=lambda name: (app, Single(), SimpleNamespace(kind="label", labels=None)))
    sel = Selector(None, requests, StateStore(None), apps, SimpleNamespace(send=lambda *a, **k: None),  # type: ignore[arg-type]
                   cat, settings, reply_budget=budget, reply_producer=replies, save=lambda *a: None)  # type: ignore[arg-type]
    sel._model_topics.add("m1")
    return sel, cat

