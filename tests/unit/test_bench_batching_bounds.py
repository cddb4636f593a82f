"""The ideal batcher's simulation (``bench.batching.bounds``): pure, no broker, simulated time."""

from __future__ import annotations

import pytest

from bench.batching.bounds import delay_gain, end_to_end_bound, poisson_arrivals, serve
from bench.batching.helpers import CLOCKWORK, device_max, latency_fn


def linear(fixed: float, per_item: float):  # type: ignore[no-untyped-def]
    return lambda b: fixed + per_item * b


def test_light_evenly_spaced_load_is_served_one_by_one_in_time() -> None:
    arr = [10.0 * k for k in range(100)]  # one every 10 ms, each served in 2 ms
    for policy in ("greedy", "efficient"):
        r = serve(arr, linear(1.0, 1.0), 20.0, cap=8, policy=policy)
        assert r["answered"] == 100 and r["mean_batch"] == 1.0


def test_a_burst_is_cut_into_batches_that_fit_the_deadline_and_the_rest_is_dropped() -> None:
    # 40 requests at t=0, 5 ms per batch + 1 ms per item, 20 ms deadline, cap 10:
    # batch of 10 ends at 15 ms; next batch must end by 20 ms: 5 + b <= 5 -> none fits
    r = serve([0.0] * 40, linear(5.0, 1.0), 20.0, cap=10)
    assert r["answered"] == 10
    # with a 50 ms deadline: 15 + 15 + 15 = 45 ms, a fourth batch cannot end by 50
    assert serve([0.0] * 40, linear(5.0, 1.0), 50.0, cap=10)["answered"] == 30


def test_the_efficient_policy_gives_up_the_oldest_to_keep_batches_large() -> None:
    # 10 at t=0 fill the device until 12 ms (2 ms + 1 ms per item, cap 10); one more came at
    # 0.1 ms (due at 20.1) and 8 at 11 ms. At 12 ms greedy must end the old one's batch by
    # 20.1: 6 items (old + 5), then the last 3; efficient gives the old one up and runs 8 at once
    arr = [0.0] * 10 + [0.1] + [11.0] * 8
    lat = linear(2.0, 1.0)
    greedy = serve(arr, lat, 20.0, cap=10, policy="greedy")
    efficient = serve(arr, lat, 20.0, cap=10, policy="efficient")
    assert greedy["answered"] == 19 and greedy["mean_batch"] == pytest.approx(19 / 3)
    assert efficient["answered"] == 18 and efficient["mean_batch"] == 9.0


def test_delay_waits_for_the_batch_to_fill_or_the_oldest_to_have_waited() -> None:
    arr = [0.0, 1.0, 2.0, 30.0]
    r = serve(arr, linear(5.0, 0.0), 20.0, cap=3, delay_ms=10.0)
    assert r["mean_batch"] == 2.0  # [0, 1, 2] leaves at 2 ms (cap reached), [30] alone after 10 ms
    no_delay = serve(arr, linear(5.0, 0.0), 20.0, cap=3)
    assert no_delay["mean_batch"] == pytest.approx(4 / 3)  # [0] alone, then [1, 2], then [30]


def test_bursty_arrivals_keep_the_mean_rate_and_fall_only_in_the_on_phase() -> None:
    arr = poisson_arrivals(500.0, 10.0, seed=3, period_s=0.1, duty=0.5)
    assert len(arr) == pytest.approx(5000, rel=0.05)
    assert all((t % 100.0) < 50.0 for t in arr)
    assert arr == sorted(arr)


def test_the_end_to_end_bound_of_the_clockwork_device_stays_below_its_best_throughput() -> None:
    lat = latency_fn(CLOCKWORK)
    dev = device_max(lat, 20.0)
    bound = end_to_end_bound(lat, dev["qps"], 20.0, int(dev["batch_size"]), loads=(0.75, 2.0), duration_s=5.0)
    # below the device's rate offered, goodput cannot exceed what is offered
    assert bound["by_load"]["0.75x"]["efficient"] < 0.76
    # under overload, giving up the oldest keeps batches large; serving them first does not
    assert bound["by_load"]["2x"]["efficient"] > bound["by_load"]["2x"]["greedy"] + 0.2
    assert bound["best"]["efficient"] < 1.0


def test_a_delay_gains_nothing_when_the_next_batch_is_formed_as_the_device_frees() -> None:
    g = delay_gain(linear(5.0, 0.05), 20.0, 300, 600.0, [2.0, 5.0], period_s=0.1, duty=0.5, duration_s=5.0)
    assert g["ratios"]["2 ms"] == pytest.approx(1.0, abs=0.02)
    assert g["runs"]["5 ms"]["mean_batch"] > g["runs"]["0 ms"]["mean_batch"]  # it does gather more


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="policy"):
        serve([0.0], linear(1.0, 0.0), 20.0, cap=1, policy="magic")
    with pytest.raises(ValueError, match="cap"):
        serve([0.0], linear(1.0, 0.0), 20.0, cap=0)
