"""The real-broker batching benchmark's pure helpers (no broker, no timing assertions)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.batching.helpers import (
    CLOCKWORK,
    Obs,
    arrivals_due,
    batches_between,
    best_of,
    categorise_stacks,
    device_max,
    within_deadline_objective_ms,
    goodput_series,
    hop_medians,
    latency_fn,
    parse_stats_line,
    percentile,
    recovery,
    summarise,
    sweep_sizes,
)


def test_the_within_deadline_objective_is_the_latency_objective_unless_given() -> None:
    assert within_deadline_objective_ms() == 20.0
    assert within_deadline_objective_ms(8.0) == 8.0
    assert within_deadline_objective_ms(0.0) == 20.0  # not a usable objective


def test_device_max_of_clockwork_at_20ms_is_the_largest_batch_that_fits() -> None:
    # beyond 16 the profile extrapolates the last slope: (15.67 - 9.13) / 8 = 0.8175 ms per item
    lat = latency_fn(CLOCKWORK)
    dev = device_max(lat, 20.0)
    assert dev["batch_size"] == 21
    assert dev["latency_ms"] == pytest.approx(15.67 + 5 * 0.8175)
    assert dev["qps"] == pytest.approx(21 / (15.67 + 5 * 0.8175) * 1000)
    assert lat(22) > 20.0


def test_device_max_with_a_slowdown_and_a_linear_profile() -> None:
    slow = device_max(latency_fn(CLOCKWORK), 20.0, slowdown=2.0)
    assert slow["batch_size"] == 9  # 2 * (9.13 + 0.8175) = 19.9 ms; b = 10 would take 21.5 ms
    svm = device_max(latency_fn(fixed_ms=5.0, per_item_ms=0.05), 20.0)
    assert svm["batch_size"] == 300 and svm["qps"] == pytest.approx(15000)


def test_device_max_when_nothing_fits() -> None:
    assert device_max(lambda b: 50.0, 20.0)["batch_size"] == 0


def test_arrivals_constant_and_bursty_keep_the_mean_rate() -> None:
    assert arrivals_due(0, 1000) == 0
    assert arrivals_due(1.0, 1000) == 1000
    # on/off: 100 ms period, 50% duty -> 2000 qps during the first 50 ms, none in the next 50
    assert arrivals_due(0.05, 1000, 0.1, 0.5) == 100
    assert arrivals_due(0.09, 1000, 0.1, 0.5) == 100
    assert arrivals_due(1.0, 1000, 0.1, 0.5) == 1000
    assert arrivals_due(0.125, 1000, 0.1, 0.5) == 150


def test_percentile() -> None:
    assert percentile([], 50) is None
    assert percentile([3, 1, 2], 50) == 2
    # bench.stats' one definition: a value that occurred (rank ceil(q * (n - 1))), not interpolated
    assert percentile([0, 10], 90) == 10
    assert percentile([0, 10], 50) == 10


def _obs(status: str, produced: int, out: int, **kw: int) -> Obs:
    return Obs(status, produced, out, out + 1000, **kw)


def test_summarise_counts_only_in_time_ok_answers_in_the_window() -> None:
    obs = [
        _obs("ok", 0, 10_000),  # 10 ms: in time
        _obs("ok", 1_000_000, 1_015_000),  # in time
        _obs("ok", 1_000_000, 1_030_000),  # 30 ms: late
        _obs("expired", 1_000_000, 1_021_000),
        _obs("ok", 0, 2_000_000),  # outside the window
    ]
    batches = [(500_000, 2, 5_000), (1_500_000, 4, 7_000), (3_000_000, 9, 1)]
    s = summarise(obs, 0, 2_000_000, 20_000, batches)
    assert s["goodput_qps"] == 1.0  # 2 in 2 s
    assert s["ok_qps"] == 1.5
    assert s["expired_qps"] == 0.5
    assert s["in_time_fraction"] == pytest.approx(2 / 3)
    assert s["counts"] == {"ok": 3, "expired": 1}
    assert s["mean_batch"] == 3.0 and s["batches_per_s"] == 1.0
    assert s["device_busy"] == pytest.approx(0.006)
    assert s["latency_ms_p50"] == 15.0


def test_summarise_of_nothing() -> None:
    s = summarise([], 0, 1_000_000, 20_000)
    assert s["goodput_qps"] == 0 and s["latency_ms_p50"] is None and s["mean_batch"] == 0.0


def test_hop_medians_follow_the_trace() -> None:
    o = Obs("ok", produced_us=0, out_us=9_000, consume_us=10_000, batcher_in_us=2_000, batched_us=3_000,
            worker_in_us=4_000)
    hops = hop_medians([o, Obs("expired", 0, 5, 6)])
    assert hops == {"produced->batcher_in": 2.0, "batcher_in->batched": 1.0, "batched->worker_in": 1.0,
                    "worker_in->worker_out": 5.0, "worker_out->consumed": 1.0}


def test_goodput_series_and_recovery() -> None:
    obs = [_obs("ok", t, t + 5_000) for t in range(0, 1_000_000, 10_000)]  # 100 qps for 1 s
    obs += [_obs("ok", t, t + 50_000) for t in range(1_000_000, 2_000_000, 10_000)]  # late ones
    series = goodput_series(obs, 0, 2_000_000, 0.5, 20_000)
    assert series == [100.0, 100.0, 0.0, 0.0]  # the late answers (50 ms) never count
    assert recovery([0, 0, 10, 10, 10], 0.1, 9, 2) == pytest.approx(0.4)
    assert recovery([0, 0, 10], 0.1, 20, 1) is None
    assert batches_between([(1, 1, 1), (5, 1, 1), (9, 1, 1)], 2, 9) == 1


def test_parse_stats_line() -> None:
    line = 'stats: {"model": "m", "batches": 3, "replicas": [{"replica": 0, "max_batch_size": 7}]}'
    assert parse_stats_line(line)["replicas"][0]["max_batch_size"] == 7
    assert parse_stats_line("ready: batcher m") is None
    assert parse_stats_line("stats: {not json") is None


def test_categorise_stacks_uses_the_innermost_known_frame() -> None:
    raw = [
        "run (faust/worker.py:1);on_request (batchers/app.py:2);decode_as (schemas/codec.py:3) 7",
        "run (faust/worker.py:1);lookup_loop (batchers/app.py:2);mget (redis/asyncio/client.py:4) 3",
        "main (x.py:1) 2",
        "",
    ]
    assert categorise_stacks(raw) == {"avro encode/decode": 7, "redis client": 3, "other": 2}


def test_sweep_and_best_of() -> None:
    assert sweep_sizes("clockwork", False)[0] == 1 and 32 in sweep_sizes("svm", False)
    assert len(sweep_sizes("onnx", True)) < len(sweep_sizes("onnx", False))
    rows = {"no batching (1)": {"goodput_qps": 5.0}, "fixed 8": {"goodput_qps": 9.0}, "AIMD": {"goodput_qps": 99.0}}
    assert best_of(rows) == ("fixed 8", 9.0)
    assert best_of({k: v for k, v in rows.items() if k != "AIMD"}, "") == ("fixed 8", 9.0)
    assert best_of({}) == (None, 0.0)


def test_arrivals_ramp_up_then_hold_the_rate() -> None:
    assert arrivals_due(0.5, 1000, ramp_s=1.0) == 125  # 1000 * 0.5^2 / 2
    assert arrivals_due(1.0, 1000, ramp_s=1.0) == 500
    assert arrivals_due(2.0, 1000, ramp_s=1.0) == 1500  # then 1000 per second
    assert arrivals_due(2.0, 1000, ramp_s=0.0) == 2000


def test_top_leaves_and_idle_categories() -> None:
    from bench.batching.helpers import top_leaves

    raw = ["a (x.py:1);EpollSelector.select (selectors.py:468) 5", "a (x.py:1);b (y.py:2) 2", "a (x.py:1);b (y.py:2) 1"]
    assert top_leaves(raw, 1) == [("EpollSelector.select (selectors.py:468)", 5)]
    assert categorise_stacks(raw) == {"epoll wait (idle or waking)": 5, "other": 3}


def test_confirm_reruns_no_batching_best_fixed_and_aimd_in_interleaved_rounds() -> None:
    from types import SimpleNamespace

    from bench.batching.sections import CONFIRM_ROUNDS, _confirm

    class Runs:
        """Stands in for ``Bench.run``: records the order and returns the next scripted goodput."""

        aimd_objective_ms = 8.0

        def __init__(self) -> None:
            self.calls: list[int | None] = []
            self.objectives: set[object] = set()
            self.qps = {1: iter([20.0, 30.0, 10.0, 25.0, 5.0]), 32: iter([100.0, 80.0, 90.0, 95.0, 70.0]),
                        None: iter([85.0, 95.0, 70.0, 99.0, 60.0])}

        def run(self, m: object, label: str, fixed: int | None = None, **kw: object) -> SimpleNamespace:
            self.calls.append(fixed)
            if fixed is None:
                self.objectives.add(kw.get("aimd_objective_ms"))
            qps = next(self.qps[fixed])
            return SimpleNamespace(summary={"goodput_qps": qps, "ok_qps": qps + 1})

    b = Runs()
    rows = {"no batching (1)": {"goodput_qps": 5.0}, "fixed 16": {"goodput_qps": 90.0},
            "fixed 32": {"goodput_qps": 99.0}, "AIMD": {"goodput_qps": 60.0}}
    sizes = {"no batching (1)": 1, "fixed 16": 16, "fixed 32": 32}
    out = _confirm(b, object(), rows, sizes, 1.0, 1.0)  # type: ignore[arg-type]
    assert CONFIRM_ROUNDS == 5
    # the sweep's best fixed size (not AIMD's row), interleaved with no batching and AIMD
    assert b.calls == [1, 32, None] * 5
    assert b.objectives == {8.0}  # AIMD's objective for goodput within the deadline
    assert out["best_fixed"] == "fixed 32"
    g = out["goodput"]
    # medians of the rounds, not maxima
    assert (g["no_batching_qps"], g["best_fixed_qps"], g["aimd_qps"]) == (20.0, 90.0, 85.0)
    assert g["aimd_vs_best_fixed"] == pytest.approx(85.0 / 90.0)
    assert g["aimd_vs_no_batching"] == pytest.approx(85.0 / 20.0)
    assert out["ok throughput"]["aimd_qps"] == 86.0


def test_delayed_section_interleaves_rounds_and_reports_median_paired_ratios() -> None:
    from types import SimpleNamespace

    from bench.batching.sections import DELAYED_ROUNDS, section_delayed

    class Runs:
        """Stands in for ``Bench``: records each run's label and scripts its goodput by round."""

        quick = False
        args = SimpleNamespace(dispatch="just in time", deadline_ms=20.0)

        def __init__(self) -> None:
            self.labels: list[str] = []
            # goodput of (rate, delay) in rounds 1..3; the 300 q/s delay-2 ms ratios by round are 1.5, 0.5, 2.0
            self.qps = {(300.0, 0.0): [100.0, 200.0, 160.0], (300.0, 2.0): [150.0, 100.0, 320.0],
                        (300.0, 5.0): [100.0, 200.0, 160.0], (600.0, 0.0): [300.0] * 3,
                        (600.0, 2.0): [300.0] * 3, (600.0, 5.0): [450.0] * 3}

        def run(self, m: object, label: str, *, delay_ms: float, rate_qps: float, batcher_env: dict[str, str],
                **_: object) -> SimpleNamespace:
            self.labels.append(label)
            round_ = int(label.rsplit(" ", 1)[1]) - 1
            qps = self.qps[(rate_qps, delay_ms)][round_]
            return SimpleNamespace(summary={"goodput_qps": qps, "batches_per_s": 50.0, "device_busy": 0.5})

    b = Runs()
    report: dict[str, object] = {}
    section_delayed(b, {"svm": SimpleNamespace(label="svm")}, report)  # type: ignore[arg-type]
    assert DELAYED_ROUNDS == 3
    # every configuration once per round, rounds one after another
    assert len(b.labels) == 3 * 2 * 3
    assert [lab.rsplit(" ", 1)[1] for lab in b.labels] == ["1"] * 6 + ["2"] * 6 + ["3"] * 6
    de = report["delayed"]
    r = de["ratios"]["just in time, 300 qps, delay 2 vs 0 ms"]  # type: ignore[index]
    # the median of the paired per-round ratios, not the ratio of the medians (150 / 160)
    assert r["goodput_by_round"] == [1.5, 0.5, 2.0]
    assert r["goodput"] == 1.5
    assert r["goodput_qps"] == [160.0, 150.0]
    assert de["ratios"]["just in time, 600 qps, delay 5 vs 0 ms"]["goodput"] == 1.5  # type: ignore[index]
    # the run shown for each configuration is its median round
    assert de["runs"]["just in time, 300 qps, delay 0 ms"]["goodput_qps"] == 160.0  # type: ignore[index]
    assert de["goodput_qps_by_round"]["just in time, 300 qps, delay 2 ms"] == [150.0, 100.0, 320.0]  # type: ignore[index]


