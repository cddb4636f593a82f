"""The 5-model digits ensemble of ``make demo`` under load: the highest rate it answers within
its SLO, and what 4 closed-loop callers get from it.

Issue 33 measured the demo's ensemble at about 100–130 q/s with 4 callers and asks for at least
three times that within its SLO. This trains the demo's five models (``clipstream.demo.train``),
runs its Exp4 app (SLO 150 ms) under ``clipstream up`` with one replica each, and measures:

- 4 closed-loop callers (the issue's own setting): answers per second and their latency;
- open-loop Poisson load of distinct digit-like inputs (no cache hits) through the gateway, a
  short upward search for the highest rate whose effective p99 (defaults, errors and losses
  counted as infinitely slow) is within the SLO with no refusal, with every process's CPU per
  query at each step (``bench.cost.step``).

The target is the open-loop rate against the issue's upper figure for today (130 q/s).

The demo serves its five models as one group (docs/design/0088): one batch and one worker
process run all five. ``--apart`` serves each model on its own, as before groups, to measure the
two side by side.

``--as-one-model`` serves the same five models inside one python model (each scores the
batch; the answer is their mean) under a ``single`` app, still through the selector: one
batch, one prediction record and one report per query instead of five each. It sizes what
serving an ensemble's models as one batch could save at most (docs/design/0087); it is not
the demo's app, and its report is not the README's row.

    .venv/bin/python -m bench.ensemble [--quick]     # out/bench/ensemble.json and .png
    .venv/bin/python -m bench.ensemble --apart --name ensemble-apart
    .venv/bin/python -m bench.ensemble --as-one-model --name ensemble-one-model
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bench import load
from bench.common import OUT, Pipeline, figure, save_figure, say, wait_warm, warm_up, write_json
from bench.cost import Target, highest_ok, search
from bench.machine import machine_info

APP = "digits"
SLO_MS = 150.0  # the demo app's
BASELINE_QPS = 130.0  # the figure for today, 4 callers (the upper end of 100–130)
TARGET_X = 3.0
CALLERS = 4
SEARCH = (200.0, 300.0, 400.0, 500.0, 600.0, 800.0)
QUICK_SEARCH = (200.0, 400.0)
DOWN = (150.0, 100.0, 50.0)  # when even the first step misses


def closed(url: str, calls: int) -> dict[str, Any]:
    """``CALLERS`` callers, each sending its next call when the last is answered."""
    from clipstream.testing.callers import closed_loop

    t0 = time.perf_counter()
    got = closed_loop(url, APP, callers=CALLERS, calls_each=calls // CALLERS, seed=11)
    wall = time.perf_counter() - t0
    ms = np.array([c.wall_ms for c in got])
    defaults = sum(1 for c in got if c.status == 200 and (c.body or {}).get("default"))
    out = {"callers": CALLERS, "calls": len(got), "wall_s": round(wall, 2), "qps": round(len(got) / wall, 1),
           "p50_ms": round(float(np.percentile(ms, 50)), 2), "p99_ms": round(float(np.percentile(ms, 99)), 2),
           "defaults": defaults, "errors": sum(1 for c in got if c.status != 200)}
    say(f"  {CALLERS} callers: {out['qps']:.0f} q/s, p50 {out['p50_ms']:.1f} ms, p99 {out['p99_ms']:.1f} ms, "
        f"defaults {defaults}, errors {out['errors']}")
    return out


ONE_MODEL = "ensemble"
ONE_MODEL_SOURCE = '''
from pathlib import Path

import numpy as np

from registry.spec import load_spec
from workers.backends import load_model


class Model:
    """The demo's five models in one: each scores the batch, and the answer is their mean."""

    def __init__(self, path, config):
        repo = Path(config["repo"])
        self.models = [load_model(load_spec(repo / m / "1"), device="cpu") for m in config["members"]]

    def predict_batch(self, inputs):
        scores = [np.asarray(m.predict_batch(inputs), dtype=np.float32) for m in self.models]
        return np.mean(scores, axis=0).astype(np.float32)
