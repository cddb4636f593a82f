"""The adapt section: AIMD when the model's speed halves mid-run (see ``bench.batching``).

The figure is a recovery time against a baseline measured apart, so both are noisy, and a
new best read high by chance delays the recovery by many batches. So the fixed sizes first run
in interleaved rounds, and each reading's new best is the size with the highest median; the
best of those medians is still biased up (the winner's curse), so that size is then run again
in rounds of its own, interleaved with the AIMD runs, and its rate is its median over those.
The figures are the medians over those rounds.

The target is read with the 20 ms latency objective on the service time, in goodput
(answered within the deadline) and in ok throughput; AIMD's runs at that objective serve both
readings (docs/design/0002). With ``--aimd-objective-ms`` a third reading, goodput with AIMD at
that objective, is reported beside them and does not count: a tightened objective caps the
batch below what the deadline allows.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.batching.helpers import (
    CLOCKWORK,
    OBJECTIVE_MS,
    batches_between,
    best_of,
    device_max,
    fmt_ratio,
    goodput_series,
    latency_fn,
    log,
    ratio,
    recovery,
    summarise,
)
from bench.batching.runner import Bench, Model, RunResult

SELECT_ROUNDS = 3  # interleaved rounds of the fixed sizes at 2x slower, to pick each reading's new best
CONFIRM_ROUNDS = 5  # then interleaved rounds of (the new best at 2x slower, AIMD slowing down mid-run)
BIN_S, HOLD = 0.1, 5  # recovery: the first 0.5 s window at >= 90% of the new best
# (reading, summary key, counted within the deadline, AIMD objective); only the target's count
READINGS = (("goodput", "goodput_qps", True, "target"),
            ("ok throughput", "ok_qps", False, "target"),
            ("goodput, objective as given", "goodput_qps", True, "given"))
METRICS = tuple((reading, key) for reading, key, *_ in READINGS)


def objectives(b: Bench) -> dict[str, float]:
    """AIMD's objective on the batch's service time for each reading: the target's readings
    use the 20 ms latency objective itself, as Clipper does; the third the one given with
    ``--aimd-objective-ms``, left out when it is the target's (not run twice)."""
    objs = {"target": OBJECTIVE_MS, "given": b.aimd_objective_ms}
    return {reading: objs[which] for reading, _, _, which in READINGS
            if which == "target" or objs["given"] != objs["target"]}


@dataclass(frozen=True)
class _Plan:
    """The section's sizes and timings, apart from the code that runs them, since --quick
    shortens every one of them."""

    half: float  # s before the slowdown in AIMD's runs, and after it
    sizes: list[int]
    n_select: int
    n_confirm: int
    fixed_s: float  # measurement window of a fixed size's run

    @classmethod
    def of(cls, b: Bench) -> _Plan:
        """The full section's settings, or --quick's one size and one round of each kind."""
        if b.quick:
            return cls(half=3.0, sizes=[4], n_select=1, n_confirm=1, fixed_s=2.0)
        return cls(half=5.0, sizes=[2, 3, 4, 8, 12], n_select=SELECT_ROUNDS, n_confirm=CONFIRM_ROUNDS, fixed_s=3.0)


def section_adapt(b: Bench, ms: dict[str, Model], report: dict[str, Any]) -> RunResult:
    """AIMD on the Clockwork profile when the model becomes 2x slower mid-run, against the new best
    fixed size; returns the AIMD run the figure's trace shows."""
    m = ms["clockwork"]
    plan = _Plan.of(b)
    obj = objectives(b)
    readings = [(reading, key, in_time, which == "target") for reading, key, in_time, which in READINGS
                if reading in obj]
    _log_plan(m, obj, plan)
    fixed_rounds = _select_rounds(b, m, plan)
    selected = {k: {key: statistics.median(s[key] for s in v) for _, key in METRICS}
                for k, v in fixed_rounds.items()}
    picks = {metric: best_of({k: {"goodput_qps": v[key]} for k, v in selected.items()})[0] or f"fixed {plan.sizes[0]}"
             for metric, key, *_ in readings}
    confirmed, runs = _confirm_rounds(b, m, plan, picks, obj)
    win = int(min(2.0, plan.half - 1.0) * 1e6)
    entry = _entry(plan, win, fixed_rounds, selected, confirmed)
    for metric, key, in_time, counts in readings:
        entry[metric] = _reading(b, runs[obj[metric]], win, key, in_time, counts, picks[metric],
                                 confirmed, selected, obj[metric])
        _log_reading(metric, entry[metric], plan.n_confirm)
    # the figure's trace: the round whose goodput recovery is the median
    rows = entry["goodput"]["by_round"]
    shown = _median_index([x["recovery_batches"] for x in rows])
    entry["trace_round"] = shown + 1
    r = runs[obj["goodput"]][shown]
    entry["aimd_before"], entry["aimd_after"] = rows[shown]["aimd_before"], rows[shown]["aimd_after"]
    entry["trace"] = _trace(r, plan.half, b.deadline_us)
    report["adapt"] = entry
    return r


