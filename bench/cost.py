"""Per-query cost: CPU per query over every process, the highest rate within the SLO through the
gateway, and MLServer and Ray Serve beside it on the same model, the same load, in the same run.

The model is the python-backend class ``bench.accel_model`` (a device lock, then a sleep of
Clockwork's ResNet-50 batch latency), one replica, in a ``policy: single`` app with a 50 ms SLO
and the batcher's default settings, run by ``clipstream up`` as a new user would. Open-loop
Poisson load posts distinct inputs to ``POST /v1/apps/{app}/predict`` (``bench.load_http``).

For each system:

- the cores each process takes with no load at all (idle: polls, heartbeats, the broker's own
  work), which every second costs whatever the rate;
- CPU per query at 100 and 300 q/s: utime + stime from /proc of every process (broker JVM,
  Redis, gateway, both selectors, batcher, worker, ``up``; every process of MLServer or Ray)
  over the step, divided by the queries sent, per process; for clipstream also the requests
  each process sent to the broker and its context switches, per query (``bench.trips``);
- the highest offered rate whose effective p99 is within the SLO (every default, error, lost or
  late answer counts as infinitely slow) with no refusal (no error status): a short search;
- the p50 at 100 q/s (light load); for clipstream also the cache-hit round trip (one input
  again and again at a light rate).

MLServer 1.7.1 and Ray Serve 2.60.0 are installed by this benchmark into virtualenvs of their
own (``bench.baselines``, never project dependencies) and serve the same class with adaptive
batching (32 items or 2 ms); their V2 inference routes get the same arrival times and inputs.
The systems run one after the other, never together: they share the machine's cores with the
load generator.

    .venv/bin/python -m bench.cost [--quick] [--only clipstream,mlserver,rayserve] [--name cost]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench import load, trips
from bench.admission import admission_cuts
from bench.baselines import ACCEL_MODEL, MAX_BATCH, MAX_WAIT_S, SETTINGS, MLServer, RayServe, Server
from bench.common import OUT, Pipeline, figure, save_figure, say, wait_warm, warm_up, write_app_file, write_json
from bench.load import RunResult
from bench.load_http import run_gateway
from bench.machine import broker_jit_s, cpu_delta, cpu_snapshot, jit_apart, machine_info

APP = "accel"
SLO_MS = 50.0
CPU_RATES = (100.0, 300.0)
SEARCH = (300.0, 400.0, 500.0, 600.0, 700.0, 800.0, 900.0, 1000.0, 1100.0)
QUICK_SEARCH = (300.0, 500.0, 800.0)
BASELINES: dict[str, type[Server]] = {"mlserver": MLServer, "rayserve": RayServe}
DOWN = (200.0, 100.0)  # when even the first step misses
TARGETS = {"cpu_us_300": 1000.0, "cpu_us_100": 1500.0, "max_rate_qps": 800.0, "vs_mlserver": 2.0,
           "light_p50_ms": 10.0, "cache_hit_p50_ms": 10.0}

@dataclass
class Target:
    """One system under the load: where to post, how a body looks, which processes it runs."""

    name: str
    url: str
    path: str
    bodies: Callable[[np.ndarray], list[bytes]]
    processes: Callable[[], dict[int, str]]
    broker_port: int | None = None  # where its stages send their Kafka requests (None: no Kafka)
    # how the load is sent (bodies, times -> the run); None: posted to url + path
    send: Callable[[list[bytes], np.ndarray], RunResult] | None = None


def v2_bodies(inputs: np.ndarray) -> list[bytes]:
    """One V2 inference request (MLServer's JSON) per input row."""
    return [json.dumps({"inputs": [{"name": "input", "shape": [1, int(row.size)], "datatype": "FP32",
                                    "data": row.astype(int).tolist()}]}).encode() for row in inputs]


def step(t: Target, rate: float, seconds: float, seed: int, warmup_s: float = 1.0,
         inputs: np.ndarray | None = None, slo_ms: float = SLO_MS, app: str = APP) -> dict[str, Any]:
    """One open-loop step: the load summary, µs of CPU per query by process, refusals."""
    times = load.arrival_times(rate, 1.0, seconds, seed)
    x = load.unique_inputs(len(times), seed=seed * 7919 + int(rate)) if inputs is None else inputs
    bodies = t.bodies(x)
    procs = t.processes()
    c0, j0 = cpu_snapshot(procs), broker_jit_s(procs)
    k0, w0 = trips.snapshot(procs, t.broker_port)
    # only clipstream's own gateway counts its admission cuts
    read_cuts: Callable[[], dict[str, float]] = (lambda: admission_cuts(t.url)) if t.broker_port is not None else dict
    cuts0 = read_cuts()
    run = t.send(bodies, times) if t.send is not None else run_gateway(t.url, app, bodies, times, path=t.path)
    cuts = {cause: n - cuts0.get(cause, 0.0) for cause, n in read_cuts().items()}
    cpu = cpu_delta(c0, cpu_snapshot(procs))
    k1, w1 = trips.snapshot(procs, t.broker_port)
    cpu = jit_apart(cpu, j0, broker_jit_s(procs))
    s = run.summary(slo_ms, warmup_s)
    n = max(1, len(times))
    per = {k: round(v * 1e6 / n, 1) for k, v in sorted(cpu.items(), key=lambda kv: -kv[1])}
    # a refused query costs little: under overload the CPU per query sent flatters the system
    answered = max(1, s["answered"] + s["default"])
    s.update(rate=rate, seconds=seconds, cpu_us_per_query=per, cpu_us_per_query_total=round(sum(per.values()), 1),
             cpu_cores={k: round(v / max(1e-9, run.wall_s), 3) for k, v in cpu.items()},
             cpu_us_per_answered_query=round(sum(cpu.values()) * 1e6 / answered, 1),
             generator_cpu_us_per_query=round(run.cpu_s * 1e6 / n, 1),
             refused=sum(r.status == 503 for r in run.results), refusal_reasons=run.refusal_reasons(),
             admission_cuts={cause: n for cause, n in cuts.items() if n},
             kafka_requests_per_query=trips.per_query(k0, k1, n),
             context_switches_per_query=trips.per_query(w0, w1, n),
             ok=bool(s["effective_ms"]["p99"] <= slo_ms and s["error"] == 0 and s["lost"] == 0))
    say(f"  {t.name} {rate:6.0f} q/s: p50 {s['latency_ms']['p50']:.1f} ms, p99 {s['effective_ms']['p99']:.1f} ms "
        f"(effective), goodput {s['goodput_qps']:.0f}, errors {s['error']}, lost {s['lost']}, defaults "
        f"{s['default']}, refused {s['refused']}{' ' + str(s['refusal_reasons']) if s['refused'] else ''}"
        f"{', admission cuts ' + str(s['admission_cuts']) if s['admission_cuts'] else ''}; "
        f"CPU {s['cpu_us_per_query_total']:,.0f} µs/query {per}"
        + (f"; Kafka requests/query {s['kafka_requests_per_query']}" if s["kafka_requests_per_query"] else ""))
    return s


def idle(t: Target, seconds: float) -> dict[str, Any]:
    """The cores each process takes with no query at all (polls, heartbeats, the broker's own
    work): what every second costs whatever the rate, spread over the queries of that second."""
    procs = t.processes()
    c0, (k0, _) = cpu_snapshot(procs), trips.snapshot(procs, t.broker_port)
    time.sleep(seconds)
    spent = cpu_delta(c0, cpu_snapshot(procs))
    k1, _ = trips.snapshot(procs, t.broker_port)
    cores = {k: round(v / seconds, 4) for k, v in sorted(spent.items(), key=lambda kv: -kv[1])}
    asks = trips.per_query(k0, k1, 1)  # per step: divided by the seconds below
    asks = {k: round(v / seconds, 1) for k, v in asks.items()} if asks else None
    say(f"  {t.name} idle: {sum(cores.values()):.3f} cores {cores}" + (f"; Kafka requests/s {asks}" if asks else ""))
    return {"seconds": seconds, "cores": cores, "total_cores": round(sum(cores.values()), 4),
            "kafka_requests_per_s": asks}


def measure(t: Target, quick: bool, seed0: int) -> dict[str, Any]:
    """The idle cores; CPU per query at 100 and 300 q/s; the search for the highest rate within
    the SLO."""
    cpu_s = 6.0 if quick else 10.0
    out: dict[str, Any] = {"idle": idle(t, cpu_s), "cpu": {}}
    for i, rate in enumerate(CPU_RATES):
        out["cpu"][f"{rate:g}"] = step(t, rate, cpu_s + 1.0, seed0 + i, warmup_s=1.0)
    out["light_p50_ms"] = out["cpu"]["100"]["latency_ms"]["p50"]
    out["search"] = search(t, QUICK_SEARCH if quick else SEARCH, DOWN, quick, seed0 + 10)
    out["max_rate_qps"] = highest_ok(out["search"])
    say(f"  {t.name}: highest rate within the SLO without refusals {out['max_rate_qps']:g} q/s")
    return out


def search(t: Target, up: tuple[float, ...], down: tuple[float, ...], quick: bool, seed0: int,
           slo_ms: float = SLO_MS, app: str = APP) -> list[dict[str, Any]]:
    """Steps up ``up`` until one (quick) or two in a row miss the SLO; if none passed, down
    ``down`` until one does."""
    seconds, steps, misses = 5.0 if quick else 7.0, [], 0
    for i, rate in enumerate(up):
        steps.append(step(t, rate, seconds, seed0 + i, warmup_s=1.0, slo_ms=slo_ms, app=app))
        misses = 0 if steps[-1]["ok"] else misses + 1
        if misses >= (1 if quick else 2):
            break
    for i, rate in enumerate(down if not any(s["ok"] for s in steps) else ()):
        steps.append(step(t, rate, seconds, seed0 + 20 + i, warmup_s=1.0, slo_ms=slo_ms, app=app))
        if steps[-1]["ok"]:
            break
    return steps


def highest_ok(steps: list[dict[str, Any]]) -> float:
    """The highest rate of a step within the SLO without refusals (0 when none)."""
    return max((s["rate"] for s in steps if s["ok"]), default=0.0)


# --- clipstream ---------------------------------------------------------------------------


def build(root: Path) -> Path:
    """The app file: one replica of the accelerator class, ``policy: single``, default batcher."""
    from clipstream.testing.models import make_python_model

    source = ACCEL_MODEL.read_text()
    folder = make_python_model(root / "models", APP, source, labels=list(range(10)))
    return write_app_file(root / "app.yaml", [
        {"name": APP, "policy": "single", "slo_ms": SLO_MS, "default_output": -1, "models": [APP]},
    ], [{"name": APP, "path": str(folder), "replicas": 1}])


def run_clipstream(quick: bool) -> dict[str, Any]:
    say("cost: clipstream up, one replica of the simulated accelerator")
    with tempfile.TemporaryDirectory(prefix="bench-cost-") as tmp, Pipeline(build(Path(tmp))) as pipe:
        wait_warm(pipe.url, APP, load.json_bodies(load.unique_inputs(1))[0])
        warm_up(pipe, APP, mode="gateway")
        t = Target("clipstream", pipe.url, f"/v1/apps/{APP}/predict", lambda x: load.json_bodies(x, SLO_MS),
                   pipe.processes, pipe.broker_port)
        out = measure(t, quick, 100)
        # the cache-hit round trip: one input again and again at a light rate
        one = load.unique_inputs(1, seed=4242)
        hits = step(t, 20.0, 4.0 if quick else 8.0, 5, warmup_s=1.0, inputs=np.repeat(one, 400, axis=0))
        out["cache_hit"] = {"latency_ms": hits["latency_ms"], "answered": hits["answered"]}
        out["startup_s"] = round(pipe.started_s, 1)
    return out


# --- MLServer -----------------------------------------------------------------------------


def run_baseline(server: type[Server], quick: bool) -> dict[str, Any]:
    """One in-process server (``bench.baselines``) under the same steps as clipstream."""
    say(f"cost: {server.name}, the same class, adaptive batching ({MAX_BATCH} items or {MAX_WAIT_S * 1e3:g} ms)")
    with tempfile.TemporaryDirectory(prefix=f"bench-cost-{server.name}-") as tmp, server(Path(tmp)) as srv:
        t = Target(server.name, srv.url, server.route, v2_bodies, srv.processes)
        step(t, 150.0, 6.0, 7)  # warm-up, not reported
        return measure(t, quick, 100)


# --- the report ---------------------------------------------------------------------------


def summarize(systems: dict[str, Any]) -> dict[str, Any]:
    s: dict[str, Any] = {"targets": TARGETS}
    c = systems.get("clipstream")
    if c:
        s.update(cpu_us_per_query_300=c["cpu"]["300"]["cpu_us_per_query_total"],
                 cpu_us_per_query_100=c["cpu"]["100"]["cpu_us_per_query_total"],
                 per_process_300=c["cpu"]["300"]["cpu_us_per_query"],
                 per_process_100=c["cpu"]["100"]["cpu_us_per_query"],
                 max_rate_qps=c["max_rate_qps"], light_p50_ms=c["light_p50_ms"],
                 cache_hit_p50_ms=c["cache_hit"]["latency_ms"]["p50"])
    for name in BASELINES:
        m = systems.get(name)
        if m:
            s.update({f"{name}_max_rate_qps": m["max_rate_qps"], f"{name}_light_p50_ms": m["light_p50_ms"],
                      f"{name}_cpu_us_per_query_300": m["cpu"]["300"]["cpu_us_per_query_total"]})
        if c and m:
            s[f"vs_{name}"] = round(c["max_rate_qps"] / m["max_rate_qps"], 2) if m["max_rate_qps"] else None
    return s


def plot(systems: dict[str, Any], name: str, out_dir: Path) -> None:
    fig, axes = figure(1, 2, size=(13, 4.5))
    ax = axes[0][0]
    c = systems.get("clipstream")
    if c:
        labels = sorted({k for r in c["cpu"].values() for k in r["cpu_us_per_query"]})
        width = 0.4
        for i, rate in enumerate(c["cpu"]):
            per = c["cpu"][rate]["cpu_us_per_query"]
            ax.bar(np.arange(len(labels)) + i * width, [per.get(k, 0) for k in labels], width, label=f"{rate} q/s")
        ax.set_xticks(np.arange(len(labels)) + width / 2, labels, rotation=30, fontsize=8)
        ax.set_ylabel("CPU µs per query")
        ax.set_title("clipstream: CPU per query by process")
        ax.legend(fontsize=8)
    ax = axes[0][1]
    for sys_name, r in systems.items():
        rows = sorted(r["search"], key=lambda s: s["rate"])
        ax.plot([s["rate"] for s in rows], [min(s["effective_ms"]["p99"], 500) for s in rows], "o-",
                label=f"{sys_name} p99 (effective)")
    ax.axhline(SLO_MS, color="grey", ls=":", label="SLO")
    ax.set_yscale("log")
    ax.set_xlabel("offered (q/s)")
    ax.set_ylabel("ms")
    ax.legend(fontsize=8)
    save_figure(fig, name, out_dir)


def systems_arg(text: str) -> tuple[str, ...]:
    """``--only``'s value: known system names, comma-separated."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = sorted(set(names) - {"clipstream", *BASELINES})
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown system {', '.join(unknown) or '(none)'}; choose from clipstream, {', '.join(BASELINES)}")
    return names


def main(argv: list[str] | None = None, out_dir: Path = OUT) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", type=systems_arg, default=None, metavar="SYSTEMS",
                    help="comma-separated: " + ",".join(("clipstream", *BASELINES)) + " (default: all)")
    ap.add_argument("--name", default="cost", help="report name under out/bench/ (e.g. cost-baseline)")
    args = ap.parse_args(argv)
    report: dict[str, Any] = {"machine": machine_info(), "settings": {
        "app": APP, "policy": "single", "slo_ms": SLO_MS, "model": "bench.accel_model (Clockwork ResNet-50 table)",
        "replicas": 1, "arrivals": "Poisson", "inputs": "distinct", "cpu_rates": CPU_RATES,
        "search": QUICK_SEARCH if args.quick else SEARCH, "quick": args.quick,
        **SETTINGS}, "systems": {}}
    only = args.only or ("clipstream", *BASELINES)
    if "clipstream" in only:
        report["systems"]["clipstream"] = run_clipstream(args.quick)
    for name, server in BASELINES.items():
        if name in only:
            report["systems"][name] = run_baseline(server, args.quick)
    report["summary"] = summarize(report["systems"])
    report["machine_after"] = {"loadavg": list(os.getloadavg())}
    say(f"cost: {json.dumps({k: v for k, v in report['summary'].items() if k != 'targets'})}")
    write_json(args.name, report, out_dir)
    plot(report["systems"], args.name, out_dir)
    return report


if __name__ == "__main__":
    main()
