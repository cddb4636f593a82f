"""Fuzzing the gateway's HTTP surface from its own OpenAPI document (schemathesis): whatever a
generated request holds, the answer is a 2xx or a 4xx with a reason, never a 5xx or a crash,
and a valid request is still answered afterwards.

The gateway here is the real application (routes, guard middleware, body limits, validation)
with the registry and the Kafka bus of ``test_gateway_http`` injected, so the run takes seconds
and the only server errors it can find are the gateway's own.
"""

from __future__ import annotations

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, settings

from tests.unit.test_gateway_http import GOOD, make_app

APP = make_app()
SCHEMA = schemathesis.openapi.from_asgi("/openapi.json", APP)
EXAMPLES_EACH = 300  # per operation: predict, feedback, healthz, readyz, metrics, ...
MIN_REQUESTS = 1000  # the floor for one run
SENT: list[int] = []


@pytest.fixture(scope="module", autouse=True)
def started_app():
    with TestClient(APP):  # runs the lifespan: the injected registry and bus are attached
        yield


@SCHEMA.parametrize()
@settings(max_examples=EXAMPLES_EACH, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=list(HealthCheck))
def test_no_generated_request_gets_a_server_error(case: schemathesis.Case) -> None:
    if case.path_parameters and len(SENT) % 2:  # half of them to apps that exist: past the 404
        case.path_parameters["app"] = ("pets", "big")[len(SENT) // 2 % 2]
    response = case.call()
    SENT.append(response.status_code)

    assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.status_code} {response.text}"
    if response.status_code >= 400 and response.status_code != 405:
        reason = "error" if case.path.startswith("/v2") else "detail"  # the Open Inference Protocol's error body
        assert reason in response.json(), f"a {response.status_code} without a reason: {response.text}"


def test_the_run_was_large_enough_and_a_valid_request_still_answers() -> None:
    assert len(SENT) >= MIN_REQUESTS, f"only {len(SENT)} generated requests were sent"
    with TestClient(APP) as client:
        r = client.post("/v1/apps/pets/predict", json={"input": GOOD})
        assert r.status_code == 200 and r.json()["output"] == "dog", r.text
