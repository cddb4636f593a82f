"""Response record -> caller JSON, and the strict request bodies."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pydantic import ValidationError

from frontend.gateway_models import (
    FeedbackRequest, PredictRequest, PredictResponse, default_json, response_json,
    validation_reason,
)
from frontend.gateway_http import key_allowed, key_of, route_label
from schemas import Response

RECORD = Response(
    query_id="q1", app="pets", output=3, scores=[0.1, 0.2, 0.7],
    labels=["1", "2", "3"], confidence=0.6666, is_default=False, default_reason=None,
    answered=["a", "b"], missing=["c"], created_us=1, deadline_us=2, trace={},
)


def test_response_maps_every_field():
    got = response_json(RECORD, 12.34567, default_output="none")
    assert got == {
        "query_id": "q1", "output": 3, "scores": [0.1, 0.2, 0.7], "labels": ["1", "2", "3"],
        "confidence": 0.6666, "default": False, "default_reason": None,
        "models": {"answered": ["a", "b"], "missing": ["c"]}, "latency_ms": 12.346,
    }
    PredictResponse.model_validate(got)  # the documented schema holds


def test_regression_output_and_no_scores():
    got = response_json(replace(RECORD, output=2.5, scores=None, labels=None), 1.0)
    assert got["output"] == 2.5 and got["scores"] is None and got["labels"] is None


def test_json_safe_numbers_and_clamped_confidence():
    rec = replace(RECORD, scores=[float("nan"), 1.0, float("inf")], confidence=1.5,
                  output=float("nan"))
    got = response_json(rec, 1.0)
    assert got["scores"] == [None, 1.0, None] and got["confidence"] == 1.0 and got["output"] is None
    assert response_json(replace(RECORD, confidence=float("nan")), 1.0)["confidence"] == 0.0
    assert response_json(replace(RECORD, confidence=-0.2), 1.0)["confidence"] == 0.0


def test_selector_default_without_output_takes_the_app_default():
    rec = replace(RECORD, is_default=True, default_reason="no predictions", output=None,
                  answered=[], missing=["a"])
    got = response_json(rec, 5.0, default_output="unknown")
    assert got["output"] == "unknown" and got["default"] is True
    assert got["default_reason"] == "no predictions"


def test_gateway_default_when_nothing_arrived():
    got = default_json("q9", 0, ("a", "b"), 55.5)
    assert got["query_id"] == "q9" and got["output"] == 0 and got["default"] is True
    assert got["confidence"] == 0.0 and got["models"] == {"answered": [], "missing": ["a", "b"]}
    assert got["default_reason"] == "no answer reached the gateway by the deadline" and got["scores"] is None


def test_request_bodies_are_strict():
    assert PredictRequest.model_validate({"input": [1], "slo_ms": 50}).slo_ms == 50
    for bad in ({"input": 1, "slo_ms": True}, {"input": 1, "slo_ms": -1},
                {"input": 1, "slo_ms": 1e9}, {"input": 1, "context": 5}):
        with pytest.raises(ValidationError):
            PredictRequest.model_validate(bad)
    fb = FeedbackRequest.model_validate({"query_id": "q", "label": True})
    assert fb.label is True
    with pytest.raises(ValidationError) as info:
        FeedbackRequest.model_validate({"query_id": "", "reward": 1.5})
    reason = validation_reason(info.value)
    assert "query_id" in reason and "reward" in reason


def test_api_key_extraction_and_check():
    assert key_of({"authorization": "Bearer abc"}) == "abc"
    assert key_of({"authorization": "bearer  abc "}) == "abc"
    assert key_of({"x-api-key": "k"}) == "k"
    assert key_of({"authorization": "Basic xyz"}) is None
    assert key_of({}) is None
    assert key_allowed("k2", ("k1", "k2")) and not key_allowed("k3", ("k1", "k2"))
    assert not key_allowed(None, ("k1",))


def test_route_labels_are_bounded():
    assert route_label("/v1/apps/anything/predict") == "predict"
    assert route_label("/v1/apps/x/feedback") == "feedback"
    assert route_label("/readyz") == "readyz"
    assert route_label("/v1/apps/x/other") == "other"
    assert [route_label(f"/v2/models/{'x' * 300}{tail}") for tail in ("/infer", "", "/ready")] == [
        "v2-infer", "v2-model", "v2-model"]  # never the app's name
    assert route_label("/v2/health/live") == route_label("/v2") == "v2-server"
