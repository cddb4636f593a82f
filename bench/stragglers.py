"""Stragglers (Clipper Figure 9): ensembles of 2, 4 and 8 models, one slow on a fraction of its batches.

Every model is a python-backend digits classifier (a logistic regression fitted at load time on
its own slice of scikit-learn's digits, so the members disagree a little) that takes FAST_MS per
batch; the model ``slow`` takes SLOW_MS on a fraction SLOW_FRACTION of its batches. The app
combines with Exp4. Two runs per ensemble size over the same held-out digits:
- cutoff: the app's SLO (SLO_MS); the selector answers at the deadline with what arrived;
- wait for all: a very long SLO (WAIT_SLO_MS), so the selector answers when every model has.
Reported: p99 latency, the fraction of predictions missing from answers, and accuracy (over
real answers, and with every default answer counted as wrong). The prediction cache is off:
the runs replay the same digits, and a cache hit would skip the straggler altogether.
``--sizes 8`` measures the largest ensemble after the warm-up alone: its broker has run less
long than in the full run (the JIT), so it reads higher.

``--repeat N`` runs the whole sequence N times on the same pipeline: the tail of one run on this
shared 2-core machine moves with what else the machine is doing, so the summary gives every
repetition's figures and their median (the first repetition's runs keep their plain keys).

    .venv/bin/python -m bench.stragglers [--quick] [--sizes 8] [--rate 25] [--repeat 3]   # out/bench/stragglers.json and .png
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from bench import load
from bench.load_kafka import KafkaLoad
from bench.breakdown import parts_of, table
from bench.common import (OUT, Pipeline, figure, load_step, save_figure, say, wait_warm, warm_up, write_app_file,
                          write_json)
from bench.machine import machine_info

SIZES = (2, 4, 8)
SLO_MS = 50.0
WAIT_SLO_MS = 5000.0
FAST_MS, SLOW_MS, SLOW_FRACTION = 2.0, 150.0, 0.05
RATE = 25.0
WARM_S = 30.0  # the discarded warm-up run

MODEL_SOURCE = '''
import random
import time

import numpy as np


class Model:
    """Digits logistic regression on its own slice of the training set; sleeps per batch."""

    def __init__(self, path, config):
        from sklearn.datasets import load_digits
        from sklearn.linear_model import LogisticRegression

        x, y = load_digits(return_X_y=True)
        k, n = int(config["slice"]), int(config["slices"])
        idx = np.arange(1000)[k::n] if n > 1 else np.arange(1000)
        idx = np.concatenate([idx, np.arange(1000)[(k + 1) % n::n][:200]]) if n > 1 else idx
        self.clf = LogisticRegression(max_iter=500).fit(x[idx], y[idx])
        self.fast = float(config["fast_ms"]) / 1000
        self.slow = float(config.get("slow_ms", 0)) / 1000
        self.p = float(config.get("slow_fraction", 0))
        self.rng = random.Random(k)

    def predict_batch(self, inputs):
        t = self.slow if self.p and self.rng.random() < self.p else self.fast
        start = time.perf_counter()
        out = self.clf.predict_proba(inputs.reshape(len(inputs), -1)).astype(np.float32)
        left = t - (time.perf_counter() - start)
        if left > 0:
            time.sleep(left)
        return out
'''


def build(root: Path, sizes: tuple[int, ...] = SIZES) -> Path:
    from clipstream.testing.models import make_python_model

    n = max(sizes)
    models, names = [], []
    for k in range(n):
        name = "slow" if k == n - 1 else f"m{k}"
        extra = {"slice": k, "slices": n, "fast_ms": FAST_MS}
        if name == "slow":
            extra.update(slow_ms=SLOW_MS, slow_fraction=SLOW_FRACTION)
        folder = make_python_model(root / "models", name, MODEL_SOURCE, labels=list(range(10)), extra=extra)
        models.append({"name": name, "path": str(folder), "latency_objective_ms": 10, "batch_delay_ms": 1})
        names.append(name)
    apps = [{"name": f"ens{s}", "policy": "exp4", "slo_ms": SLO_MS, "default_output": -1,
             "models": names[: s - 1] + ["slow"]} for s in sizes]
    return write_app_file(root / "app.yaml", apps, models)


def held_out() -> tuple[np.ndarray, np.ndarray]:
    from clipstream.testing.models import digits

    x, y = digits()
    return x[1000:], y[1000:]


def score(run: Any, labels: np.ndarray, size: int, slo_ms: float) -> dict[str, Any]:
    s = run.summary(slo_ms, 1.0)
    res = [r for r in run.results if r.outcome in ("answered", "default")]
    correct = [r.output is not None and int(r.output) == int(labels[r.index % len(labels)]) for r in res
               if r.outcome == "answered"]
    missing = []
    for r in res:
        # the Response names what answered: the trace has no per-model list, so use the record's
        missing.append(r.trace.get("_missing", 0) / size if r.trace else 0.0)
    s["accuracy"] = float(np.mean(correct)) if correct else float("nan")  # over real (non-default) answers
    s["accuracy_defaults_wrong"] = sum(correct) / len(res) if res else float("nan")
    s["missing_fraction"] = float(np.mean(missing)) if missing else float("nan")
    return s


def run_key(size: int, mode: str, rep: int) -> str:
    return f"{size}/{mode}" if rep == 0 else f"{size}/{mode}/r{rep + 1}"


def summarise(pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, Any]:
    """One ensemble size's figures: one entry per repetition (cutoff run, wait-for-all run), and
    with several repetitions the median of each figure, which the checks then read."""
    each = [{"p99_cutoff_ms": c["p99_ms"], "p99_wait_all_ms": w["p99_ms"],
             # the cutoff's p99 without the generator's own send lag (it shares the 2 cores)
             "p99_cutoff_from_send_ms": c.get("latency_from_send_ms", {}).get("p99", float("nan")),
             "missing_cutoff": round(c["missing_fraction"], 4), "defaults_cutoff": c["default"],
             "accuracy_cutoff": round(c["accuracy"], 4), "accuracy_wait_all": round(w["accuracy"], 4),
             "accuracy_loss_points": round(100 * (w["accuracy"] - c["accuracy"]), 2),
             "accuracy_loss_points_defaults_wrong": round(
                 100 * (w["accuracy_defaults_wrong"] - c["accuracy_defaults_wrong"]), 2)} for c, w in pairs]
    out: dict[str, Any] = {k: float(np.median([e[k] for e in each])) for k in each[0]} if len(each) > 1 else dict(each[0])
    out["cutoff_p99_within_slo_plus_5ms"] = out["p99_cutoff_ms"] <= SLO_MS + 5
    out["wait_all_p99_over_slo_plus_5ms"] = out["p99_wait_all_ms"] > SLO_MS + 5
    if len(each) > 1:
        out["repetitions"] = each
        out["cutoff_p99_within_slo_plus_5ms_in"] = f"{sum(e['p99_cutoff_ms'] <= SLO_MS + 5 for e in each)}/{len(each)}"
    return out


def main(argv: list[str] | None = None, out_dir: Path = OUT) -> dict[str, Any]:
    args, sizes, duration, warm_s = _options(argv)
    x, y = held_out()
    report = _new_report(args, sizes, duration, warm_s)
    _run_all(report, args, sizes, duration, warm_s, x, y)
    summ = {str(s): summarise([(report["runs"][run_key(s, "cutoff", r)], report["runs"][run_key(s, "wait_all", r)])
                              for r in range(args.repeat)]) for s in sizes}
    report["summary"] = summ
    _say_summary(summ, args.repeat)
    write_json("stragglers", report, out_dir)
    _plot(report, sizes, args.repeat, out_dir)
    return report


def _options(argv: list[str] | None) -> tuple[argparse.Namespace, tuple[int, ...], float, float]:
    """The command line with --quick's shorter steps and warm-up resolved, refusing what cannot
    be measured (no repetition, or an ensemble without a straggler beside it)."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sizes", default=None, help="ensemble sizes, comma-separated (default 2,4,8; --quick: 2,8)")
    ap.add_argument("--rate", type=float, default=RATE, help=f"queries/s (default {RATE:g})")
    ap.add_argument("--repeat", type=int, default=1, help="run every ensemble size this many times (default 1)")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat needs at least 1")
    duration = 5.0 if args.quick else 15.0
    sizes = (2, 8) if args.quick else SIZES
    if args.sizes:
        sizes = tuple(int(v) for v in args.sizes.split(","))
        if min(sizes) < 2:
            ap.error("an ensemble has at least 2 models (one of them the straggler)")
    warm_s = WARM_S / 4 if args.quick else WARM_S
    return args, sizes, duration, warm_s


