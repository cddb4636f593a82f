"""An ensemble query's requests leave the selector as one record on the first model's topic that
names the others, or as one record per model for batchers that run a process per model
(docs/design/0082)."""

from __future__ import annotations

from schemas import ModelRequest, decode_as
from tests.unit.test_selector_hopeless import _query, _selector


def test_a_query_asks_both_models_in_one_record_on_the_first_ones_topic() -> None:
    sel, requests, _, cat = _selector()
    sel.dispatch(_query(cat, "q", left_us=1_000_000))
    ((topic, value),) = requests.sent
    r = decode_as(ModelRequest, value)
    assert topic == cat.requests("m1").name and (r.model, r.also, r.query_id) == ("m1", ["m2"], "q")


def test_per_model_requests_go_one_record_to_each_models_topic() -> None:
    sel, requests, _, cat = _selector()
    sel.grouped = False
    sel.dispatch(_query(cat, "q", left_us=1_000_000))
    sent = [(topic, decode_as(ModelRequest, value)) for topic, value in requests.sent]
    assert [(t, r.model, r.also) for t, r in sent] == [(cat.requests("m1").name, "m1", []),
                                                      (cat.requests("m2").name, "m2", [])]
