"""A one-model app's REST query sent to its model straight (docs/design/0083), with a fake bus:
the request the gateway builds, the answer it makes of the prediction, what it stores for
feedback, and the selector path kept for every other app or when the setting is off."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from fastapi.testclient import TestClient

from clipstream.errors import InfraError
from registry.spec import ModelSpec, OutputSpec, TensorSpec
from registry.topic import AppConfig, ModelConfig, RegistryView
from schemas import ModelRequest, Prediction, Tensor
from tests.unit.test_gateway_http import GOOD, FakeBus, FakeRegistry, answer, make_app, regression_of


class FakeSaver:
    def __init__(self) -> None:
        self.saved: list[tuple[str, dict[str, Any]]] = []

    def put(self, query_id: str, record: dict[str, Any]) -> None:
        self.saved.append((query_id, record))


class OneModelRegistry(FakeRegistry):
    """FakeRegistry's apps, and ``pets1``: a ``single`` app on the class-scores model m1."""

    def __init__(self) -> None:
        super().__init__()
        apps = dict(self._view.apps)
        apps["pets1"] = AppConfig("pets1", "single", 30.0, "unknown", {}, ("m1",))
        self._view = RegistryView(apps=apps, models=self._view.models)


def scores_of(row: list[float]) -> Any:
    def predict(request: ModelRequest) -> Prediction:
        stamps = {**request.trace, "worker_in": request.trace["produced"] + 1_000,
                  "worker_out": request.trace["produced"] + 3_000}
        return Prediction(request.query_id, request.model, "1", "ok", Tensor.of(np.array(row, dtype=np.float32)),
                          None, stamps)
    return predict


def serve(bus: FakeBus, **gw: Any) -> tuple[TestClient, FakeSaver]:
    app = make_app(bus, OneModelRegistry(), **gw)
    saver = FakeSaver()
    app.state.gateway.saver = saver
    return TestClient(app), saver


def test_a_single_apps_query_goes_to_its_model_and_the_prediction_is_the_answer():
    bus = FakeBus(answer, predict=scores_of([0.2, 0.8]))
    client, saver = serve(bus)
    with client:
        r = client.post("/v1/apps/pets1/predict", json={"input": GOOD, "context": "user-7", "slo_ms": 80})
    assert r.status_code == 200, r.text
    body = r.json()
    assert bus.queries == []  # the selector is not asked
    (request,) = bus.requests
    assert request.model == "m1" and request.app == "pets1" and request.query_id == body["query_id"]
    assert request.reply_topic == "t.replies.unit" and request.reply_partition == 0 and request.also == []
    assert request.deadline_us - request.trace["produced"] == 80_000
    assert request.input.shape == [2, 3]
    assert body["output"] == "dog" and body["labels"] == ["cat", "dog"]
    assert body["scores"] == [np.float32(0.2).item(), np.float32(0.8).item()]
    assert body["confidence"] == 1.0 and body["default"] is False
    assert body["models"] == {"answered": ["m1"], "missing": []}
    # stored for the feedback join as the selector stores what it combined
    (qid, stored), = saver.saved
    assert qid == body["query_id"]
    assert stored["app"] == "pets1" and stored["context"] == "user-7"
    assert stored["answer"]["value"] == "dog" and stored["predictions"]["m1"] == stored["answer"]
    assert stored["confidence"] == 1.0 and stored["versions"] == {"m1": "1"} and stored["missing"] == []
    # no selector sees this query: the gateway times its stages
    with client:
        text = client.get("/metrics").text
    assert 'clipstream_stage_latency_seconds_sum{segment="device"} 0.002' in text


def test_a_failed_prediction_is_the_apps_default_with_the_models_error():
    bus = FakeBus(answer, predict=regression_of(0.0, status="error", error="model error: boom"))
    client, saver = serve(bus)
    with client:
        r = client.post("/v1/apps/big/predict", json={"input": [[0.5] * 100] * 200})
    body = r.json()
    assert r.status_code == 200 and body["default"] is True and body["output"] == 0.0
    assert body["default_reason"] == "every model failed: m2: model error: boom"
    assert body["models"] == {"answered": [], "missing": ["m2"]} and body["confidence"] == 0.0
    # stored as the selector stores a default: a feedback on it teaches that m2 gave nothing
    ((qid, stored),) = saver.saved
    assert qid == body["query_id"] and stored["answer"] is None and stored["missing"] == ["m2"]
    with client:
        text = client.get("/metrics").text
    assert 'clipstream_gateway_defaults_total{source="model"} 1.0' in text
    # no selector saw it: the gateway counts the failure against the model, as the selector would
    assert 'clipstream_gateway_failed_total{app="big",model="m2"} 1.0' in text
    assert 'clipstream_gateway_stragglers_total{app="big"' not in text


