"""The selector's skip of hopeless models near capacity: what it costs Exp4's answers.

``bench.hopeless`` measures the skip in deep overload, where it pays. This one runs where a
model's typical trip is about the time a query has left, which is where a skip can leave out
models that would have answered in time: ``make demo`` (five digit models, Exp4, feedback,
a degraded model and its rollback, SLO 150 ms) with more closed-loop callers than the demo's
four, so that its answers come near the SLO. Each run is one whole demo with
``CLIPSTREAM_SELECTOR_HOPELESS_QUANTILE`` set; every round runs each setting once, and the
order turns every round, because a shared machine drifts between runs.

Reported per run: Exp4's live error (a default counts as wrong), the defaults and their
reasons, the models the selector did not ask, and the latency p50 and p99. The summary is the
median error per setting. Each run rewrites ``out/demo`` (the demo's own report and plots).

    .venv/bin/python -m bench.skip_near_capacity [--quick] [--concurrency 8] [--rounds 2] [--quantiles 0.5,0.1]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.common import free_port, say, write_json
from bench.machine import machine_info
from clipstream.demo.train import SLO_MS
from clipstream.errors import ClipstreamError

DEMO_REPORT = Path("out/demo/report.json")
STEP = re.compile(r"^\d/5 ")


def run_demo(quantile: float, concurrency: int, queries: int) -> dict[str, Any]:
    """One ``python -m clipstream.demo`` with the skip at ``quantile``; its report."""
    env = {**os.environ, "CLIPSTREAM_SELECTOR_HOPELESS_QUANTILE": f"{quantile:g}"}
    cmd = [sys.executable, "-m", "clipstream.demo", "--concurrency", str(concurrency), "--queries", str(queries),
           "--port", str(free_port())]
    DEMO_REPORT.unlink(missing_ok=True)
    tail: list[str] = []
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail = (tail + [line.rstrip()])[-20:]
            if STEP.match(line):
                say(f"      {line.rstrip()}")
    if proc.returncode != 0 or not DEMO_REPORT.exists():
        raise ClipstreamError(f"the demo exited {proc.returncode} without a report; its last lines:\n"
                              + "\n".join(tail))
    return json.loads(DEMO_REPORT.read_text())


def row_of(report: dict[str, Any], variant: str, quantile: float, round_: int) -> dict[str, Any]:
    errors = report["cumulative_error"]
    return {"variant": variant, "quantile": quantile, "round": round_,
            "exp4_error": round(errors["exp4_live"], 4),
            "best_single_error": round(min(v for k, v in errors.items() if k in report["models"]), 4),
            "defaults": report["defaults"], "default_reasons": report.get("default_reasons", {}),
            "models_not_asked": report.get("models_not_asked"),
            "p50_ms": round(report["latency_ms"]["p50"], 1), "p99_ms": round(report["latency_ms"]["p99"], 1)}


def summarize(rows: list[dict[str, Any]], variants: dict[str, float]) -> dict[str, Any]:
    def median(key: str, name: str) -> float:
        return statistics.median(r[key] for r in rows if r["variant"] == name)

    return {"median_exp4_error": {name: round(median("exp4_error", name), 4) for name in variants},
            "median_defaults": {name: median("defaults", name) for name in variants},
            "median_p50_ms": {name: median("p50_ms", name) for name in variants},
            "models_not_asked": {name: sum(r["models_not_asked"] or 0 for r in rows if r["variant"] == name)
                                 for name in variants}}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=8, help="closed-loop callers (the demo runs 4)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--queries", type=int, default=2400, help="queries per demo run")
    ap.add_argument("--quantiles", default="0.5,0.1", help="the skip's settings, each run beside asking every model")
    ap.add_argument("--quick", action="store_true", help="one round of 1,200 queries")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.queries = 1, 1200
    variants = {**{f"skip {q:g}": q for q in (float(v) for v in args.quantiles.split(",") if v)}, "ask": 0.0}
    names = list(variants)
    rows: list[dict[str, Any]] = []
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        say(f"skip near capacity: round {r + 1} of {args.rounds}, {' then '.join(order)}, "
            f"{args.concurrency} callers")
        for name in order:
            say(f"    {name}: make demo with CLIPSTREAM_SELECTOR_HOPELESS_QUANTILE={variants[name]:g}")
            row = row_of(run_demo(variants[name], args.concurrency, args.queries), name, variants[name], r + 1)
            rows.append(row)
            say(f"    {name}: Exp4 error {row['exp4_error']:.3f}, defaults {row['defaults']}, not asked "
                f"{row['models_not_asked']}, p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms")
    summary = summarize(rows, variants)
    say("skip near capacity: median Exp4 error " + ", ".join(
        f"{name} {err:.3f}" for name, err in summary["median_exp4_error"].items()))
    report = {"machine": machine_info(), "settings": {**vars(args), "slo_ms": SLO_MS, "app": "make demo's digits"},
              "rows": rows, "summary": summary}
    write_json("skip_near_capacity", report)
    return report


if __name__ == "__main__":
    main()
