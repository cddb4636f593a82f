"""A query whose every request expired in a batcher's queue is answered as behind, not as broken."""

from __future__ import annotations

import numpy as np

from frontend.admission import verdict
from schemas import Prediction, Predictions, Response, Tensor, decode_as, encode
from schemas.reasons import BEHIND, EXPIRED_IN_QUEUE, QUEUED_PAST_DEADLINE
from selector.metrics import default_reason
from tests.fakes import FakeMsg as Msg
from tests.unit.test_selector_hopeless import _query, _selector
from topics.catalogue import Catalogue


def _report(cat: Catalogue, qid: str, model: str, status: str, error: str | None = None) -> Msg:
    output = Tensor.of(np.array(7, np.int64)) if status == "ok" else None
    item = Prediction(qid, model, None, status, output, error, {})
    return Msg(encode(Predictions(0, [item])), cat.predictions.name)


def _said(response: Response) -> dict:
    """The caller's JSON as admission reads it."""
    return {"latency_ms": 5.0, "default": response.is_default, "default_reason": response.default_reason,
            "models": {"missing": list(response.missing)}}


def test_every_request_expired_in_the_queue_is_a_default_the_gateway_reads_as_behind() -> None:
    sel, _, replies, cat = _selector()
    sel.dispatch(_query(cat, "q", left_us=1_000_000))
    for model in ("m1", "m2"):
        sel.collect(_report(cat, "q", model, "expired", QUEUED_PAST_DEADLINE))
    (_, value), = replies.sent
    response = decode_as(Response, value)
    assert response.is_default and response.default_reason == EXPIRED_IN_QUEUE in BEHIND
    assert sorted(response.missing) == ["m1", "m2"]
    assert default_reason(response.default_reason) == "expired_in_queue"
    assert verdict(_said(response), False, 50.0, 0.6) == "late"  # a quick default, yet a cut


def test_a_model_error_beside_an_expiry_is_a_failure_that_says_nothing_about_load() -> None:
    sel, _, replies, cat = _selector()
    sel.dispatch(_query(cat, "q", left_us=1_000_000))
    sel.collect(_report(cat, "q", "m1", "expired", QUEUED_PAST_DEADLINE))
    sel.collect(_report(cat, "q", "m2", "error", "boom"))
    response = decode_as(Response, replies.sent[-1][1])
    assert response.is_default and response.default_reason.startswith("every model failed")
    assert verdict(_said(response), False, 50.0, 0.6) is None


def test_one_expiry_beside_an_answer_leaves_that_model_missing_from_an_answer() -> None:
    sel, _, replies, cat = _selector()
    sel.dispatch(_query(cat, "q", left_us=1_000_000))
    sel.collect(_report(cat, "q", "m1", "expired", QUEUED_PAST_DEADLINE))
    sel.collect(_report(cat, "q", "m2", "ok"))
    response = decode_as(Response, replies.sent[-1][1])
    assert not response.is_default and list(response.missing) == ["m1"]
    assert verdict(_said(response), False, 50.0, 0.6) == "on_time"
