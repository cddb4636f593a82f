"""bench.fronts' gRPC load generator against the gateway's real gRPC server (a fake bus stands
for Kafka), and its report's row."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from bench.figures_cost import fronts
from bench.fronts import summary
from bench.load_grpc import STREAM, UNARY, request_bodies, run_grpc
from bench.load_http import _read_answer
from bench.load import Outcome
from frontend.v2_grpc import start_grpc
from tests.unit.test_gateway_http import FakeBus, make_app
from tests.unit.test_gateway_v2 import by_first_value

pytest.importorskip("grpc")


@pytest.mark.parametrize("mode", [UNARY, STREAM])
def test_every_query_is_sent_on_time_and_its_answer_matched(mode: str) -> None:
    bus = FakeBus(by_first_value, after_ms=5.0)
    rows = np.zeros((12, 2, 3), np.float32)
    rows[:, 0, 0] = np.arange(12)  # odd rows are dogs
    with TestClient(make_app(bus, grpc_port=0)) as c:
        state = c.app.state.gateway
        server, port = c.portal.call(start_grpc, state, state.gw, False, 1.0)
        try:
            run = run_grpc(f"127.0.0.1:{port}", request_bodies("pets", rows, 500.0), np.arange(12) * 0.01, mode=mode)
        finally:
            c.portal.call(server.stop, 0)
    assert [r.outcome for r in run.results] == ["answered"] * 12
    assert all(r.sent_us and r.recv_us > r.sent_us for r in run.results)
    sent = sorted(float(e.input.array().ravel()[0]) for e, _ in bus.queries)
    assert sent == list(range(12)) and {e.deadline_us - e.created_us for e, _ in bus.queries} == {500_000}


def test_a_v2_answer_is_a_default_where_its_default_output_says_so() -> None:
    body = b'{"outputs": [{"name": "output", "data": [-1]}, {"name": "default", "data": [true]}]}'
    r = Outcome(0, 0)
    _read_answer(r, 200, body)
    assert r.outcome == "default"
    _read_answer(r, 200, body.replace(b"true", b"false"))
    assert r.outcome == "answered"


def _step(cpu: float, gateway: float, p50: float) -> dict:
    return {"cpu_us_per_query_total": cpu, "cpu_us_per_query": {"gateway": gateway, "kafka": cpu - gateway},
            "generator_cpu_us_per_query": 50.0, "latency_ms": {"p50": p50}, "effective_ms": {"p99": 2 * p50},
            "error": 0, "lost": 0, "default": 1, "ok": True}


def test_a_fronts_two_steps_are_averaged_and_the_row_names_each_front() -> None:
    s = summary([_step(3000.0, 800.0, 10.0), _step(3200.0, 1000.0, 12.0)])
    assert s["cpu_us_per_query"] == 3100.0 and s["gateway_cpu_us_per_query"] == 900.0 and s["p50_ms"] == 11.0
    assert s["defaults"] == 2 and s["ok"]
    report = {"rates": {"300": {"fronts": {"v1": s, "grpc-stream": summary([_step(2800.0, 700.0, 9.0)]),
                                           "feedback": summary([_step(1900.0, 600.0, 2.0)])}}}}
    text, met = fronts(report)
    assert text == ("at 300 q/s: /v1 JSON 3,100 µs (gateway 900), p50 11.0 ms; "
                    "gRPC stream 2,800 µs (gateway 700), p50 9.0 ms; a feedback 1,900 µs (gateway 600)")
