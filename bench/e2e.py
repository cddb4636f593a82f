"""End-to-end: the highest offered rate whose p99 stays within the SLO, and the latency/throughput curve.

Two single-model apps (policy ``single``): the digits logistic regression in ONNX Runtime on the
CPU, and the simulated accelerator (Clockwork's ResNet-50 table). For each model and each SLO
(20 and 50 ms) the offered Poisson rate steps up until the effective p99 (a default, an error or
a late answer counts as infinitely slow) exceeds the SLO twice in a row. Load goes straight into
the queries topic (the cheap generator); the ONNX model at 50 ms is also driven through the REST
gateway.

    .venv/bin/python -m bench.e2e [--quick]      # out/bench/e2e.json and e2e.png
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from bench import load
from bench.load_kafka import KafkaLoad
from bench.common import (OUT, WARM_UP, Pipeline, best_under_slo, figure, save_figure, say, sweep, wait_warm, warm_up,
                          write_app_file, write_json)
from bench.machine import machine_info

SLOS = (20.0, 50.0)
RATES = [50, 75, 110, 160, 230, 330, 470, 670, 950, 1350]


def build(root: Path) -> Path:
    from clipstream.testing.models import make_onnx_digits_model, make_profile_model

    onnx = make_onnx_digits_model(root / "models", "logreg")
    sim = make_profile_model(root / "models", "accel")
    return write_app_file(root / "app.yaml", [
        {"name": "digits", "policy": "single", "slo_ms": 50, "default_output": -1, "models": ["logreg"]},
        {"name": "sim", "policy": "single", "slo_ms": 50, "default_output": -1, "models": ["accel"]},
    ], [
        {"name": "logreg", "path": str(onnx), "latency_objective_ms": 5, "batch_delay_ms": 1},
        {"name": "accel", "path": str(sim), "latency_objective_ms": 9.5, "batch_delay_ms": 1},
    ])


def main(argv: list[str] | None = None, out_dir: Path = OUT) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="short steps, fewer rates (a smoke run)")
    args = ap.parse_args(argv)
    duration = 3.0 if args.quick else 6.0
    rates = RATES[::2] if args.quick else RATES
    report: dict[str, Any] = {"machine": machine_info(), "settings": {
        "step_s": duration, "rates": rates, "slos_ms": SLOS, "arrivals": "Poisson (cv 1)",
        "warmup_s": 1.0, "warm_up_step": WARM_UP,
        "models": {"logreg": "ONNX digits logreg, CPU, 1 thread, AIMD objective 5 ms",
                   "accel": "profile backend, Clockwork ResNet-50 table, AIMD objective 9.5 ms"},
        "criterion": "effective p99 <= SLO (defaults, errors, late answers count as misses)"}, "curves": {}}
    with tempfile.TemporaryDirectory(prefix="bench-e2e-") as tmp:
        app_file = build(Path(tmp))
        with Pipeline(app_file) as pipe:
            body = load.json_bodies(load.unique_inputs(1))[0]
            for app in ("digits", "sim"):
                wait_warm(pipe.url, app, body)
            kl = KafkaLoad(pipe.settings(), keep_trace=False)
            try:
                for app in ("digits", "sim"):
                    warm_up(pipe, app, kafka_load=kl)
                # every sweep its own inputs (seed): one sweep replaying another's would be
                # answered by the prediction cache, not by the model
                sweeps = [(app, model, slo) for app, model in (("digits", "logreg"), ("sim", "accel")) for slo in SLOS]
                for seed, (app, model, slo) in enumerate(sweeps, start=1):
                    say(f"e2e: {model}, SLO {slo:g} ms, kafka")
                    rows = sweep(pipe, app, rates, slo, duration, kafka_load=kl, label=f"{model} {slo:g}ms ", seed=seed)
                    report["curves"][f"{model}/kafka/{slo:g}"] = rows
                say("e2e: logreg, SLO 50 ms, through the REST gateway")
                report["curves"]["logreg/gateway/50"] = sweep(pipe, "digits", rates, 50.0, duration, mode="gateway",
                                                              label="logreg 50ms ", seed=len(sweeps) + 1)
            finally:
                kl.close()
    summary = {}
    for key, rows in report["curves"].items():
        slo = float(key.rsplit("/", 1)[1])
        best = best_under_slo(rows, slo)
        summary[key] = {"max_goodput_qps_within_slo": round(best["goodput_qps"], 1) if best else 0.0,
                        "at_offered_qps": best["rate"] if best else None,
                        "p99_ms": best["latency_ms"]["p99"] if best else None,
                        "cpu_ms_per_query": best["cpu_ms_per_query"] if best else None}
        say(f"  {key}: {summary[key]['max_goodput_qps_within_slo']} q/s within SLO (p99 {summary[key]['p99_ms']})")
    report["summary"] = summary
    write_json("e2e", report, out_dir)
    plot(report, out_dir)
    return report


def plot(report: dict[str, Any], out_dir: Path) -> None:
    fig, axes = figure(1, 2)
    for ax, model in zip(axes[0], ("logreg", "accel")):
        for key, rows in report["curves"].items():
            if not key.startswith(model + "/"):
                continue
            ax.plot([r["goodput_qps"] for r in rows], [r["latency_ms"]["p99"] for r in rows], "o-", label=f"{key} p99")
            ax.plot([r["goodput_qps"] for r in rows], [r["latency_ms"]["p50"] for r in rows], "x--", label=f"{key} p50")
        for slo in SLOS:
            ax.axhline(slo, color="grey", lw=0.8, ls=":")
        ax.set_yscale("log")
        ax.set_xlabel("goodput within SLO (q/s)")
        ax.set_ylabel("latency (ms)")
        ax.set_title(model)
        ax.legend(fontsize=7)
    save_figure(fig, "e2e", out_dir)


if __name__ == "__main__":
    main()
