"""Efficiency: how much of the simulated accelerator the pipeline keeps busy.

One replica of the profile backend (Clockwork's ResNet-50 table, slowed down ``SPEED`` times so
that its capacity is well below what the rest of the pipeline can carry on a small machine).
Its own ceiling comes from the table: the largest batch ``b`` whose latency fits the batch budget
(half the SLO: a query that just misses a batch waits for it, then rides in the next one), and
the device's throughput ``b / latency(b)``. The benchmark offers Poisson load from half that
ceiling to 1.3 times it (a goodput capacity is also what survives overload) and reports the best
goodput within the SLO divided by the ceiling, beside the best at or below it. The batcher's
AIMD objective is the budget and its cap is ``b``. The full run compares 2 batches in flight
per replica (the default: the device never waits for a Kafka round trip, but a query may wait
behind a queued batch) with 1.

No system reaches the ceiling within the SLO under Poisson arrivals: a batch that takes half the
SLO leaves the last query to join it little slack, and bursts queue. So each step is also
replayed, same arrival times, through an *ideal* batcher (zero overhead, no Kafka, greedy,
dropping hopeless requests) in front of the same latency table: ``vs_ideal`` is the share of
what any pipeline could deliver that this one delivers. The device's measured busy time (the
workers' ``BatchStats``) is reported beside it.

    .venv/bin/python -m bench.efficiency [--quick]      # out/bench/efficiency.json and .png
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench import load
from bench.load_kafka import KafkaLoad
from bench.common import (OUT, Pipeline, figure, load_step, save_figure, say, strip_rows, wait_warm, write_app_file,
                          write_json)
from bench.batching.helpers import device_max, latency_fn
from bench.machine import machine_info
from bench.stats import percentile
from bench.tap import Tap
from schemas import BatchStats, Record
from clipstream.clock import now_us
from clipstream.testing.models import CLOCKWORK

SPEED = 1 / 8  # the simulated device is 8x slower than the table: ~120 q/s at a 200 ms SLO
SLO_MS = 200.0
FRACTIONS = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.15, 1.3)


def device_bound(table: Mapping[int, float], budget_ms: float, speed: float = 1.0,
                 max_batch: int = 1024) -> tuple[int, float, float]:
    """(batch size, its latency ms, throughput q/s) of the best batch whose latency fits the budget,
    on the profile ``table`` run ``speed`` times as fast (``bench.batching.helpers.device_max``)."""
    best = device_max(latency_fn(table), budget_ms, max_batch, slowdown=1 / speed)
    return int(best["batch_size"]), best["latency_ms"], best["qps"]


def ideal_goodput(times_s: Any, slo_ms: float, cap: int, table: Mapping[int, float], speed: float,
                  warmup_s: float, duration_s: float) -> float:
    """Goodput (q/s within the SLO, arrivals after warm-up) of a zero-overhead greedy batcher:
    whenever the device is free it runs everything queued (up to ``cap``), after dropping the
    requests that could no longer finish in time."""
    latency_ms = latency_fn(table)
    arr = [t * 1000.0 for t in times_s]
    t, i, good, n = 0.0, 0, 0, len(arr)
    while i < n:
        t = max(t, arr[i])
        while i < n and arr[i] + slo_ms < t + latency_ms(1) / speed:
            i += 1  # hopeless: dropped, like the batcher does
        if i >= n:
            break
        t = max(t, arr[i])
        j = i
        while j < n and arr[j] <= t and j - i < cap:
            j += 1
        done = t + latency_ms(j - i) / speed
        good += sum(1 for a in arr[i:j] if a >= warmup_s * 1000 and done - a <= slo_ms)
        t, i = done, j
    return good / max(1e-9, duration_s - warmup_s)


class BatchStatsTap:
    """Reads the model's ``batch-stats`` topic (``bench.tap``): the device's busy time per step."""

    def __init__(self, settings: Any, model: str, expected_ms: Any = None) -> None:
        from topics import Catalogue

        self.rows: list[tuple[int, int, int]] = []  # (created_us, service_us, batch_size)
        self.expected_ms = expected_ms  # batch size -> the table's latency, to report the overshoot
        self.tap = Tap(settings, [Catalogue.from_settings(settings).batch_stats(model)]).start(self._on)

    def _on(self, r: Record, msg: Any, arrived_us: int) -> None:
        if isinstance(r, BatchStats):
            self.rows.append((r.created_us, r.service_us, r.batch_size))

    def close(self) -> None:
        self.tap.close()

    def between(self, t0_us: int, t1_us: int) -> dict[str, Any]:
        rows = [r for r in self.rows if t0_us <= r[0] < t1_us]
        busy = sum(r[1] for r in rows) / max(1, t1_us - t0_us)
        mean = sum(r[2] for r in rows) / len(rows) if rows else 0.0
        out: dict[str, Any] = {"device_busy": round(busy, 3), "mean_batch": round(mean, 2), "batches": len(rows)}
        if self.expected_ms is not None and rows:
            # measured service time over the table's: what AIMD sees beyond the device itself
            over = [r[1] / 1000 - self.expected_ms(r[2]) for r in rows]
            out["service_over_table_ms"] = {"p50": round(percentile(over, 50), 2), "p99": round(percentile(over, 99), 2)}
        return out


def build(root: Path, replicas: int = 1, name: str = "accel", speed: float = SPEED, slo_ms: float = SLO_MS) -> Path:
    from clipstream.testing.models import make_profile_model

    folder = make_profile_model(root / "models", name, table=CLOCKWORK, speed=speed)
    b, _, _ = device_bound(CLOCKWORK, slo_ms / 2, speed)
    return write_app_file(root / f"app-{name}.yaml", [
        {"name": name, "policy": "single", "slo_ms": slo_ms, "default_output": -1, "models": [name]},
    ], [
        {"name": name, "path": str(folder), "replicas": replicas, "latency_objective_ms": slo_ms / 2,
         "max_batch_size": b, "batch_delay_ms": 2},
    ])


def main(argv: list[str] | None = None, out_dir: Path = OUT) -> dict[str, Any]:
    duration, fractions, in_flights = _options(argv)
    report = _new_report(duration)
    b, bound = report["device"]["best_batch"], report["device"]["max_qps"]
    for in_flight in in_flights:
        rows_k = strip_rows(_run_in_flight(in_flight, fractions, duration, b, bound))
        report["by_in_flight"][str(in_flight)] = _in_flight_figures(rows_k, bound)
        report["steps"] += rows_k
    head = in_flights[0]  # the headline figures: the first setting run (the default, 2)
    report["summary"] = _summary(report, head, bound)
    _say_summary(report, bound)
    write_json("efficiency", report, out_dir)
    _plot(report, head, b, bound, out_dir)
    return report


def _options(argv: list[str] | None) -> tuple[float, tuple[float, ...], tuple[int, ...]]:
    """The step length, offered fractions and in-flight settings: --quick picks smaller defaults,
    which the explicit lists then override."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--fractions", help="comma-separated offered loads as fractions of the ceiling")
    ap.add_argument("--in-flight", help="comma-separated batches in flight per replica (default 2,1)")
    args = ap.parse_args(argv)
    duration = 5.0 if args.quick else 12.0
    fractions = (0.6, 0.75) if args.quick else FRACTIONS
    in_flights = (2,) if args.quick else (2, 1)
    if args.fractions:
        fractions = tuple(float(f) for f in args.fractions.split(","))
    if args.in_flight:
        in_flights = tuple(int(k) for k in args.in_flight.split(","))
    return duration, fractions, in_flights