def test_adapt_section_picks_the_new_best_then_measures_it_apart_from_the_pick() -> None:
    from types import SimpleNamespace

    from bench.batching.adapt import CONFIRM_ROUNDS, SELECT_ROUNDS, section_adapt
    from bench.batching.runner import RunResult

    s = 1_000_000  # us
    slow_at, end = 5 * s, 10 * s

    def aimd_run(recover_at_s: float) -> RunResult:
        """100 q/s in time before the slowdown and after ``recover_at_s``, 10 q/s between;
        one batch of 2 per 20 ms throughout."""
        obs, t = [], 0
        while t < end:
            slow = slow_at <= t < slow_at + recover_at_s * s
            obs.append(Obs("ok", t, t + 5_000, t + 6_000))
            t += 100_000 if slow else 10_000
        batches = [(c, 2, 5_000) for c in range(0, end, 20_000)]
        return RunResult("aimd", {}, obs, batches, [(5.0, 8), (9.0, 4)], t0_us=slow_at, t1_us=end,
                         extra={"slowdown_at_us": slow_at})

    class Runs:
        """Stands in for ``Bench``: the fixed sizes' goodput by round (the selection's three, then
        fixed 8's five confirming ones); AIMD at 20 ms recovering in 1 / 3 / 2 / 1 / 4 s, AIMD
        at the 8 ms given in 1 s every round."""

        quick = False
        deadline_us = 20_000
        aimd_objective_ms = 8.0

        def __init__(self) -> None:
            self.labels: list[str] = []
            self.objectives: list[object] = []
            self.fixed = {2: iter([10.0] * 3), 3: iter([10.0] * 3), 4: iter([80.0, 200.0, 90.0]),
                          8: iter([100.0, 60.0, 95.0] + [100.0, 60.0, 100.0, 100.0, 120.0]), 12: iter([50.0] * 3)}
            self.recover = iter([1.0, 1.0, 3.0, 1.0, 2.0, 1.0, 1.0, 1.0, 4.0, 1.0])

        def run(self, m: object, label: str, fixed: int | None = None, **kw: object) -> object:
            self.labels.append(label)
            if fixed is not None:
                qps = next(self.fixed[fixed])
                return SimpleNamespace(summary={"goodput_qps": qps, "ok_qps": qps})
            self.objectives.append(kw["aimd_objective_ms"])
            return aimd_run(next(self.recover))

    b = Runs()
    report: dict[str, Any] = {}
    section_adapt(b, {"clockwork": SimpleNamespace(label="clockwork")}, report)  # type: ignore[arg-type]
    assert (SELECT_ROUNDS, CONFIRM_ROUNDS) == (3, 5)
    # the five sizes in each selection round; then per round the pick once (both readings
    # picked fixed 8) and AIMD once per objective; every round after the one before
    rounds = [lab.rsplit(" ", 1)[1] for lab in b.labels]
    assert rounds == ["1"] * 5 + ["2"] * 5 + ["3"] * 5 + [str(i) for i in range(1, 6) for _ in range(3)]
    assert all(lab.startswith("fixed 8 @ 2x slower, confirming") for lab in b.labels[15::3])
    # the target's readings share AIMD's runs at the 20 ms objective; the one given has its own
    assert b.objectives == [20.0, 8.0] * 5
    ad = report["adapt"]
    # picked by each size's median over the selection (fixed 4: 90, not its lucky 200; fixed 8:
    # 95); its rate is its median over the confirming rounds (100), not the selection's 95
    g = ad["goodput"]
    assert (g["new_best_fixed"], g["new_best_fixed_qps"], g["new_best_fixed_qps_selection"]) == ("fixed 8", 100.0, 95.0)
    t = ad["goodput, objective as given"]
    assert g["aimd_objective_ms"] == 20.0 and ad["ok throughput"]["aimd_objective_ms"] == 20.0
    assert t["aimd_objective_ms"] == 8.0
    assert g["counts_for_target"] and ad["ok throughput"]["counts_for_target"] and not t["counts_for_target"]
    # 90% of 100 q/s is first held over 0.5 s once the run is back at 100 q/s
    assert [r["recovery_s"] for r in g["by_round"]] == pytest.approx([1.5, 3.5, 2.5, 1.5, 4.5])
    assert [r["recovery_batches"] for r in g["by_round"]] == [75, 175, 125, 75, 225]
    assert g["recovery_batches"] == 125 and g["recovery_s"] == pytest.approx(2.5)
    assert [r["recovery_batches"] for r in ad["ok throughput"]["by_round"]] == [75, 175, 125, 75, 225]
    assert [r["recovery_batches"] for r in t["by_round"]] == [75] * 5
    # settled: the last 2 s; the round that recovers at 9.5 s spent half of them slow
    assert [r["aimd_after_vs_new_best"] for r in g["by_round"]] == pytest.approx([1.0, 1.0, 1.0, 1.0, 0.55])
    assert g["aimd_after_vs_new_best"] == pytest.approx(1.0)
    # against the same round's run of the pick, too
    assert [r["aimd_after_vs_fixed_same_round"] for r in g["by_round"]] == pytest.approx(
        [1.0, 100 / 60, 1.0, 1.0, 55 / 120])
    # the figure shows the median round
    assert ad["trace_round"] == 3