def _new_report(args: argparse.Namespace, sizes: tuple[int, ...], duration: float, warm_s: float) -> dict[str, Any]:
    """The report's machine and settings, with an empty ``runs`` that the measured runs fill in."""
    return {"machine": machine_info(), "settings": {
        "sizes": sizes, "slo_ms": SLO_MS, "wait_for_all_slo_ms": WAIT_SLO_MS, "fast_ms": FAST_MS,
        "slow_ms": SLOW_MS, "slow_fraction_of_batches": SLOW_FRACTION, "rate_qps": args.rate, "step_s": duration,
        "warm_up_s": warm_s, "repeat": args.repeat, "policy": "exp4", "mode": "kafka", "inputs": "held-out digits (797), cycled", "prediction_cache": False}, "runs": {}}


def _run_all(report: dict[str, Any], args: argparse.Namespace, sizes: tuple[int, ...], duration: float,
             warm_s: float, x: np.ndarray, y: np.ndarray) -> None:
    """Every repetition of every ensemble size, cutoff then wait-for-all, on one pipeline that a
    discarded run has warmed first."""
    with tempfile.TemporaryDirectory(prefix="bench-strag-") as tmp:
        # no prediction cache: every run replays the same held-out digits, and a cached
        # prediction never reaches a worker, so the straggler would only straggle once
        with Pipeline(build(Path(tmp), sizes), env={"CLIPSTREAM_BATCHER_CACHE": "false"}) as pipe:
            body = load.json_bodies(x[:1])[0]
            for s in sizes:
                wait_warm(pipe.url, f"ens{s}", body)
            kl = KafkaLoad(pipe.settings(), keep_trace=True)  # the trace carries "_missing" too
            try:
                # the largest ensemble at the measured rate, discarded: it warms every stage and
                # the broker's JIT, which the first measured run would otherwise pay for
                warm_up(pipe, f"ens{max(sizes)}", kafka_load=kl, rate=args.rate, seconds=warm_s,
                        inputs=x[np.arange(int(args.rate * warm_s * 1.3) + 10) % len(x)])
                for rep, s in ((rep, s) for rep in range(args.repeat) for s in sizes):
                    for mode, slo in (("cutoff", SLO_MS), ("wait_all", WAIT_SLO_MS)):
                        report["runs"][run_key(s, mode, rep)] = _measured_run(
                            pipe, kl, args, s, mode, slo, rep, duration, x, y)
            finally:
                kl.close()


