"""What each way into the gateway costs a query: ``POST /v1/apps/{app}/predict`` (JSON), the Open
Inference Protocol's ``/v2/models/{app}/infer`` (JSON), its gRPC ``ModelInfer`` (one call per
query) and ``ModelStreamInfer`` (every query on one stream), side by side on one pipeline; and
what a feedback costs (``POST /v1/apps/{app}/feedback``, the label of a query answered before).

The app is ``bench.cost``'s (one replica of the simulated accelerator, ``policy: single``, a
50 ms SLO), run by ``clipstream up --grpc-port``. Each front gets the same open-loop Poisson
load of distinct inputs at each rate, in the order v1, V2, gRPC, stream, feedback, then again in reverse,
so a drift of the machine falls on every front alike; a front's figures are the mean of its two
steps. The CPU per query is counted as in ``bench.cost``, over every process but the generator.

    .venv/bin/python -m bench.fronts [--quick] [--rates 300] [--fronts v1,feedback] [--name fronts]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench import load
from bench.common import OUT, Pipeline, figure, free_port, save_figure, say, wait_warm, warm_up, write_json
from bench.cost import APP, SLO_MS, Target, build, step, v2_bodies
from bench.load_grpc import STREAM, UNARY, request_bodies, run_grpc
from bench.load_http import run_gateway
from bench.machine import machine_info

FRONTS = ("v1", "v2-http", "grpc", "grpc-stream", "feedback")
POOL_RATE = 600.0  # q/s of the queries answered ahead, whose labels the feedback steps send


def answered_queries(pipe: Pipeline, n: int) -> list[tuple[str, Any]]:
    """``n`` queries asked through ``/v1`` ahead of the steps: each answered one's id and output."""
    times = load.arrival_times(POOL_RATE, 1.0, n / POOL_RATE, 99)
    bodies = load.json_bodies(load.unique_inputs(len(times), seed=99), SLO_MS)
    run = run_gateway(pipe.url, APP, bodies, times)
    return [(r.query_id, r.output) for r in run.results if r.outcome == "answered" and r.query_id]


def feedback_bodies(pool: list[tuple[str, Any]]) -> Callable[[np.ndarray], list[bytes]]:
    """As many feedback bodies as inputs asked for, each the label of a query of ``pool`` not
    sent before (its output: the feedback of a right answer)."""
    taken = iter(pool)

    def bodies(x: np.ndarray) -> list[bytes]:
        return [json.dumps({"query_id": qid, "label": out}).encode() for (qid, out), _ in zip(taken, range(len(x)))]

    return bodies


def targets(pipe: Pipeline, grpc_port: int, pool: list[tuple[str, Any]]) -> dict[str, Target]:
    grpc_at = f"127.0.0.1:{grpc_port}"

    def grpc_target(name: str, mode: str) -> Target:
        return Target(name, pipe.url, "", lambda x: request_bodies(APP, x, SLO_MS), pipe.processes,
                      pipe.broker_port, send=lambda bodies, times: run_grpc(grpc_at, bodies, times, mode=mode))

    return {
        "v1": Target("v1", pipe.url, f"/v1/apps/{APP}/predict", lambda x: load.json_bodies(x, SLO_MS),
                     pipe.processes, pipe.broker_port),
        "v2-http": Target("v2-http", pipe.url, f"/v2/models/{APP}/infer", v2_bodies, pipe.processes,
                          pipe.broker_port),
        "grpc": grpc_target("grpc", UNARY),
        "grpc-stream": grpc_target("grpc-stream", STREAM),
        "feedback": Target("feedback", pipe.url, f"/v1/apps/{APP}/feedback", feedback_bodies(pool), pipe.processes,
                           pipe.broker_port),
    }