def _log_plan(m: Model, obj: dict[str, float], plan: _Plan) -> None:
    """The section's heading line, so the log says which objectives and rounds the figures
    below it come from."""
    log(f"adapt: {m.label}, AIMD at {' and '.join(f'{v:g} ms' for v in dict.fromkeys(obj.values()))} on the "
        f"service time, the model becomes 2x slower at t = {plan.half:g} s; {plan.n_select} interleaved round(s) "
        f"of the fixed sizes to pick the new best, then {plan.n_confirm} of the new best and AIMD")


def _select_rounds(b: Bench, m: Model, plan: _Plan) -> dict[str, list[dict[str, Any]]]:
    """Every fixed size at 2x slower, in interleaved rounds, so that each reading's new best is
    picked by its median rather than by one lucky run."""
    fixed_rounds: dict[str, list[dict[str, Any]]] = {}
    for i in range(plan.n_select):
        for size in plan.sizes:
            r = b.run(m, f"fixed {size} @ 2x slower, round {i + 1}", fixed=size, slowdown=2.0, warmup_s=1.0,
                      measure_s=plan.fixed_s)
            fixed_rounds.setdefault(f"fixed {size}", []).append(r.summary)
    return fixed_rounds


def _confirm_rounds(b: Bench, m: Model, plan: _Plan, picks: dict[str, str], obj: dict[str, float]
                    ) -> tuple[dict[str, list[dict[str, Any]]], dict[float, list[RunResult]]]:
    """The picked sizes again, interleaved with AIMD slowing down mid-run at each objective, so
    that the new best's rate is not the selection's biased-up median and shares AIMD's rounds."""
    confirmed: dict[str, list[dict[str, Any]]] = {}
    runs: dict[float, list[RunResult]] = {o: [] for o in dict.fromkeys(obj.values())}
    for i in range(plan.n_confirm):
        for label in dict.fromkeys(picks.values()):
            r = b.run(m, f"{label} @ 2x slower, confirming, round {i + 1}", fixed=int(label.split()[1]),
                      slowdown=2.0, warmup_s=1.0, measure_s=plan.fixed_s)
            confirmed.setdefault(label, []).append(r.summary)
        for ms_, got in runs.items():
            got.append(b.run(m, f"AIMD {ms_:g} ms, slows down mid-run, round {i + 1}", warmup_s=plan.half,
                             measure_s=plan.half, slowdown_at_s=plan.half, aimd_objective_ms=ms_))
    return confirmed, runs


