"""bench.cost's pure parts: the simulated accelerator, the MLServer request body, the summary."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from bench.accel_model import CLOCKWORK_MS, Model, latency_ms
from bench import cost
from bench.cost import highest_ok, search, summarize, v2_bodies
from bench.figures_cost import cost_cpu, cost_light, cost_max_rate, cost_vs_mlserver, ensemble
from bench.figures_format import NO, YES


def test_latency_is_the_table_at_its_points_and_linear_between_and_beyond() -> None:
    for b, ms in CLOCKWORK_MS.items():
        assert latency_ms(b) == pytest.approx(ms)
    assert latency_ms(12) == pytest.approx((9.13 + 15.67) / 2)
    slope = (15.67 - 9.13) / 8
    assert latency_ms(27) == pytest.approx(15.67 + 11 * slope)
    # half of a 50 ms SLO holds 27 items: about 1,085 q/s, the device ceiling
    assert 1050 < 27 / latency_ms(27) * 1000 < 1120


def test_the_model_sleeps_for_its_batch_and_answers_one_row_of_scores_per_input() -> None:
    model = Model()
    x = np.arange(4 * 64, dtype=np.float32).reshape(4, 64) % 17
    t0 = time.perf_counter()
    y = model.predict_batch(x)
    assert time.perf_counter() - t0 >= latency_ms(4) / 1000
    assert y.shape == (4, 10) and y.dtype == np.float32
    assert np.allclose(y.sum(axis=1), 1.0, atol=1e-5)
    assert np.allclose(model.predict_batch(x[:1]), y[:1], atol=1e-6)  # the same answer alone or in a batch


def test_v2_bodies_carry_one_input_row_each() -> None:
    x = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32)
    bodies = [json.loads(b) for b in v2_bodies(x)]
    assert [b["inputs"][0]["data"] for b in bodies] == [[1, 2, 3], [4, 5, 6]]
    assert bodies[0]["inputs"][0]["shape"] == [1, 3] and bodies[0]["inputs"][0]["datatype"] == "FP32"


def _system(total_300: float, max_rate: float) -> dict:
    cpu = {r: {"cpu_us_per_query_total": total_300 * k, "cpu_us_per_query": {"kafka": total_300 * k / 2,
                                                                              "gateway": total_300 * k / 2}}
           for r, k in (("100", 1.5), ("300", 1.0))}
    return {"cpu": cpu, "max_rate_qps": max_rate, "light_p50_ms": 8.0, "search": [],
            "cache_hit": {"latency_ms": {"p50": 3.0}}}


def test_the_summary_and_the_figures_rows_judge_each_target() -> None:
    report = {"systems": {"clipstream": _system(900, 800), "mlserver": _system(1200, 400)}}
    report["summary"] = summarize(report["systems"])
    assert report["summary"]["vs_mlserver"] == 2.0
    assert cost_cpu("300", 1000)(report)[1] == "yes"
    assert cost_cpu("100", 1500)(report)[1] == "yes"
    assert cost_max_rate(report)[1] == "yes"
    assert cost_vs_mlserver(report)[1] == "yes"
    assert cost_light(report)[1] == "yes"
    slow = {"systems": {"clipstream": _system(3000, 300), "mlserver": _system(1200, 300)}}
    slow["summary"] = summarize(slow["systems"])
    assert cost_cpu("300", 1000)(slow)[1] != "yes"
    assert cost_vs_mlserver(slow)[1] != "yes" and slow["summary"]["vs_mlserver"] == 1.0
    assert "kafka" in cost_cpu("300", 1000)(slow)[0] and "idle" not in cost_cpu("300", 1000)(slow)[0]
    slow["systems"]["clipstream"]["idle"] = {"seconds": 10.0, "cores": {"kafka": 0.025, "selector": 0.02},
                                             "total_cores": 0.045}
    assert "idle, the pipeline takes 0.045 cores (kafka 0.025) = 450 µs per query at 100 q/s" in \
        cost_cpu("100", 1500)(slow)[0]


def test_ray_serve_is_reported_beside_mlserver_without_changing_the_target() -> None:
    report = {"systems": {"clipstream": _system(900, 300), "mlserver": _system(1200, 300),
                          "rayserve": _system(2000, 100)}}
    report["summary"] = summarize(report["systems"])
    assert report["summary"]["vs_rayserve"] == 3.0 and report["summary"]["rayserve_max_rate_qps"] == 100
    text, ok = cost_vs_mlserver(report)
    assert "Ray Serve 100 q/s, 3.00x" in text and ok != "yes"  # judged against MLServer alone
    alone = {"systems": {"clipstream": _system(900, 300), "mlserver": _system(1200, 300)}}
    alone["summary"] = summarize(alone["systems"])
    assert "Ray Serve" not in cost_vs_mlserver(alone)[0]
    none = {"systems": {"clipstream": _system(900, 300), "mlserver": _system(1200, 300),
                        "rayserve": {**_system(2000, 0), "search": [{"rate": 300.0}, {"rate": 100.0}]}}}
    none["summary"] = summarize(none["systems"])
    assert "Ray Serve: no step within the SLO, down to 100 q/s" in cost_vs_mlserver(none)[0]


def test_the_kafka_requests_per_query_join_the_cpu_row() -> None:
    system = _system(900, 300)
    system["cpu"]["300"]["kafka_requests_per_query"] = {"selector": 4.0, "gateway": 2.0, "batcher": 2.5}
    report = {"systems": {"clipstream": system}}
    assert "8.5 Kafka requests per query" in cost_cpu("300", 1000)(report)[0]
    assert "Kafka requests" not in cost_cpu("100", 1500)(report)[0]


def test_the_300_row_says_what_a_record_costs_on_the_machine_warm_and_after_a_sleep() -> None:
    report = {"systems": {"clipstream": _system(900, 300)},
              "machine": {"cold_start_us": {"warm": 17.5, "after_sleep": 162.9, "sleep_ms": 5.0}}}
    text = cost_cpu("300", 1000, machine=True)(report)[0]
    assert "encode + decode costs 18 µs back to back, 163 µs after a 5 ms sleep" in text
    assert "after a" not in cost_cpu("100", 1500)(report)[0]
    del report["machine"]
    assert "after a" not in cost_cpu("300", 1000, machine=True)(report)[0]  # an older report


def test_the_rate_row_says_what_the_next_step_up_missed_by() -> None:
    system = _system(900, 200)
    system["search"] = [
        {"rate": 300.0, "ok": False, "latency_ms": {"p99": 46.3}, "refused": 17, "default": 0, "lost": 0},
        {"rate": 400.0, "ok": False, "latency_ms": {"p99": 40.3}, "refused": 12, "default": 2, "lost": 0},
        {"rate": 200.0, "ok": True, "latency_ms": {"p99": 29.6}, "refused": 0, "default": 1, "lost": 0},
    ]
    report = {"systems": {"clipstream": system}}
    report["summary"] = summarize(report["systems"])
    text, ok = cost_max_rate(report)
    assert text == "200 q/s; 300 q/s missed: p99 of answers 46.3 ms, 17 refused" and ok == NO
    system["search"][0]["refusal_reasons"] = {
        "gateway at its limit of N requests in flight (learnt from how fast the pipeline answers)": 15,
        "gateway overloaded (event loop N ms late)": 2}
    assert cost_max_rate(report)[0] == ("200 q/s; 300 q/s missed: p99 of answers 46.3 ms, 17 refused by the event "
                                        "loop late and the learnt admission limit")
    system["search"][0].update(refused=0, default=3, latency_ms={"p99": 61.0})
    assert cost_max_rate(report)[0] == "200 q/s; 300 q/s missed: p99 of answers 61.0 ms, 3 defaults"
    system["search"] = system["search"][2:]  # nothing above it was tried
    assert cost_max_rate(report)[0] == "200 q/s"


def test_no_mlserver_rate_gives_no_ratio() -> None:
    s = summarize({"clipstream": _system(900, 800), "mlserver": _system(1200, 0)})
    assert s["vs_mlserver"] is None


def test_the_ensemble_row_judges_the_rate_against_three_times_the_baseline() -> None:
    def report(rate: float) -> dict:
        step = {"rate": rate, "cpu_us_per_query_total": 5000.0}
        return {"settings": {"baseline_qps": 130.0, "target_x": 3.0, "slo_ms": 150.0}, "max_rate_qps": rate,
                "search": [step], "closed_loop": {"callers": 4, "qps": 120.0, "p99_ms": 80.0}}

    measured, ok = ensemble(report(400.0))
    assert ok == YES and "400 q/s" in measured and "3.08x" in measured and "5,000 µs" in measured
    assert ensemble(report(300.0))[1] == NO


def test_the_search_steps_up_until_two_misses_and_down_only_when_nothing_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_step(t, rate, seconds, seed, warmup_s=1.0, slo_ms=50.0, app="a"):  # type: ignore[no-untyped-def]
        return {"rate": rate, "ok": rate <= limit}

    monkeypatch.setattr(cost, "step", fake_step)
    limit = 400.0
    steps = search(None, (300.0, 400.0, 500.0, 600.0, 700.0), (200.0, 100.0), False, 0)  # type: ignore[arg-type]
    assert [s["rate"] for s in steps] == [300.0, 400.0, 500.0, 600.0] and highest_ok(steps) == 400.0
    limit = 150.0
    steps = search(None, (300.0, 400.0, 500.0), (200.0, 100.0, 50.0), True, 0)  # type: ignore[arg-type]
    assert [s["rate"] for s in steps] == [300.0, 200.0, 100.0] and highest_ok(steps) == 100.0
    limit = 0.0
    assert highest_ok(search(None, (300.0,), (200.0,), True, 0)) == 0.0  # type: ignore[arg-type]


def test_only_takes_a_comma_separated_list_of_known_systems() -> None:
    import argparse

    from bench.cost import systems_arg

    assert systems_arg("clipstream, mlserver") == ("clipstream", "mlserver")
    assert systems_arg("rayserve") == ("rayserve",)
    with pytest.raises(argparse.ArgumentTypeError, match="unknown system tensorflow"):
        systems_arg("clipstream,tensorflow")
    with pytest.raises(argparse.ArgumentTypeError):
        systems_arg(",")


def test_the_gateways_admission_cuts_are_read_by_cause_from_its_metrics_page() -> None:
    from bench.admission import cuts_in
    from frontend.metrics import GatewayMetrics

    m = GatewayMetrics(lambda: 0)
    assert cuts_in(m.render()) == {}
    m.cuts.inc("loop")
    m.cuts.inc("slow")
    m.cuts.inc("loop")
    assert cuts_in(m.render()) == {"loop": 2.0, "slow": 1.0}
