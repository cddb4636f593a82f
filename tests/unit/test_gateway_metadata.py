"""``GET /v1/apps/{app}``: what an app takes and answers, behind the same keys as its predict."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.unit.test_gateway_http import GOOD, FakeBus, answer, make_app


def test_an_apps_metadata_says_what_to_send_and_what_comes_back() -> None:
    with TestClient(make_app(FakeBus(answer))) as c:
        r = c.get("/v1/apps/pets")
        assert r.status_code == 200, r.text
        assert r.json() == {
            "name": "pets", "policy": "exp4", "slo_ms": 30.0, "default_output": "unknown",
            "input": {"dtype": "float32", "shape": [2, 3]},
            "output": {"kind": "class_scores", "labels": ["cat", "dog"]},
            "models": [{"name": "m1", "version": "1"}],
        }
        assert c.post("/v1/apps/pets/predict", json={"input": GOOD}).status_code == 200  # what it says works
        assert c.get("/v1/apps/big").json()["output"] == {"kind": "regression", "labels": None}
        missing = c.get("/v1/apps/nope")
        assert missing.status_code == 404 and "unknown app 'nope'" in missing.json()["detail"]
        assert "/v1/apps/{app}" in c.get("/openapi.json").json()["paths"]


def test_an_apps_metadata_takes_the_keys_its_predict_takes() -> None:
    with TestClient(make_app(FakeBus(answer), api_keys=("root",), app_keys={"pk": ("pets",)})) as c:
        assert c.get("/v1/apps/pets").status_code == 401
        assert c.get("/v1/apps/pets", headers={"X-API-Key": "pk"}).status_code == 200
        assert c.get("/v1/apps/big", headers={"X-API-Key": "pk"}).status_code == 403
        assert c.get("/v1/apps/big", headers={"X-API-Key": "root"}).status_code == 200
