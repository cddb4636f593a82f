"""A real ResNet-50 on a CUDA device through clipstream's torch backend, beside the table that
the simulated accelerator sleeps.

``bench.cost``, ``bench.scaling`` and ``bench.efficiency`` stand a python class that sleeps
Clockwork's ResNet-50 batch latencies (``bench.accel_model``) in for a GPU, so that they run
on any machine. Where a GPU exists this benchmark checks that stand-in: torchvision's
ResNet-50 with random weights (the time does not depend on them), traced to TorchScript and
exported with ``torch.export`` (the torch backend's two formats, timed one after the other), is
written to a model folder and loaded by ``workers.backends.load_model`` with ``device: auto``,
as a worker loads it. Each batch size of the table is timed through ``predict_batch``, so the
copy of the inputs to the device and of the scores back is included, as a worker pays it.

    python -m bench.gpu [--repeats 50]

Without a usable CUDA device it says so and exits with status 2; it is not part of
``make bench``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from bench.accel_model import CLOCKWORK_MS
from bench.common import OUT, figure, save_figure, say, write_json
from bench.machine import machine_info
from bench.stats import percentile

BATCHES = (1, 2, 4, 8, 16, 32)
NAME = "gpu"
FORMATS = {"torchscript": "model.pt", "export": "model.pt2"}  # the torch backend's two files


def resnet50_folder(root: Path, fmt: str = "torchscript") -> Path:
    """A model folder holding a ResNet-50 (3x224x224 float32 in, 1,000 class scores out), traced
    to TorchScript or exported with ``torch.export`` and a dynamic batch axis (``fmt``)."""
    import torch
    import torchvision

    from clipstream.testing.models import write_model_yaml

    folder = root / f"resnet50-{fmt}" / "1"
    folder.mkdir(parents=True)
    net = torchvision.models.resnet50(weights=None).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        if fmt == "export":
            batch = torch.export.Dim("batch", min=1, max=1024)
            program = torch.export.export(net, (torch.zeros(2, 3, 224, 224),), dynamic_shapes=({0: batch},))
            torch.export.save(program, str(folder / FORMATS[fmt]))
        else:
            with torch.inference_mode():
                torch.jit.save(torch.jit.trace(net, torch.zeros(1, 3, 224, 224)), str(folder / FORMATS[fmt]))
    return write_model_yaml(folder, {
        "backend": "torch", "file": FORMATS[fmt],
        "input": {"dtype": "float32", "shape": [3, 224, 224]},
        "output": {"kind": "class_scores", "labels": list(range(1000))},
    })


def time_batches(model: Any, repeats: int, warm: int = 10, busy_s: float = 2.0) -> dict[int, dict[str, float]]:
    """p50 / p99 ms of ``predict_batch`` per batch size, after ``warm`` untimed calls each.

    ``busy_s`` of untimed batches come first: an idle GPU runs at a low clock and takes a while
    to raise it, which would otherwise be charged to the first batch size.
    """
    rng = np.random.default_rng(0)
    out: dict[int, dict[str, float]] = {}
    x = rng.standard_normal((BATCHES[-1], 3, 224, 224), dtype=np.float32)
    end = time.perf_counter() + busy_s
    while time.perf_counter() < end:
        model.predict_batch(x)
    for b in BATCHES:
        x = rng.standard_normal((b, 3, 224, 224), dtype=np.float32)
        for _ in range(warm):
            model.predict_batch(x)
        ms = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            scores = model.predict_batch(x)
            ms.append((time.perf_counter() - t0) * 1e3)
        assert scores.shape == (b, 1000)
        out[b] = {"p50_ms": round(percentile(ms, 50), 3), "p99_ms": round(percentile(ms, 99), 3)}
        say(f"  batch {b:3d}: p50 {out[b]['p50_ms']:.2f} ms, p99 {out[b]['p99_ms']:.2f} ms"
            + (f" (Clockwork {CLOCKWORK_MS[b]:.2f} ms)" if b in CLOCKWORK_MS else ""))
    return out


def plot(report: dict[str, Any], out_dir: Path) -> None:
    fig, axes = figure(1, 1, size=(6.5, 4.5))
    ax = axes[0][0]
    for fmt, rows in report["formats"].items():
        xs = [int(b) for b in rows]
        ax.plot(xs, [rows[b]["p50_ms"] for b in rows], "o-", label=f"ResNet-50, {fmt} ({report['device']})")
    ax.plot(list(CLOCKWORK_MS), list(CLOCKWORK_MS.values()), "s--", label="simulated accelerator (Clockwork)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("p50 ms per batch")
    ax.legend(fontsize=8)
    save_figure(fig, NAME, out_dir)


def main(argv: list[str] | None = None, out_dir: Path = OUT) -> dict[str, Any] | None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=50, help="timed calls per batch size")
    args = ap.parse_args(argv)
    from workers.backends.devices import cuda_usable

    try:
        import torch  # noqa: F401
        import torchvision  # noqa: F401
    except ImportError as exc:
        say(f"gpu: {exc.name} is not installed; pip install torch torchvision, on a machine with a GPU")
        sys.exit(2)
    if not cuda_usable():
        say("gpu: no usable CUDA device on this machine; run it where `nvidia-smi` lists one")
        sys.exit(2)
    from registry.spec import load_spec
    from workers.backends import load_model

    device = torch.cuda.get_device_name(0)
    formats: dict[str, dict[int, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        for fmt in FORMATS:
            say(f"gpu: ResNet-50 as {fmt} ({FORMATS[fmt]}) through the torch backend, device auto")
            model = load_model(load_spec(resnet50_folder(Path(tmp), fmt)), device="auto")
            backend_device = model.device  # device auto: the same for both formats
            say(f"gpu: on {model.device} ({device}), torch {torch.__version__}")
            formats[fmt] = time_batches(model, args.repeats)
            del model
            torch.cuda.empty_cache()
    report = {"machine": machine_info(), "device": device, "backend_device": backend_device,
              "torch": torch.__version__, "repeats": args.repeats, "formats": formats, "clockwork_ms": CLOCKWORK_MS}
    write_json(NAME, report, out_dir)
    plot(report, out_dir)
    return report


if __name__ == "__main__":
    main()