def _measured_run(pipe: Pipeline, kl: KafkaLoad, args: argparse.Namespace, s: int, mode: str, slo: float, rep: int,
                  duration: float, x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """One load step on ensemble ``s``, scored against the labels and split by hop, so a run's
    accuracy and where its tail came from sit beside its latency."""
    n = int(args.rate * duration * 1.3) + 10
    inputs = x[np.arange(n) % len(x)]
    tag = f" #{rep + 1}" if args.repeat > 1 else ""
    step = load_step(pipe, f"ens{s}", args.rate, slo, duration, kafka_load=kl, inputs=inputs,
                     seed=s + 1000 * rep, label=f"ens{s} {mode}{tag} ")
    run = step.pop("_run")
    sc = score(run, y, s, slo)
    step.update(accuracy=sc["accuracy"], missing_fraction=sc["missing_fraction"],
                accuracy_defaults_wrong=sc["accuracy_defaults_wrong"])
    step["p99_ms"] = step["latency_ms"]["p99"]
    step["breakdown_ms"] = table(parts_of(run.results))  # the last prediction joined
    say(f"    accuracy {sc['accuracy']:.3f}, missing predictions {sc['missing_fraction']:.3%}; "
        + "  ".join(f"{k} {v['p50']:.1f}/{v['p99']:.1f}" for k, v in step["breakdown_ms"].items()
                    if k != "gateway") + " (p50/p99 ms)")
    return step


def _say_summary(summ: dict[str, Any], repeat: int) -> None:
    """One closing line per ensemble size: the cutoff's tail against the SLO, and what waiting
    for every model would have cost or gained."""
    for s, v in summ.items():
        say(f"  stragglers, {s} models{' (median of ' + str(repeat) + ')' if repeat > 1 else ''}: "
            f"p99 cutoff {v['p99_cutoff_ms']:.1f} ms (within SLO + 5 ms: {v['cutoff_p99_within_slo_plus_5ms']}"
            f"{', in ' + v['cutoff_p99_within_slo_plus_5ms_in'] + ' runs' if 'repetitions' in v else ''}; "
            f"{v['p99_cutoff_from_send_ms']:.1f} ms from the send), "
            f"wait for all {v['p99_wait_all_ms']:.1f} ms; accuracy loss {v['accuracy_loss_points']:.2f} points "
            f"({v['accuracy_loss_points_defaults_wrong']:.2f} counting defaults as wrong)")


def _plot(report: dict[str, Any], sizes: tuple[int, ...], repeat: int, out_dir: Path) -> None:
    """p99, missing predictions and accuracy against the ensemble size, cutoff beside
    wait-for-all; with repetitions the p99 is their median and each run a dot."""
    summ = report["summary"]
    fig, axes = figure(1, 3, size=(15, 4))
    xs = list(sizes)
    for mode in ("cutoff", "wait_all"):
        line = axes[0][0].plot(xs, [summ[str(s)][f"p99_{mode}_ms"] for s in xs], "o-", label=mode)[0]
        for r in range(repeat if repeat > 1 else 0):  # every repetition as a dot beside the median
            axes[0][0].plot(xs, [report["runs"][run_key(s, mode, r)]["p99_ms"] for s in xs], ".",
                            color=line.get_color(), alpha=0.5)
        axes[0][1].plot(xs, [100 * report["runs"][f"{s}/{mode}"]["missing_fraction"] for s in xs], "o-", label=mode)
        axes[0][2].plot(xs, [100 * report["runs"][f"{s}/{mode}"]["accuracy"] for s in xs], "o-", label=mode)
    axes[0][0].axhline(SLO_MS, color="grey", ls=":")
    axes[0][0].set_yscale("log")
    many = repeat > 1  # the p99 line is then the median, its dots every run; the others the first run
    titles = ("p99 latency (ms)" + (f", median of {repeat}" if many else ""),
              "missing predictions (%)" + (", first run" if many else ""), "accuracy (%)" + (", first run" if many else ""))
    for ax, t in zip(axes[0], titles):
        ax.set_xlabel("models in the ensemble")
        ax.set_title(t)
        ax.set_xticks(xs)
        ax.legend()
    save_figure(fig, "stragglers", out_dir)


if __name__ == "__main__":
    main()