def test_adapt_runs_aimd_once_per_round_when_the_objective_given_is_the_target() -> None:
    from types import SimpleNamespace

    from bench.batching.adapt import section_adapt
    from bench.batching.runner import RunResult

    s = 1_000_000

    class Runs:
        quick = True  # one selection round of fixed 4, one confirming round
        deadline_us = 20_000
        aimd_objective_ms = 20.0  # --aimd-objective-ms 20

        def __init__(self) -> None:
            self.objectives: list[object] = []

        def run(self, m: object, label: str, fixed: int | None = None, **kw: object) -> object:
            if fixed is not None:
                return SimpleNamespace(summary={"goodput_qps": 100.0, "ok_qps": 100.0})
            self.objectives.append(kw["aimd_objective_ms"])
            obs = [Obs("ok", t, t + 5_000, t + 6_000) for t in range(0, 6 * s, 10_000)]
            return RunResult("aimd", {}, obs, [(c, 2, 5_000) for c in range(0, 6 * s, 20_000)], [(3.0, 4)],
                             t0_us=3 * s, t1_us=6 * s, extra={"slowdown_at_us": 3 * s})

    b = Runs()
    report: dict[str, Any] = {}
    section_adapt(b, {"clockwork": SimpleNamespace(label="clockwork")}, report)  # type: ignore[arg-type]
    assert b.objectives == [20.0]
    assert "goodput, objective as given" not in report["adapt"]
    assert report["adapt"]["goodput"]["recovery_batches"] == report["adapt"]["ok throughput"]["recovery_batches"]