def summary(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """A front's steps at one rate, averaged: CPU per query (in all, and the gateway's), latency."""
    def mean(get: Any) -> float:
        return round(statistics.fmean(get(s) for s in steps), 1)

    return {"cpu_us_per_query": mean(lambda s: s["cpu_us_per_query_total"]),
            "gateway_cpu_us_per_query": mean(lambda s: s["cpu_us_per_query"].get("gateway", 0.0)),
            "generator_cpu_us_per_query": mean(lambda s: s["generator_cpu_us_per_query"]),
            "p50_ms": mean(lambda s: s["latency_ms"]["p50"]), "p99_ms": mean(lambda s: s["effective_ms"]["p99"]),
            "errors": sum(s["error"] + s["lost"] for s in steps), "defaults": sum(s["default"] for s in steps),
            "ok": all(s["ok"] for s in steps)}


def run(rates: list[float], seconds: float, names: tuple[str, ...] = FRONTS) -> dict[str, Any]:
    grpc_port = free_port()
    out: dict[str, Any] = {"rates": {}, "order": [*names, *reversed(names)]}
    with tempfile.TemporaryDirectory(prefix="bench-fronts-") as tmp, \
            Pipeline(build(Path(tmp)), env={"CLIPSTREAM_GATEWAY_GRPC_PORT": str(grpc_port)}) as pipe:
        wait_warm(pipe.url, APP, load.json_bodies(load.unique_inputs(1))[0])
        warm_up(pipe, APP, mode="gateway")
        # feedback labels the queries answered here: enough for every feedback step, with room
        wanted = 300 + sum(math.ceil(2.4 * rate * (seconds + 1.0)) for rate in rates) if "feedback" in names else 0
        pool = answered_queries(pipe, wanted) if wanted else []
        fronts = {name: t for name, t in targets(pipe, grpc_port, pool).items() if name in names}
        for t in fronts.values():  # each front's first calls (connections, channels) are not measured
            step(t, 100.0, 2.0, 3)
        for r, rate in enumerate(rates):
            steps: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
            for i, name in enumerate(out["order"]):
                say(f"fronts: {name} at {rate:g} q/s ({i + 1} of {len(out['order'])})")
                steps[name].append(step(fronts[name], rate, seconds + 1.0, 100 + 10 * r + i))
            out["rates"][f"{rate:g}"] = {"fronts": {name: summary(s) for name, s in steps.items()}, "steps": steps}
    return out


def plot(report: dict[str, Any], name: str, out_dir: Path) -> None:
    """At each rate, each front's CPU per query: the gateway's part, and every other process's."""
    fig, axes = figure(1, len(report["rates"]))
    for ax, (rate, at) in zip(axes[0], report["rates"].items()):
        f = at["fronts"]
        names = [k for k in FRONTS if k in f]
        gateway = [f[k]["gateway_cpu_us_per_query"] for k in names]
        rest = [f[k]["cpu_us_per_query"] - g for k, g in zip(names, gateway)]
        ax.bar(names, gateway, label="gateway")
        ax.bar(names, rest, bottom=gateway, label="every other process")
        ax.set_title(f"{rate} q/s")
        ax.set_ylabel("CPU per query or feedback (µs)")
        ax.set_ylim(0, 1.25 * max(g + r for g, r in zip(gateway, rest)))  # room above the bars for the legend
        ax.legend(loc="upper center", ncol=2)
    save_figure(fig, name, out_dir)


def main(argv: list[str] | None = None, out_dir: Path = OUT) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="6 s steps instead of 10")
    ap.add_argument("--rates", default="300", help="comma-separated offered rates, q/s (default: 300)")
    ap.add_argument("--fronts", default=",".join(FRONTS), help=f"comma-separated subset of {','.join(FRONTS)}")
    ap.add_argument("--name", default="fronts", help="report name under out/bench/")
    args = ap.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",") if r.strip()]
    names = tuple(n for n in FRONTS if n in args.fronts.split(","))
    unknown = set(args.fronts.split(",")) - set(FRONTS)
    if unknown or not names:
        ap.error(f"--fronts: {', '.join(sorted(unknown)) or 'none given'}; choose from {', '.join(FRONTS)}")
    report = {"machine": machine_info(), "app": APP, "slo_ms": SLO_MS,
              **run(rates, 6.0 if args.quick else 10.0, names)}
    for rate, at in report["rates"].items():
        for name, f in at["fronts"].items():
            say(f"  {rate} q/s {name:12s} CPU {f['cpu_us_per_query']:7,.0f} µs/query (gateway "
                f"{f['gateway_cpu_us_per_query']:,.0f}), p50 {f['p50_ms']:.1f} ms, p99 {f['p99_ms']:.1f} ms")
    write_json(args.name, report, out_dir)
    plot(report, args.name, out_dir)
    return report


if __name__ == "__main__":
    main()
