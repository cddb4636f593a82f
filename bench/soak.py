"""Soak: a long open-loop run at a fixed share of the measured capacity, watching every stage's
resident memory and the tail latency window by window.

A leak or a slowly growing queue shows only over many minutes: a stage whose RSS keeps rising,
or a p99 that drifts up while the offered load stays the same. The run first measures the
capacity of one replica of the simulated accelerator through the gateway (the highest step of
a short sweep whose p99 is within the SLO with no refusals), then offers ``--share`` of it (70%
by default) for ``--minutes``, in windows of ``--window-s``. Each window records the p50/p99,
refusals and every stage's RSS (summed per stage when a stage runs as several members). The
first windows are warm-up: growth is measured from the end of ``--settle-min`` to the end.

    .venv/bin/python -m bench.soak [--minutes 30] [--share 0.7] [--quick]   # out/bench/soak.json, .png
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import load
from bench.common import OUT, Pipeline, best_under_slo, figure, load_step, save_figure, say, strip_rows, wait_warm, write_json
from bench.efficiency import build
from bench.machine import machine_info

SLO_MS = 50.0
SWEEP_QPS = (100.0, 200.0, 300.0, 400.0, 500.0, 650.0, 800.0)
GROWTH_LIMIT = 0.10  # the bound on any stage's RSS growth
# Not stages: the broker's JVM heap and Redis (the prediction cache fills up to its maxmemory)
# grow by design until they plateau; they are reported, not held to the stages' bound
INFRA = ("kafka", "redis")
P99_DRIFT_LIMIT = 1.5  # last third's median p99 against the first third's, after settling


def rss_mb(pids: dict[int, str]) -> dict[str, float]:
    """Resident memory of each labelled process, in MiB (a label's processes add up)."""
    out: dict[str, float] = {}
    for pid, label in pids.items():
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    out[label] = out.get(label, 0.0) + int(line.split()[1]) / 1024
                    break
        except OSError:
            continue  # a process that ended between the listing and the read
    return {k: round(v, 1) for k, v in out.items()}


def growth(windows: list[dict[str, Any]], settle_s: float) -> dict[str, float]:
    """Each stage's RSS at the end over its RSS at the first window past ``settle_s``, minus 1."""
    settled = [w for w in windows if w["t_s"] >= settle_s] or windows[-1:]
    first, last = settled[0]["rss_mb"], settled[-1]["rss_mb"]
    return {k: round(last[k] / first[k] - 1, 4) for k in last if first.get(k)}


def p99_drift(windows: list[dict[str, Any]], settle_s: float) -> float | None:
    """Median p99 of the last third of the settled windows over that of the first third."""
    p99s = [w["p99_ms"] for w in windows if w["t_s"] >= settle_s and w["p99_ms"] is not None]
    third = len(p99s) // 3
    if third == 0:
        return None
    return round(statistics.median(p99s[-third:]) / statistics.median(p99s[:third]), 3)


def _refused(s: dict[str, Any]) -> int:
    """Calls refused (503) or failed at the door, and calls never answered."""
    return int(s.get("error", 0)) + int(s.get("lost", 0))


def capacity(pipe: Pipeline, app: str, step_s: float) -> dict[str, Any]:
    rows = []
    for i, rate in enumerate(SWEEP_QPS):
        s = load_step(pipe, app, rate, SLO_MS, step_s, mode="gateway", seed=100 + i, label="capacity ")
        s.pop("_run")
        rows.append(s)
        if not (s["effective_ms"]["p99"] <= SLO_MS and not _refused(s)):
            break
    ok = [r for r in rows if not _refused(r)]
    best = best_under_slo(ok, SLO_MS)
    if best is None:
        raise RuntimeError(f"no step of {SWEEP_QPS} held p99 <= {SLO_MS} ms without refusals: "
                           "is the machine busy? see out/bench/soak.json's sweep")
    return {"best_qps": best["rate"], "sweep": strip_rows(rows)}


def main(argv: list[str] | None = None, out_dir: Path = OUT) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--share", type=float, default=0.7, help="of the measured capacity")
    ap.add_argument("--window-s", type=float, default=30.0)
    ap.add_argument("--settle-min", type=float, default=3.0, help="windows before this are warm-up")
    ap.add_argument("--rate", type=float, help="skip the capacity sweep and offer this rate")
    ap.add_argument("--quick", action="store_true", help="3 minutes, 15 s windows, 1 minute settling")
    args = ap.parse_args(argv)
    if args.quick:
        args.minutes, args.window_s, args.settle_min = 3.0, 15.0, 1.0
    report: dict[str, Any] = {"machine": machine_info(), "settings": {
        "slo_ms": SLO_MS, "share": args.share, "minutes": args.minutes, "window_s": args.window_s,
        "settle_min": args.settle_min, "model": "simulated accelerator (Clockwork ResNet-50 table), 1 replica",
        "growth_limit": GROWTH_LIMIT, "p99_drift_limit": P99_DRIFT_LIMIT}}
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
        app = "soak"
        with Pipeline(build(Path(tmp), name=app, speed=1.0, slo_ms=SLO_MS)) as pipe:
            wait_warm(pipe.url, app, load.json_bodies(load.unique_inputs(1), SLO_MS)[0])
            if args.rate:
                rate = args.rate
            else:
                report["capacity"] = capacity(pipe, app, 8.0)
                rate = round(args.share * report["capacity"]["best_qps"], 1)
            say(f"soak: {rate} q/s for {args.minutes:g} min in {args.window_s:g} s windows")
            windows: list[dict[str, Any]] = []
            t0 = time.monotonic()
            i = 0
            while time.monotonic() - t0 < args.minutes * 60:
                s = load_step(pipe, app, rate, SLO_MS, args.window_s, mode="gateway", seed=10_000 + i,
                              label=f"window {i + 1} ")
                s.pop("_run")
                windows.append({"t_s": round(time.monotonic() - t0, 1), "p50_ms": s["latency_ms"]["p50"],
                                "p99_ms": s["latency_ms"]["p99"], "slo_miss": s["slo_miss"],
                                "refused": _refused(s), "answered": s["answered"], "default": s["default"],
                                "rss_mb": rss_mb(pipe.processes())})
                i += 1
    settle_s = args.settle_min * 60
    g, drift = growth(windows, settle_s), p99_drift(windows, settle_s)
    report.update(rate_qps=rate, windows=windows, rss_growth=g, p99_drift=drift,
                  ok={"rss": all(v < GROWTH_LIMIT for k, v in g.items() if k not in INFRA),
                      "p99": drift is not None and drift <= P99_DRIFT_LIMIT})
    write_json("soak", report, out_dir)
    _plot(windows, rate, out_dir)
    say(f"soak: RSS growth per stage {g}; p99 drift {drift}; ok {report['ok']}")
    return report


def _plot(windows: list[dict[str, Any]], rate: float, out_dir: Path) -> None:
    fig, axes = figure(2, 1, (8, 6))
    ax1, ax2 = axes[0][0], axes[1][0]
    t = [w["t_s"] / 60 for w in windows]
    for stage in sorted({k for w in windows for k in w["rss_mb"]}):
        ax1.plot(t, [w["rss_mb"].get(stage) for w in windows], label=stage)
    ax1.set_ylabel("RSS (MiB)")
    ax1.legend(fontsize=7, ncol=3)
    ax1.set_title(f"soak at {rate:g} q/s")
    ax2.plot(t, [w["p50_ms"] for w in windows], label="p50")
    ax2.plot(t, [w["p99_ms"] for w in windows], label="p99")
    ax2.axhline(SLO_MS, color="k", ls="--", lw=0.8, label="SLO")
    ax2.set_xlabel("minutes")
    ax2.set_ylabel("ms")
    ax2.legend()
    save_figure(fig, "soak", out_dir)


if __name__ == "__main__":
    main()
