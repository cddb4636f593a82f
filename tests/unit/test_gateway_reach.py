"""The gateway's word on Kafka: a few checks in a row that find no broker turn queries away with
503 and say why; one that finds one lets them in again."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from frontend import reach
from frontend.reach import KafkaReach
from tests.unit.test_gateway_http import GOOD, FakeBus, answer, make_app


def test_one_missed_check_is_doubt_two_are_lost_and_one_answer_clears_both() -> None:
    r = KafkaReach("b:9092")
    assert r.observe(False, 10.0) is None and r.doubt and r.lost is None  # a slow answer, maybe
    said = r.observe(False, 11.0)
    assert said is not None and said == r.lost
    assert said.startswith("the gateway cannot reach Kafka at b:9092 (no broker answered for 2 s)")
    assert r.observe(False, 12.0) is None  # said once
    assert r.observe(True, 13.0) == "Kafka at b:9092 answers again: queries are let in"
    assert r.lost is None and not r.doubt


class LostBus(FakeBus):
    """A bus whose metadata checks fail until ``back`` is set."""

    back = False

    def kafka_ok(self, timeout_s: float = 2.0) -> bool:
        return self.back


def _until(what, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while not (got := what()):
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.02)
    return got


def test_queries_are_refused_with_why_while_no_broker_answers_and_let_in_once_one_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reach, "CHECK_EVERY_S", 0.05)
    bus = LostBus(answer)
    with TestClient(make_app(bus)) as client:
        refused = _until(lambda: (r := client.post("/v1/apps/pets/predict", json={"input": GOOD})).status_code == 503
                         and r)
        assert "cannot reach Kafka" in refused.json()["detail"] and refused.headers["Retry-After"]
        assert client.get("/v2/health/ready").status_code == 503
        assert client.get("/readyz").status_code == 503
        sent = len(bus.queries)
        assert client.post("/v1/apps/pets/predict", json={"input": GOOD}).status_code == 503
        assert len(bus.queries) == sent  # a refused query is not published
        bus.back = True
        _until(lambda: client.post("/v1/apps/pets/predict", json={"input": GOOD}).status_code == 200)
        assert client.get("/v2/health/ready").status_code == 200