def _new_report(duration: float) -> dict[str, Any]:
    """The report's settings and the device's ceiling from the table, which every efficiency
    figure is divided by; the steps and per-setting figures are filled in as they run."""
    b, ms, bound = device_bound(CLOCKWORK, SLO_MS / 2, SPEED)
    b_full, ms_full, bound_full = device_bound(CLOCKWORK, SLO_MS, SPEED)
    say(f"efficiency: device ceiling {bound:.1f} q/s (batch {b}, {ms:.1f} ms; budget SLO/2 = {SLO_MS / 2:g} ms)")
    return {"machine": machine_info(), "settings": {
        "table_ms": CLOCKWORK, "speed": SPEED, "slo_ms": SLO_MS, "batch_budget_ms": SLO_MS / 2, "step_s": duration,
        "warmup_s": 2.0, "arrivals": "Poisson (cv 1)", "replicas": 1, "mode": "kafka"},
        "device": {"best_batch": b, "batch_ms": ms, "max_qps": bound,
                   "if_whole_slo_were_the_batch_budget": {"best_batch": b_full, "batch_ms": ms_full, "max_qps": bound_full}},
        "steps": [], "by_in_flight": {}}


def _run_in_flight(in_flight: int, fractions: tuple[float, ...], duration: float, b: int,
                   bound: float) -> list[dict[str, Any]]:
    """Every offered load on a pipeline of its own: the batches-in-flight limit is read from the
    environment when the batcher starts, so each setting needs a fresh pipeline."""
    say(f"efficiency: batches in flight per replica = {in_flight}")
    table_ms = latency_fn(CLOCKWORK)
    steps = []
    with tempfile.TemporaryDirectory(prefix="bench-eff-") as tmp, \
            Pipeline(build(Path(tmp)), env={"CLIPSTREAM_BATCHER_MAX_IN_FLIGHT": str(in_flight)}) as pipe:
        wait_warm(pipe.url, "accel", load.json_bodies(load.unique_inputs(1))[0])
        kl = KafkaLoad(pipe.settings(), keep_trace=False)
        tap = BatchStatsTap(pipe.settings(), "accel", lambda n: table_ms(n) / SPEED)
        try:
            for i, f in enumerate(fractions):
                steps.append(_step(pipe, kl, tap, i, f, in_flight, duration, b, bound))
        finally:
            tap.close()
            kl.close()
    return steps


