"""Members: 1, 2 and 4 selector and batcher members on the simulated accelerator.

What it measures: the peak goodput (q/s answered with a real prediction within the SLO, at the
best step) and the highest goodput at a step whose p99 is within the SLO (None when no step's
is), of one ``clipstream up`` run with k selector
members (``CLIPSTREAM_UP_SELECTORS``) and k batcher members (``CLIPSTREAM_UP_BATCHER_MEMBERS``),
k = 1, 2, 4, and the CPU each kind of stage spends per query there. The model is the
accelerator profile at full speed on two replicas, whose ceiling (``bench.efficiency``) is far
above what the stages carry on a small machine, so the stages, not the device, set the limit:
what more members buy is more CPU for selecting and batching, if the machine has it. On a
2-core machine it does not, and each member adds its fixed costs (an interpreter, client
threads, fetches); the ratios say how much that costs. Load: open-loop Poisson through the
Kafka producer, stepped up until two steps in a row deliver less goodput than the best before.

    .venv/bin/python -m bench.members [--quick] [--members 1,2,4]   # out/bench/members.json and .png
    .venv/bin/python -m bench.members --selectors 1   # batcher members only: members-batchers.json
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

from bench.common import (OUT, Pipeline, best_under_slo, figure, load_step, save_figure, say, strip_rows, wait_warm,
                          write_app_file, write_json)
from bench.efficiency import CLOCKWORK, device_bound
from bench.load_kafka import KafkaLoad
from bench.machine import machine_info

SPEED = 1.0
SLO_MS = 100.0
REPLICAS = 2
MEMBERS = (1, 2, 4)
RATES = (50.0, 100.0, 150.0, 200.0, 300.0, 400.0, 600.0, 800.0)
QUICK_RATES = (50.0, 100.0, 200.0, 400.0)
MODEL = "accel"


def build(root: Path) -> Path:
    from clipstream.testing.models import make_profile_model

    folder = make_profile_model(root / "models", MODEL, table=CLOCKWORK, speed=SPEED)
    b, _, _ = device_bound(CLOCKWORK, SLO_MS / 2, SPEED)
    return write_app_file(root / "app.yaml", [
        {"name": MODEL, "policy": "single", "slo_ms": SLO_MS, "default_output": -1, "models": [MODEL]},
    ], [
        {"name": MODEL, "path": str(folder), "replicas": REPLICAS, "latency_objective_ms": SLO_MS / 2,
         "max_batch_size": b, "batch_delay_ms": 2},
    ])


def stage_cpu(step: dict[str, Any]) -> dict[str, float]:
    """CPU ms per query by kind of stage (members of a kind add up)."""
    out: dict[str, float] = {}
    for label, v in step["cpu_ms_per_query"].items():
        kind = label.split("-", 1)[0]
        out[kind] = round(out.get(kind, 0.0) + v, 3)
    return out


def run_members(root: Path, k: int, rates: tuple[float, ...], duration_s: float, seed: int,
                selectors: int | None = None) -> list[dict[str, Any]]:
    env = {"CLIPSTREAM_UP_SELECTORS": str(selectors or k), "CLIPSTREAM_UP_BATCHER_MEMBERS": str(k),
           "CLIPSTREAM_UP_WARM_UP_S": "5"}
    with Pipeline(build(root), env=env) as pipe:
        from bench import load

        wait_warm(pipe.url, MODEL, load.json_bodies(load.unique_inputs(1))[0])
        kl = KafkaLoad(pipe.settings(), keep_trace=False)
        try:  # a discarded step: fresh stages and a fresh broker run cold for seconds
            load_step(pipe, MODEL, rates[1], SLO_MS, 5.0, kafka_load=kl, seed=1000 * seed,
                      label=f"{k} member(s) warm-up (not reported) ").pop("_run")
            rows: list[dict[str, Any]] = []
            past_peak = 0
            for i, rate in enumerate(rates):
                s = load_step(pipe, MODEL, rate, SLO_MS, duration_s, kafka_load=kl, seed=1000 * seed + i + 1,
                              warmup_s=1.0, label=f"{k} member(s) ")
                s.pop("_run")
                s.update(members=k, cpu_ms_per_query_by_kind=stage_cpu(s))
                best = max((r["goodput_qps"] for r in rows), default=0.0)
                rows.append(s)
                # the peak is behind once two steps in a row deliver less than the best so far
                past_peak = past_peak + 1 if s["goodput_qps"] < best else 0
                if past_peak >= 2:
                    break
            return strip_rows(rows)
        finally:
            kl.close()


def main(argv: list[str] | None = None, out_dir: Path = OUT) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--members", default=",".join(map(str, MEMBERS)))
    ap.add_argument("--selectors", type=int, default=None,
                    help="a fixed selector count (only the batcher members vary); the report is then members-batchers")
    args = ap.parse_args(argv)
    members = [int(m) for m in args.members.split(",")]
    rates, duration = (QUICK_RATES, 4.0) if args.quick else (RATES, 8.0)
    b, ms, bound = device_bound(CLOCKWORK, SLO_MS / 2, SPEED)
    report: dict[str, Any] = {"machine": machine_info(), "settings": {
        "table_ms": CLOCKWORK, "speed": SPEED, "replicas": REPLICAS, "slo_ms": SLO_MS, "rates": rates,
        "step_s": duration, "mode": "kafka", "members": members,
        "device_ceiling_qps": round(REPLICAS * bound, 1), "selectors": args.selectors or "= members"},
        "steps": {}}
    name = "members" if args.selectors is None else "members-batchers"
    loads = {}  # the machine's load average around each run: other work on it shows here
    with tempfile.TemporaryDirectory(prefix="bench-members-") as tmp:
        for i, k in enumerate(members):  # one pipeline per member count, one after another
            before = os.getloadavg()[0]
            report["steps"][str(k)] = run_members(Path(tmp) / f"k{k}", k, rates, duration, seed=i + 1,
                                                  selectors=args.selectors)
            loads[str(k)] = {"before": round(before, 1), "after": round(os.getloadavg()[0], 1)}
    report["load_average_1min"] = loads
    peak = {k: max(v, key=lambda s: s["goodput_qps"]) for k, v in report["steps"].items()}
    within = {k: best_under_slo(v, SLO_MS) for k, v in report["steps"].items()}
    report["best"] = peak
    one = peak.get("1", {}).get("goodput_qps") or None
    report["summary"] = {
        "goodput_qps": {k: round(v["goodput_qps"], 1) for k, v in peak.items()},
        "ratio_to_one": {k: round(v["goodput_qps"] / one, 2) if one else None for k, v in peak.items()},
        "goodput_qps_p99_within_slo": {k: round(v["goodput_qps"], 1) if v else None for k, v in within.items()},
        "cpu_ms_per_query_by_kind": {k: v["cpu_ms_per_query_by_kind"] for k, v in peak.items()},
        "cores": report["machine"].get("cpus"),
    }
    say(f"  members: goodput {report['summary']['goodput_qps']} q/s, vs one {report['summary']['ratio_to_one']}")
    write_json(name, report, out_dir)
    plot(report, name, out_dir)
    return report


def plot(report: dict[str, Any], name: str, out_dir: Path = OUT) -> None:
    """Goodput and p99 of the answers by offered load, one line per member count."""
    fig, axes = figure(1, 2)
    ax, ax2 = axes[0][0], axes[0][1]
    for k, steps in report["steps"].items():
        ax.plot([s["rate"] for s in steps], [s["goodput_qps"] for s in steps], "o-", label=f"{k} member(s)")
        ax2.plot([s["rate"] for s in steps], [s["latency_ms"]["p99"] for s in steps], "o-", label=f"{k} member(s)")
    ax.set_xlabel("offered q/s")
    ax.set_ylabel("goodput within SLO, q/s")
    ax.legend()
    ax2.axhline(SLO_MS, color="grey", ls="--", label="SLO")
    ax2.set_xlabel("offered q/s")
    ax2.set_ylabel("p99 ms of the answers")
    ax2.set_yscale("log")
    ax2.legend()
    save_figure(fig, name, out_dir)


if __name__ == "__main__":
    main()