def test_a_late_model_is_counted_as_a_straggler_and_a_refused_input_against_no_model():
    def counted(status: str, error: str | None) -> str:
        client, _ = serve(FakeBus(answer, predict=regression_of(0.0, status=status, error=error)))
        with client:
            assert client.post("/v1/apps/big/predict", json={"input": [[0.5] * 100] * 200}).json()["default"]
            return client.get("/metrics").text

    text = counted("expired", "deadline passed while queued in the batcher")
    assert 'clipstream_gateway_stragglers_total{app="big",model="m2"} 1.0' in text
    assert 'clipstream_gateway_failed_total{app="big"' not in text
    text = counted("error", "bad input: the model takes 3 features")  # the caller's mistake
    assert 'clipstream_gateway_stragglers_total{app="big"' not in text
    assert 'clipstream_gateway_failed_total{app="big"' not in text


def test_an_empty_output_is_the_apps_default_that_says_so_not_a_500():
    client, saver = serve(FakeBus(answer, predict=scores_of([])))
    with client:
        r = client.post("/v1/apps/pets1/predict", json={"input": GOOD})
    body = r.json()
    assert r.status_code == 200 and body["default"] is True and body["output"] == "unknown"
    assert body["default_reason"].startswith("every model failed: m1: output not used: an empty output tensor")
    ((_, stored),) = saver.saved
    assert stored["predictions"] == {} and stored["missing"] == ["m1"]


def test_a_regression_answer_and_no_prediction_in_time():
    client, _ = serve(FakeBus(answer, predict=regression_of(2.25)))
    with client:
        assert client.post("/v1/apps/big/predict", json={"input": [[0.5] * 100] * 200}).json()["output"] == 2.25
    silent = FakeBus(answer)
    silent.predict = None  # the model never answers: the gateway's own deadline gives the default
    client, saver = serve(silent)
    with client:
        body = client.post("/v1/apps/big/predict", json={"input": [[0.5] * 100] * 200, "slo_ms": 20}).json()
    assert body["default"] is True and body["default_reason"] == "no answer reached the gateway by the deadline" and saver.saved == []
    with client:
        assert 'clipstream_gateway_stragglers_total{app="big",model="m2"} 1.0' in client.get("/metrics").text


def test_ensembles_and_the_setting_off_go_through_the_selector():
    bus = FakeBus(answer, predict=scores_of([0.9, 0.1]))
    client, _ = serve(bus, direct=False)
    with client:
        assert client.post("/v1/apps/pets1/predict", json={"input": GOOD}).json()["output"] == "dog"
    assert len(bus.queries) == 1 and bus.requests == []
    bus = FakeBus(answer, predict=scores_of([0.9, 0.1]))
    client, _ = serve(bus)
    with client:
        client.post("/v1/apps/pets/predict", json={"input": GOOD})  # exp4: the selector selects
    assert len(bus.queries) == 1 and bus.requests == []


def test_the_label_kind_answers_the_value_itself():
    spec = ModelSpec(Path("/l"), "python", TensorSpec("float32", (2, 3)), OutputSpec("label", (3, 5)), cls="x:Y")
    registry = OneModelRegistry()
    registry._view = RegistryView(apps={**registry._view.apps, "l": AppConfig("l", "single", 30.0, -1, {}, ("ml",))},
                                  models={**registry._view.models, "ml": ModelConfig("ml", "1", Path("/l"), spec=spec)})
    bus = FakeBus(answer, predict=lambda req: Prediction(req.query_id, "ml", "1", "cached",
                                                          Tensor.of(np.array(5, dtype=np.int64)), None, {}))
    app = make_app(bus, registry)
    with TestClient(app) as client:
        body = client.post("/v1/apps/l/predict", json={"input": GOOD}).json()
    assert body["output"] == 5 and body["scores"] is None and body["labels"] is None


def test_a_model_topic_that_cannot_be_made_is_a_quick_503_that_says_so():
    bus = FakeBus(answer, predict=scores_of([0.9, 0.1]))

    def refuse(model: str) -> None:
        raise InfraError("cannot create topic t.requests.m1: broker away")

    bus.ensure_request_topic = refuse  # type: ignore[method-assign]
    client, _ = serve(bus)
    with client:
        r = client.post("/v1/apps/pets1/predict", json={"input": GOOD})
    assert r.status_code == 503 and "broker away" in r.json()["detail"] and bus.requests == []