def _entry(plan: _Plan, win: int, fixed_rounds: dict[str, list[dict[str, Any]]],
           selected: dict[str, dict[str, float]], confirmed: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The report's part shared by all readings: the rounds' raw rates, the rules that turn them
    into figures, and the device's bounds before and after the slowdown."""
    return {
        "rounds": plan.n_confirm, "selection_rounds": plan.n_select, "windows_s": win / 1e6,
        "fixed_at_2x_slower": selected,
        "fixed_at_2x_slower_by_round": {k: [{key: s[key] for _, key in METRICS} for s in v]
                                        for k, v in fixed_rounds.items()},
        "confirmed_by_round": {k: [{key: s[key] for _, key in METRICS} for s in v] for k, v in confirmed.items()},
        "selection_rule": "each reading's new best is the fixed size with the highest median over the selection "
                          "rounds; its rate is then its median over the confirming rounds, run apart from the "
                          "selection (the best of five noisy medians is biased up), interleaved with AIMD",
        "recovery_rule": f"first {HOLD * BIN_S:g} s window after the slowdown whose rate >= 90% of the new best "
                         "fixed size's (its median over the confirming rounds); batches = BatchStats created from "
                         "the slowdown to the end of that window; the figure is the median over the confirming rounds",
        "device_max_before": device_max(latency_fn(CLOCKWORK), OBJECTIVE_MS),
        "device_max_after": device_max(latency_fn(CLOCKWORK), OBJECTIVE_MS, slowdown=2.0),
    }


def _reading(b: Bench, aimd_runs: list[RunResult], win: int, key: str, in_time: bool, counts: bool,
             new_label: str, confirmed: dict[str, list[dict[str, Any]]], selected: dict[str, dict[str, float]],
             objective_ms: float) -> dict[str, Any]:
    """One reading's figures: each AIMD round against the new best's median over the confirming
    rounds and against the same round's run of it, then the medians over the rounds."""
    by_round = [s[key] for s in confirmed[new_label]]
    new_best = statistics.median(by_round)
    rows = [_one_round(b, r, win, key, in_time, new_best) for r in aimd_runs]
    for row, same_round in zip(rows, by_round):
        row["aimd_after_vs_fixed_same_round"] = ratio(same_round, row["aimd_after_qps"])
    return {
        "aimd_objective_ms": objective_ms, "counts_for_target": counts, "new_best_fixed": new_label,
        "new_best_fixed_qps": new_best,
        "new_best_fixed_qps_selection": selected[new_label][key],
        "recovery_batches": rows[_median_index([x["recovery_batches"] for x in rows])]["recovery_batches"],
        "recovery_s": rows[_median_index([x["recovery_s"] for x in rows])]["recovery_s"],
        "aimd_after_vs_new_best": statistics.median(x["aimd_after_vs_new_best"] or 0.0 for x in rows),
        "by_round": rows,
    }


def _log_reading(metric: str, e: dict[str, Any], n_confirm: int) -> None:
    """One reading's result line, with every round's figure beside the median, so a noisy
    round shows in the log."""
    rows = e["by_round"]
    log(f"  => {metric} (AIMD {e['aimd_objective_ms']:g} ms): new best {e['new_best_fixed']} "
        f"{e['new_best_fixed_qps']:.0f} qps (median of {n_confirm} confirming rounds; "
        f"{e['new_best_fixed_qps_selection']:.0f} in the selection); back to 90% in "
        f"{', '.join(str(x['recovery_batches']) for x in rows)} batches (median "
        f"{e['recovery_batches']}); after/new best "
        f"{', '.join(fmt_ratio(x['aimd_after_vs_new_best']) for x in rows)} (median "
        f"{fmt_ratio(e['aimd_after_vs_new_best'])}); AIMD max after "
        f"{', '.join(str(x['max_batch_after_median']) for x in rows)}")


def _one_round(b: Bench, r: RunResult, win: int, key: str, in_time: bool, new_best: float) -> dict[str, Any]:
    """One AIMD run's figures for one reading against the new best fixed size's rate."""
    dl = b.deadline_us
    slow_us = r.extra["slowdown_at_us"]
    before = summarise(r.obs, slow_us - win, slow_us, dl, r.batches)
    after = summarise(r.obs, r.t1_us - win, r.t1_us, dl, r.batches)
    series = goodput_series(r.obs, slow_us, r.t1_us, BIN_S, dl if in_time else None)
    rec_s = recovery(series, BIN_S, 0.9 * new_best, HOLD) if new_best else None
    return {
        "aimd_before": before, "aimd_after": after,
        "aimd_before_qps": before[key], "aimd_after_qps": after[key],
        "aimd_after_vs_new_best": ratio(new_best, after[key]),
        "in_time_fraction_after": after["in_time_fraction"],
        "recovery_s": rec_s,
        "recovery_batches": (batches_between(r.batches, slow_us, slow_us + int(rec_s * 1e6))
                             if rec_s is not None else None),
        "max_batch_before_median": _median_between(r.max_batch, (slow_us - win) / 1e6, slow_us / 1e6),
        "max_batch_after_median": _median_between(r.max_batch, (r.t1_us - win) / 1e6, r.t1_us / 1e6),
    }


def _trace(r: RunResult, half: float, dl: int) -> dict[str, Any]:
    start_us = r.t0_us - int(half * 1e6)
    return {
        "t0_s": start_us / 1e6, "slowdown_s": (r.extra["slowdown_at_us"] - start_us) / 1e6,
        "max_batch": [(round(t - start_us / 1e6, 3), v) for t, v in r.max_batch],
        "batches": [(round((c - start_us) / 1e6, 4), sz, round(sv / 1000, 2)) for c, sz, sv in r.batches
                    if c >= start_us],
        "goodput_bins": goodput_series(r.obs, start_us, r.t1_us, 0.25, dl),
        "ok_bins": goodput_series(r.obs, start_us, r.t1_us, 0.25, None),
        "bin_s": 0.25,
    }


def _median_index(xs: Sequence[float | None]) -> int:
    """Where the median of ``xs`` is (the lower one of an even count), a recovery never
    reached (None) counting as the longest."""
    order = sorted(range(len(xs)), key=lambda i: float("inf") if xs[i] is None else xs[i])
    return order[(len(order) - 1) // 2]


def _median_between(trace: Sequence[tuple[float, int]], t0: float, t1: float) -> float | None:
    vals = [v for t, v in trace if t0 <= t < t1]
    return statistics.median(vals) if vals else None
