"""Scaling: 1, 2 and 4 replicas of the simulated accelerator; goodput within the SLO relative to one.

Each replica is one worker process on its own partition of ``batches.<model>``; the batcher
spreads batches over them by credit. The device is slowed down ``SPEED`` times (16x: ~60 q/s per
replica at a 400 ms SLO) so that four replicas stay within what the rest of the pipeline carries
on a small machine. For each replica count the offered Poisson load is 1.1x the replicas'
combined ceiling (from the latency table, see ``bench.efficiency``), so the goodput is what the
replicas deliver, not what was offered.

    .venv/bin/python -m bench.scaling [--quick]      # out/bench/scaling.json and .png
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from bench import load
from bench.load_kafka import KafkaLoad
from bench.common import OUT, Pipeline, figure, load_step, save_figure, say, strip_rows, wait_warm, write_json
from bench.machine import machine_info
from bench.efficiency import CLOCKWORK, build, device_bound

SPEED = 1 / 16
SLO_MS = 400.0
REPLICAS = (1, 2, 4)
FRACTIONS = (0.6, 0.75, 0.9)  # of replicas x ceiling: overload (> capacity) collapses goodput, see below


def main(argv: list[str] | None = None, out_dir: Path = OUT) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    duration = 6.0 if args.quick else 12.0
    fractions = (0.75,) if args.quick else FRACTIONS
    b, ms, bound = device_bound(CLOCKWORK, SLO_MS / 2, SPEED)
    report: dict[str, Any] = {"machine": machine_info(), "settings": {
        "table_ms": CLOCKWORK, "speed": SPEED, "slo_ms": SLO_MS, "batch_budget_ms": SLO_MS / 2,
        "offered_fractions_of_ceiling": fractions, "step_s": duration, "warmup_s": 2.0, "mode": "kafka"},
        "device": {"best_batch": b, "batch_ms": ms, "max_qps_per_replica": bound}, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="bench-scaling-") as tmp:
        # one pipeline, one model per replica count (each with its own batcher and workers)
        files = [build(Path(tmp), replicas=r, name=f"accel{r}", speed=SPEED, slo_ms=SLO_MS) for r in REPLICAS]
        merged = Path(tmp) / "app.yaml"
        import yaml

        docs = [yaml.safe_load(f.read_text()) for f in files]
        merged.write_text(yaml.safe_dump({"apps": [a for d in docs for a in d["apps"]],
                                          "models": [m for d in docs for m in d["models"]]}))
        with Pipeline(merged) as pipe:
            body = load.json_bodies(load.unique_inputs(1))[0]
            for r in REPLICAS:
                wait_warm(pipe.url, f"accel{r}", body)
            kl = KafkaLoad(pipe.settings(), keep_trace=False)
            try:
                for i, r in enumerate(REPLICAS):
                    steps = []
                    for j, f in enumerate(fractions):
                        s = load_step(pipe, f"accel{r}", f * r * bound, SLO_MS, duration, kafka_load=kl,
                                      seed=10 * i + j + 1, warmup_s=2.0, label=f"{r} replica(s) x{f:g} ")
                        s.update(replicas=r, fraction_of_ceiling=f)
                        steps.append(s)
                    report["runs"][str(r)] = strip_rows(steps)
            finally:
                kl.close()
    report["steps"] = report.pop("runs")
    runs = {k: max(v, key=lambda s: s["goodput_qps"]) for k, v in report["steps"].items()}
    report["best"] = runs
    one = runs["1"]["goodput_qps"] or 1e-9
    report["summary"] = {
        "goodput_qps": {k: round(v["goodput_qps"], 1) for k, v in runs.items()},
        "ratio_to_one": {k: round(v["goodput_qps"] / one, 2) for k, v in runs.items()},
        "share_of_ceiling": {k: round(v["goodput_qps"] / (int(k) * bound), 3) for k, v in runs.items()},
        "target": "4 replicas >= 3.6x one",
    }
    say(f"  scaling: {report['summary']['ratio_to_one']} (share of ceiling {report['summary']['share_of_ceiling']})")
    write_json("scaling", report, out_dir)
    fig, axes = figure(1, 1)
    ax = axes[0][0]
    xs = [int(k) for k in runs]
    ax.plot(xs, [runs[str(x)]["goodput_qps"] for x in xs], "o-", label="goodput within SLO")
    ax.plot(xs, [x * bound for x in xs], "--", color="grey", label="ideal (replicas x device ceiling)")
    ax.set_xlabel("replicas")
    ax.set_ylabel("q/s")
    ax.set_xticks(xs)
    ax.legend()
    save_figure(fig, "scaling", out_dir)
    return report


if __name__ == "__main__":
    main()
