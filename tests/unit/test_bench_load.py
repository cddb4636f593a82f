"""The load generator's pure parts: the arrival process (seeded) and the statistics."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.load import (Outcome, arrival_gaps, arrival_times, gap_stats, json_bodies, percentiles, summarize,
                        unique_inputs)


@pytest.mark.parametrize("rate,cv", [(100.0, 1.0), (500.0, 0.5), (50.0, 2.0), (1000.0, 4.0)])
def test_gamma_gaps_have_the_asked_rate_and_cv(rate: float, cv: float) -> None:
    gaps = arrival_gaps(rate, cv, 200_000, seed=3)
    got_rate, got_cv = gap_stats(gaps)
    assert got_rate == pytest.approx(rate, rel=0.03)
    assert got_cv == pytest.approx(cv, rel=0.05)
    assert (gaps > 0).all()


def test_cv_one_is_poisson_and_cv_zero_is_constant() -> None:
    gaps = arrival_gaps(200.0, 1.0, 100_000, seed=1)
    # exponential: P(gap > mean) = 1/e
    assert np.mean(gaps > 1 / 200.0) == pytest.approx(math.exp(-1), abs=0.01)
    assert np.allclose(arrival_gaps(200.0, 0.0, 10), 0.005)


def test_arrivals_are_seeded_and_stay_in_the_window() -> None:
    a, b = arrival_times(300.0, 1.0, 5.0, seed=7), arrival_times(300.0, 1.0, 5.0, seed=7)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, arrival_times(300.0, 1.0, 5.0, seed=8))
    assert a[-1] < 5.0 and np.all(np.diff(a) > 0)
    assert len(a) == pytest.approx(1500, rel=0.1)


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError):
        arrival_gaps(0.0, 1.0, 10)
    with pytest.raises(ValueError):
        arrival_gaps(10.0, -1.0, 10)


def test_percentiles_are_values_that_occurred() -> None:
    vals = list(range(1, 1001))  # 1..1000 ms; "higher": rank ceil(q * (n - 1))
    p = percentiles(vals)
    assert p == {"p50": 501.0, "p90": 901.0, "p99": 991.0, "p99.9": 1000.0}
    assert percentiles([1.0, math.nan, 3.0])["p50"] == 3.0  # NaN (no answer) is dropped
    assert math.isnan(percentiles([])["p99"])
    assert percentiles([1.0, math.inf])["p99"] == math.inf


def _o(i: int, latency_ms: float | None, outcome: str = "answered", t0: int = 0) -> Outcome:
    sched = t0 + i * 10_000  # every 10 ms
    return Outcome(i, sched, sent_us=sched, recv_us=sched + int(latency_ms * 1000) if latency_ms is not None else 0,
                   outcome=outcome)


def test_summary_counts_misses_and_goodput() -> None:
    # 100 queries over 1 s: 90 fast answers, 5 late answers, 3 defaults, 1 error, 1 lost
    res = [_o(i, 10.0) for i in range(90)]
    res += [_o(90 + i, 80.0) for i in range(5)]
    res += [_o(95 + i, 50.5, "default") for i in range(3)]
    res += [_o(98, 1.0, "error"), _o(99, None, "lost")]
    s = summarize(res, slo_ms=50.0, duration_s=1.0)
    assert s["sent"] == 100 and s["answered"] == 95 and s["default"] == 3 and s["error"] == 1 and s["lost"] == 1
    assert s["slo_miss"] == pytest.approx(0.10)
    assert s["goodput_qps"] == pytest.approx(90.0)
    assert s["throughput_qps"] == pytest.approx(98.0)
    assert s["latency_ms"]["p50"] == 10.0
    assert s["effective_ms"]["p50"] == 10.0 and s["effective_ms"]["p99"] == math.inf
    assert s["send_lag_ms"]["p99"] == 0.0
    assert s["latency_from_send_ms"]["p50"] == 10.0  # sent on time: the same as from the schedule


def test_summary_times_answers_from_the_send_too() -> None:
    # the generator sent every query 30 ms late: latency counts that, latency from the send does not
    res = [Outcome(i, i * 10_000, sent_us=i * 10_000 + 30_000, recv_us=i * 10_000 + 40_000, outcome="answered")
           for i in range(100)]
    s = summarize(res, slo_ms=50.0, duration_s=1.0)
    assert s["latency_ms"]["p99"] == 40.0 and s["latency_from_send_ms"]["p99"] == 10.0
    assert s["send_lag_ms"]["p50"] == 30.0


def test_summary_leaves_out_the_warmup() -> None:
    res = [_o(i, 500.0) for i in range(50)] + [_o(50 + i, 5.0) for i in range(50)]
    s = summarize(res, slo_ms=20.0, duration_s=1.0, warmup_s=0.5, start_us=0)
    assert s["sent"] == 50 and s["slo_miss"] == 0.0
    assert s["effective_ms"]["p99"] == 5.0
    assert s["offered_qps"] == pytest.approx(100.0)


def test_unique_inputs_and_bodies() -> None:
    x = unique_inputs(1000, (64,), seed=1)
    assert x.dtype == np.float32 and x.shape == (1000, 64)
    assert len({row.tobytes() for row in x}) == 1000
    body = json_bodies(x[:1], slo_ms=20)[0]
    assert body.startswith(b'{"input": [') and body.endswith(b', "slo_ms": 20}')
