"""``main``: the command line of ``python -m bench.batching`` (the benchmark is described in
the package docstring, ``bench/batching/__init__.py``)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.batching.adapt import section_adapt
from bench.batching.helpers import OBJECTIVE_MS, ROOT, log
from bench.batching.plot import plot
from bench.batching.runner import Bench, Model, RunResult
from bench.batching.sections import (
    DISPATCH_MODES,
    models,
    section_cache,
    section_cost,
    section_delayed,
    section_throughput,
)
from bench.common import write_json
from bench.machine import machine_info, warm_until_jit_quiet

SECTIONS = ("throughput", "adapt", "delayed", "cache", "cost")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args, sections = _options(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    t0 = time.monotonic()
    report = _new_report(args, argv)
    b = Bench(args)
    report["aimd_objective_ms_within_deadline"] = b.aimd_objective_ms
    _run_sections(b, args, sections, report)
    report["load_at_end"] = os.getloadavg()
    report["wall_s"] = round(time.monotonic() - t0, 1)
    write_json("batching", report, args.out)
    try:
        plot(report, args.out)
    except Exception as exc:  # a figure problem must not lose the numbers
        log(f"figure failed: {exc}")
    log(f"done in {report['wall_s']} s")
    return report


def _parser() -> argparse.ArgumentParser:
    """Every option of ``python -m bench.batching``, apart from their checks in ``_options``."""
    import bench.batching

    ap = argparse.ArgumentParser(description=(bench.batching.__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="~1 minute smoke run: fewer sizes, shorter runs")
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "bench")
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    ap.add_argument("--models", default="clockwork,svm,onnx", help="models of the throughput section")
    ap.add_argument("--keep", action="store_true", help="keep the temporary dir (process logs)")
    ap.add_argument("--verbose", action="store_true", help="print each run's latency by hop")
    ap.add_argument("--deadline-ms", type=float, default=OBJECTIVE_MS,
                    help="request deadline = produce time + this (Clipper's reading keeps AIMD's objective at 20 ms)")
    ap.add_argument("--aimd-objective-ms", type=float, default=None,
                    help="AIMD's objective on a batch's service time in the runs that count goodput within the "
                         "deadline (default: the 20 ms latency objective); the adapt section then also reports "
                         "AIMD at this objective beside its target's readings at 20 ms")
    ap.add_argument("--no-ramp", dest="ramp", action="store_false",
                    help="step to the full offered load at once instead of a ramp over half the warm-up")
    ap.add_argument("--rate-scale", type=float, default=1.0, help="scale the throughput runs' offered load")
    ap.add_argument("--no-cache", action="store_true", help="run every batcher with --no-cache")
    ap.add_argument("--dispatch", default=None,
                    help="dispatch modes of the delayed section, comma-separated: just in time, open pipe, "
                         "eager credit, clipper (default: the first two; --quick: open pipe)")
    ap.add_argument("--hopeless-margin-ms", type=float, default=0.0,
                    help="the batcher's margin for the prediction's trip on to the selector when it drops requests "
                         "that cannot make their deadline (pipeline default 3 ms); 0 here, since this benchmark "
                         "counts the deadline at the predictions topic itself")
    return ap


def _options(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The parsed options and the sections to run: an unknown dispatch mode is refused before
    anything starts, and --quick alone narrows the sections to its ~1 minute pair."""
    ap = _parser()
    args = ap.parse_args(argv)
    unknown = [m for m in (args.dispatch or "").split(",") if m.strip() and m.strip() not in DISPATCH_MODES]
    if unknown:
        ap.error(f"unknown --dispatch mode(s) {unknown}; choose from {list(DISPATCH_MODES)}")
    args.models = [m for m in args.models.split(",") if m]
    sections = [s for s in args.sections.split(",") if s]
    if args.quick and args.sections == ",".join(SECTIONS):
        sections = ["throughput", "cache"]  # ~1 min; name --sections for the others
    args.out.mkdir(parents=True, exist_ok=True)
    return args, sections


def _interrupt(*_: Any) -> None:
    """SIGTERM as Ctrl-C, so a terminated run still stops its broker and writes what it has."""
    raise KeyboardInterrupt


def _new_report(args: argparse.Namespace, argv: Sequence[str] | None) -> dict[str, Any]:
    """What the run measures and under which settings and machine load, before any section adds
    its figures."""
    return {
        "what": "model abstraction layer alone on a real Kafka broker and Redis: requests.<model> -> batcher -> "
                "worker -> predictions; goodput = ok predictions answered within the objective per second",
        "objective_ms": OBJECTIVE_MS, "request_deadline_ms": args.deadline_ms, "quick": args.quick,
        "ramp": args.ramp, "hopeless_margin_ms": args.hopeless_margin_ms,
        "argv": list(argv) if argv is not None else sys.argv[1:], "host_cpus": os.cpu_count(),
        "load_at_start": os.getloadavg(), "machine": machine_info(), "throughput": {},
    }


def _run_sections(b: Bench, args: argparse.Namespace, sections: list[str], report: dict[str, Any]) -> None:
    """The broker and Redis up, the broker warmed, then each chosen section in turn; an
    interruption is recorded in the report and everything is stopped either way."""
    ms = models(args.quick)
    try:
        b.start()
        _warm_broker(b, ms, args.quick)
        thr: dict[str, dict[str, RunResult]] = {}
        if "throughput" in sections:
            thr = section_throughput(b, ms, report)
        if "adapt" in sections:
            section_adapt(b, ms, report)
        if "delayed" in sections:
            section_delayed(b, ms, report)
        if "cache" in sections:
            section_cache(b, ms, report)
        if "cost" in sections:
            section_cost(b, ms, report, thr)
    except KeyboardInterrupt:
        log("interrupted: stopping everything")
        report["interrupted"] = True
    finally:
        b.stop()


def _warm_broker(b: Bench, ms: dict[str, Model], quick: bool) -> None:
    """Unreported runs first, so that no measured run pays for the broker's JIT compiling."""
    # the broker's JIT: a cold broker at full load expires nearly everything and warms
    # slowly, so it is warmed at half the load it will meet, for as long as `up` warms
    log("warm-up run (the broker's JIT; not reported)")
    b.run(ms["svm"], "warm-up", rate_qps=500.0, warmup_s=0.5, measure_s=1.0 if quick else 20.0)
    if not quick:  # then on while the broker still compiles: after the 20 s alone the
        # next two runs met it compiling and read a third to a half of the goodput of later ones
        warm_until_jit_quiet(b.status.kafka_pid, lambda i: b.run(
            ms["clockwork"], f"warm-up {i + 2}", warmup_s=0.5, measure_s=5.0), log)