def _step(pipe: Pipeline, kl: KafkaLoad, tap: BatchStatsTap, i: int, f: float, in_flight: int, duration: float,
          b: int, bound: float) -> dict[str, Any]:
    """One offered load, with the device's busy time over it and the ideal batcher's goodput on
    the very same arrivals (same seed), so the two can be divided."""
    t0 = now_us()
    s = load_step(pipe, "accel", f * bound, SLO_MS, duration, kafka_load=kl, seed=i + 1,
                  warmup_s=2.0, label=f"in-flight {in_flight} x{f:g} ")
    s.update(tap.between(t0 + 2_000_000, now_us()))
    ideal = ideal_goodput(load.arrival_times(f * bound, 1.0, duration, i + 1), SLO_MS, b,
                          CLOCKWORK, SPEED, 2.0, duration)
    s["ideal_goodput_qps"] = round(ideal, 1)
    s["vs_ideal"] = round(s["goodput_qps"] / ideal, 3) if ideal else None
    say(f"    device busy {s['device_busy']:.2f}, mean batch {s['mean_batch']:.1f}, "
        f"service over the table {s.get('service_over_table_ms')} ms; "
        f"ideal batcher {ideal:.1f} q/s in SLO -> this pipeline x{s['vs_ideal']}")
    s["fraction_of_ceiling"] = f
    s["in_flight"] = in_flight
    return s


def _in_flight_figures(rows_k: list[dict[str, Any]], bound: float) -> dict[str, Any]:
    """One in-flight setting's best step against the ceiling and against the ideal batcher, so
    the settings can be compared side by side."""
    best_k = max(rows_k, key=lambda r: r["goodput_qps"])
    best_ideal = max(r["ideal_goodput_qps"] for r in rows_k)
    return {"efficiency": round(best_k["goodput_qps"] / bound, 3),
            "best_goodput_qps": round(best_k["goodput_qps"], 1),
            "ideal_efficiency": round(best_ideal / bound, 3),
            "vs_ideal": round(best_k["goodput_qps"] / best_ideal, 3)}


