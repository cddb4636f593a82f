"""A predict body that is one example's raw bytes (``application/octet-stream``): read by the
model's declared input, with ``context`` and ``slo_ms`` in the query string, and refused with a
reason when it is not one example."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.unit.test_gateway_http import FakeBus, answer, make_app

OCTETS = {"content-type": "application/octet-stream"}
EXAMPLE = np.arange(6, dtype="<f4").reshape(2, 3)  # app pets: float32 (2, 3)


def test_an_examples_raw_bytes_are_the_query_as_its_json_would_be() -> None:
    bus = FakeBus(answer)
    with TestClient(make_app(bus)) as c:
        r = c.post("/v1/apps/pets/predict?context=user-7&slo_ms=80", content=EXAMPLE.tobytes(), headers=OCTETS)
        assert r.status_code == 200, r.text
        assert r.json()["output"] == "dog" and r.json()["query_id"]
        as_json = c.post("/v1/apps/pets/predict", json={"input": EXAMPLE.tolist(), "context": "user-7", "slo_ms": 80})
        assert as_json.status_code == 200
    (binary, _), (json_event, _) = bus.queries
    assert binary.input == json_event.input  # the same tensor, bytes and all
    assert binary.context == "user-7" and binary.deadline_us - binary.created_us == 80_000


@pytest.mark.parametrize(("path", "body", "reason"), [
    ("/v1/apps/pets/predict", EXAMPLE.tobytes()[:-4],
     "a binary input of 20 bytes is not one example: 24 bytes, little-endian, C order"),
    ("/v1/apps/pets/predict", np.full((2, 3), np.nan, "<f4").tobytes(), "values that are not finite numbers"),
    ("/v1/apps/pets/predict?slo_ms=fast", EXAMPLE.tobytes(), "slo_ms: 'fast' is not a number"),
    ("/v1/apps/pets/predict?slo_ms=nan", EXAMPLE.tobytes(), "slo_ms: 'nan' is not a number"),
    ("/v1/apps/pets/predict?slo_ms=0", EXAMPLE.tobytes(), "slo_ms"),
    ("/v1/apps/pets/predict?context=" + "x" * 300, EXAMPLE.tobytes(), "context"),
])
def test_a_binary_body_that_is_not_one_example_is_refused_with_the_reason(path: str, body: bytes, reason: str) -> None:
    bus = FakeBus(answer)
    with TestClient(make_app(bus)) as c:
        r = c.post(path, content=body, headers=OCTETS)
        assert r.status_code == 422 and reason in r.json()["detail"], r.text
        assert c.post("/v1/apps/pets/predict", content=EXAMPLE.tobytes(), headers=OCTETS).status_code == 200
    assert len(bus.queries) == 1  # only the good one went on


def test_the_openapi_schema_lists_the_binary_body() -> None:
    with TestClient(make_app(FakeBus(answer))) as c:
        body = c.get("/openapi.json").json()["paths"]["/v1/apps/{app}/predict"]["post"]["requestBody"]
        params = c.get("/openapi.json").json()["paths"]["/v1/apps/{app}/predict"]["post"]["parameters"]
    assert set(body["content"]) == {"application/json", "application/octet-stream"}
    assert {p["name"] for p in params if p["in"] == "query"} == {"context", "slo_ms"}