'''


def write_one_model_app(path: Path, repo: Path, members: list[str]) -> Path:
    """An app of policy ``single`` over one python model that runs every member on each batch."""
    from clipstream.testing.models import make_python_model

    make_python_model(repo, ONE_MODEL, ONE_MODEL_SOURCE, labels=list(range(10)),
                      extra={"repo": str(repo), "members": members})
    path.write_text(yaml.safe_dump({
        "apps": [{"name": APP, "policy": "single", "slo_ms": SLO_MS, "default_output": -1, "models": [ONE_MODEL]}],
        "models": [{"name": ONE_MODEL, "version": "1", "path": f"{repo.name}/{ONE_MODEL}/1", "replicas": 1}],
    }, sort_keys=False))
    return path


def run(quick: bool, as_one_model: bool = False, apart: bool = False) -> dict[str, Any]:
    from clipstream.demo.train import train_all, write_app_file

    with tempfile.TemporaryDirectory(prefix="bench-ensemble-") as tmp:
        root = Path(tmp)
        say("ensemble: training the demo's five models")
        accuracy = train_all(root / "models", progress=lambda m: say(f"  {m}"))
        if as_one_model:  # the selector stays in the path, as it is for the demo's Exp4 app
            app_file = write_one_model_app(root / "app.yaml", root / "models", list(accuracy))
            env = {"CLIPSTREAM_GATEWAY_DIRECT": "false"}
        else:
            app_file = write_app_file(root / "app.yaml", list(accuracy), slo_ms=SLO_MS,
                                      **({"group": None} if apart else {}))
            env = {}
        with Pipeline(app_file, env=env) as pipe:
            say("ensemble: clipstream up, " + ("the five models in one" if as_one_model else
                                               "one replica of each model" if apart else "the five models as one group"))
            wait_warm(pipe.url, APP, load.json_bodies(load.unique_inputs(1))[0])
            warm_up(pipe, APP, mode="gateway")
            out: dict[str, Any] = {"models": list(accuracy), "startup_s": round(pipe.started_s, 1)}
            out["closed_loop"] = closed(pipe.url, 400 if quick else 1200)
            t = Target("clipstream", pipe.url, f"/v1/apps/{APP}/predict", load.json_bodies, pipe.processes, pipe.broker_port)
            out["search"] = search(t, QUICK_SEARCH if quick else SEARCH, DOWN, quick, 200, slo_ms=SLO_MS, app=APP)
    out["max_rate_qps"] = highest_ok(out["search"])
    out["vs_baseline"] = round(out["max_rate_qps"] / BASELINE_QPS, 2)
    say(f"ensemble: highest rate within the SLO without refusals {out['max_rate_qps']:g} q/s = "
        f"{out['vs_baseline']:.2f}x the issue's {BASELINE_QPS:g} q/s")
    return out


def plot(r: dict[str, Any], out_dir: Path, name: str = "ensemble") -> None:
    fig, axes = figure(1, 2, size=(12, 4.5))
    rows = sorted(r["search"], key=lambda s: s["rate"])
    ax = axes[0][0]
    ax.plot([s["rate"] for s in rows], [min(s["effective_ms"]["p99"], 1000) for s in rows], "o-", label="p99 (effective)")
    ax.plot([s["rate"] for s in rows], [s["latency_ms"]["p50"] for s in rows], "s-", label="p50")
    ax.axhline(SLO_MS, color="grey", ls=":", label="SLO")
    ax.set_yscale("log")
    ax.set_xlabel("offered (q/s)")
    ax.set_ylabel("ms")
    ax.set_title("digits ensemble (5 models, Exp4), open loop")
    ax.legend(fontsize=8)
    ax = axes[0][1]
    ax.plot([s["rate"] for s in rows], [s["cpu_us_per_query_total"] for s in rows], "o-")
    ax.set_xlabel("offered (q/s)")
    ax.set_ylabel("CPU µs per query, every process")
    save_figure(fig, name, out_dir)


def main(argv: list[str] | None = None, out_dir: Path = OUT) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--name", default="ensemble", help="report name under out/bench/ (e.g. ensemble-16core)")
    ap.add_argument("--as-one-model", action="store_true",
                    help="serve the five models inside one model, through the selector (docs/design/0087)")
    ap.add_argument("--apart", action="store_true",
                    help="serve each model on its own, not as the demo's group (docs/design/0088)")
    args = ap.parse_args(argv)
    if args.apart and args.as_one_model:
        ap.error("--apart and --as-one-model are two different layouts; pick one")
    report: dict[str, Any] = {"machine": machine_info(), "settings": {
        "app": APP, "policy": "single" if args.as_one_model else "exp4", "as_one_model": args.as_one_model,
        "grouped": not (args.apart or args.as_one_model),
        "slo_ms": SLO_MS, "replicas": 1, "arrivals": "Poisson",
        "inputs": "distinct", "search": QUICK_SEARCH if args.quick else SEARCH, "quick": args.quick,
        "baseline_qps": BASELINE_QPS, "target_x": TARGET_X}}
    report.update(run(args.quick, args.as_one_model, args.apart))
    report["machine_after"] = {"loadavg": list(os.getloadavg())}
    write_json(args.name, report, out_dir)
    plot(report, out_dir, args.name)
    return report


if __name__ == "__main__":
    main()