def _summary(report: dict[str, Any], head: int, bound: float) -> dict[str, Any]:
    """The headline figures, from the first in-flight setting only, read three ways: best goodput
    at any load, with p99 within the SLO, and offered at most the ceiling."""
    rows = [r for r in report["steps"] if r["in_flight"] == head]
    ok = [r for r in rows if r["effective_ms"]["p99"] <= SLO_MS]
    best = max(rows, key=lambda r: r["goodput_qps"])
    summary = {
        "efficiency": round(best["goodput_qps"] / bound, 3),
        "best_goodput_qps": round(best["goodput_qps"], 1),
        "efficiency_with_p99_within_slo": round(max((r["goodput_qps"] for r in ok), default=0.0) / bound, 3),
        "efficiency_offered_at_most_ceiling": round(
            max((r["goodput_qps"] for r in rows if r["fraction_of_ceiling"] <= 1.0), default=0.0) / bound, 3),
        "device_max_qps": round(bound, 1), "target": 0.9,
        "ideal_batcher_efficiency": report["by_in_flight"][str(head)]["ideal_efficiency"],
        "vs_ideal": report["by_in_flight"][str(head)]["vs_ideal"],
    }
    summary["by_in_flight"] = report["by_in_flight"]
    return summary


def _say_summary(report: dict[str, Any], bound: float) -> None:
    """The closing lines a reader of the log looks for: every setting, then the headline."""
    summary = report["summary"]
    say(f"  by batches in flight: {report['by_in_flight']}")
    say(f"  efficiency {summary['efficiency']} (goodput {summary['best_goodput_qps']:.1f} / ceiling {bound:.1f}); "
        f"with p99 within SLO: {summary['efficiency_with_p99_within_slo']}; an ideal zero-overhead "
        f"batcher on the same arrivals: {summary['ideal_batcher_efficiency']}, so this pipeline "
        f"delivers x{summary['vs_ideal']} of it")


def _plot(report: dict[str, Any], head: int, b: int, bound: float, out_dir: Path) -> None:
    """Goodput and latency against the offered load, one line per in-flight setting, with the
    ceiling and the ideal batcher as the references."""
    fig, axes = figure(1, 2)
    ax = axes[0][0]
    for k in report["by_in_flight"]:
        rk = [r for r in report["steps"] if str(r["in_flight"]) == k]
        ax.plot([r["offered_qps"] for r in rk], [r["goodput_qps"] for r in rk], "o-",
                label=f"goodput within SLO, {k} batch(es) in flight")
    rk = [r for r in report["steps"] if r["in_flight"] == head]
    ax.plot([r["offered_qps"] for r in rk], [r["ideal_goodput_qps"] for r in rk], "k:",
            label="ideal zero-overhead batcher, same arrivals")
    ax.axhline(bound, color="red", ls="--", label=f"device ceiling {bound:.0f} q/s (batch {b})")
    ax.set_xlabel("offered (q/s)")
    ax.set_ylabel("q/s")
    ax.legend(fontsize=8)
    ax = axes[0][1]
    for k in report["by_in_flight"]:
        rk = [r for r in report["steps"] if str(r["in_flight"]) == k]
        ax.plot([r["offered_qps"] for r in rk], [r["latency_ms"]["p99"] for r in rk], "o-", label=f"p99 ({k} in flight)")
        ax.plot([r["offered_qps"] for r in rk], [r["latency_ms"]["p50"] for r in rk], "x--", label=f"p50 ({k} in flight)")
    ax.axhline(SLO_MS, color="grey", ls=":")
    ax.set_xlabel("offered (q/s)")
    ax.set_ylabel("latency (ms)")
    ax.legend(fontsize=8)
    save_figure(fig, "efficiency", out_dir)


if __name__ == "__main__":
    main()
