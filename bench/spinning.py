"""What a model run costs in CPU when its framework's idle threads may spin, and when they sleep.

ONNX Runtime's intra-op threads and OpenMP's (torch) busy-wait for a while after each run by
default. A worker shares its machine with the other stages and workers, so clipstream turns
that off unless a model's ``model.yaml`` says ``allow_spinning: true`` (docs/design/0051).
This loads three of the demo's models (``clipstream.demo.train``) with the framework's default
thread count, through ``workers.backends.load_model`` as a worker does, once each way, and
times one run every 10 ms (the gaps of a lightly loaded worker) at batch sizes 1 and 32: CPU
of the whole process (every thread) and wall time per run. Each variant runs in a process of
its own, as OpenMP reads its wait policy once; the variants alternate, two rounds.

    .venv/bin/python -m bench.spinning     # out/bench/spinning.json and .png
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bench.common import OUT, figure, save_figure, say, write_json
from bench.machine import machine_info

BATCHES = (1, 32)
RUNS = 150
GAP_S = 0.01
ROUNDS = 2
NAMES = ("linsvm", "knn", "mlp")  # the demo's models with intra-op parallel work at batch 32


def child(folder: str) -> dict[str, Any]:
    """Load one model folder as a worker does and time its runs (the child process's work)."""
    from registry.spec import load_spec
    from workers.backends import load_model

    model = load_model(load_spec(Path(folder)), device="cpu")
    rng = np.random.default_rng(0)
    out: dict[str, Any] = {}
    for batch in BATCHES:
        x = (rng.random((batch, 64)) * 16).astype(np.float32)
        for _ in range(30):
            model.predict_batch(x)
        c0, wall = time.process_time(), 0.0
        for _ in range(RUNS):
            t = time.perf_counter()
            model.predict_batch(x)
            wall += time.perf_counter() - t
            time.sleep(GAP_S)
        out[str(batch)] = {"cpu_us": round((time.process_time() - c0) * 1e6 / RUNS, 1), "wall_us": round(wall * 1e6 / RUNS, 1)}
    return out


def models(root: Path) -> dict[str, Path]:
    """The demo's linear SVM and k-NN (ONNX) and MLP (torch), at the framework's default thread
    count, each way."""
    from clipstream.demo.train import train_all

    train_all(root / "demo", progress=lambda _: None)
    folders: dict[str, Path] = {}
    for name in NAMES:
        folder = root / "demo" / name / "1"
        spec = yaml.safe_load((folder / "model.yaml").read_text())
        config = {k: v for k, v in spec.items() if k != "threads"}
        for spin in (False, True):
            target = root / f"{name}-{'spinning' if spin else 'sleeping'}"
            shutil.copytree(folder, target, ignore=shutil.ignore_patterns("model.yaml"))
            (target / "model.yaml").write_text(yaml.safe_dump({**config, "allow_spinning": spin}))
            folders[target.name] = target
    return folders


def run_child(folder: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}  # the model decides
    done = subprocess.run([sys.executable, "-m", "bench.spinning", "--child", str(folder)], env=env,
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"timing {folder.name} failed: {done.stderr.strip()[-800:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def plot(rows: dict[str, list[dict[str, Any]]], out_dir: Path) -> None:
    fig, axes = figure(size=(7, 4))
    ax = axes[0][0]
    names = sorted(rows)
    for k, batch in enumerate(BATCHES):
        medians = [float(np.median([r[str(batch)]["cpu_us"] for r in rows[n]])) for n in names]
        ax.bar(np.arange(len(names)) + k * 0.4, medians, width=0.4, label=f"batch {batch}")
    ax.set_xticks(np.arange(len(names)) + 0.2, names, rotation=15)
    ax.set_ylabel("CPU µs per run (one run every 10 ms)")
    ax.set_yscale("log")
    ax.legend()
    save_figure(fig, "spinning", out_dir)


def main(argv: list[str] | None = None, out_dir: Path = OUT) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one round instead of two")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child)))
        return {}
    rows: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-spinning-") as tmp:
        say(f"spinning: training the demo's models, then {', '.join(NAMES)} each way")
        folders = models(Path(tmp))
        for r in range(1 if args.quick else ROUNDS):
            for name in (sorted(folders) if r % 2 == 0 else sorted(folders, reverse=True)):
                rows.setdefault(name, []).append(got := run_child(folders[name]))
                say(f"  {name:16s} " + ", ".join(
                    f"batch {b}: {got[str(b)]['cpu_us']:,.0f} µs CPU, {got[str(b)]['wall_us']:,.0f} µs wall"
                    for b in BATCHES))
    report = {"machine": machine_info(), "runs": RUNS, "gap_s": GAP_S, "batches": list(BATCHES), "rows": rows}
    write_json("spinning", report, out_dir)
    plot(rows, out_dir)
    return report


if __name__ == "__main__":
    main()
