"""Gateway figures on the real pipeline with the digits ONNX model.

* cache-hit round trip under light load: one caller, the same digit again and again (every
  answer after the first comes from the prediction cache), timed by the caller;
* under overload: an open-loop Poisson load above what the pipeline serves, with fresh inputs,
  and how long any caller waited compared with its SLO (it must get an answer, the default or
  a quick 503 within SLO + 20 ms). A one-model app's queries skip the selector
  (docs/design/0083), so the default rate is set above what that pipeline answers on the
  2-core reference machine; the report's 503s show whether the step did overload it.

A caller's wait is timed three ways, because the generator shares the 2 cores with the
pipeline and is itself descheduled for tens of ms at a time: from when the query was due (the
open-loop figure, which holds the generator's late sends against the system), from when the
generator really sent it, and from the send to when the answer reached the generator's socket
(the kernel's stamp, which leaves out the generator's own delay in reading it: what the
system under test made the caller wait). In the overload step the generator runs ahead of the
pipeline in the scheduler (``--generator-nice``, -5 by default, where permitted), as callers on
machines of their own would: its late sends are then rarer, and when one still happens it
counts against the system, as before.

The broker is warmed for 30 s first: a fresh broker spends its first minutes compiling (JIT),
and in a 6 s warm-up that CPU lands in the measured step.

``--repeat N`` runs the overload step N times on the same pipeline (fresh inputs each time):
whether a burst on the shared cores makes a caller late varies from run to run, so the report
lists every repetition (the first one's figures stay under ``overload``).

    python -m bench.gateway [--hits 400] [--rate 2400] [--seconds 8] [--warm-up-s 30] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.common import WARM_UP, Pipeline, figure, save_figure, say, warm_up, write_app_file, write_json
from bench.machine import cpu_delta, cpu_snapshot, machine_info, raised_priority
from bench.load import arrival_times, json_bodies, unique_inputs
from bench.load_http import run_gateway
from bench.stats import percentile, percentiles


def main() -> None:
    args = _options()
    hits, steps = _measure(args)
    report = _report(hits, steps, args.repeat)
    _say_report(report, steps, args.repeat)
    settings = {**vars(args), "warm_up_step": {**WARM_UP, "seconds": args.warm_up_s}}
    write_json("gateway", {"machine": machine_info(), "settings": settings, "summary": report,
                           "raw": {"cache_hit_ms": hits, "overload_wait_ms": steps[0].waited.tolist(),
                                   "overload_wait_ms_later_steps": [st.waited.tolist() for st in steps[1:]],
                                   "overload_send_to_arrival_ms": [st.to_arrival.tolist() for st in steps]}})
    _plot(hits, steps, args)


def _options() -> argparse.Namespace:
    """The command line, refusing a run without an overload step."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--hits", type=int, default=400)
    ap.add_argument("--rate", type=float, default=2400.0, help="offered queries/s in the overload run")
    ap.add_argument("--warm-up-s", type=float, default=30.0, help="discarded step before measuring")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--slo-ms", type=float, default=50.0)
    ap.add_argument("--repeat", type=int, default=1, help="overload steps, one after another (default 1)")
    ap.add_argument("--generator-nice", type=int, default=-5,
                    help="the load generator's scheduling priority in the overload step, ahead of the pipeline's "
                         "(needs root or CAP_SYS_NICE; otherwise it runs at its own); 0 to leave it")
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error("--repeat needs at least 1")
    return args


def _measure(args: argparse.Namespace) -> tuple[list[float], list[Step]]:
    """Both measurements on one warmed pipeline of the digits app: the cache-hit round trips,
    then every overload step."""
    from clipstream.testing.models import digits, make_onnx_digits_model

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_onnx_digits_model(root / "models", "logreg")
        app = {"name": "digits", "policy": "single", "slo_ms": args.slo_ms, "default_output": -1, "models": ["logreg"]}
        write_app_file(root / "app.yaml", [app], [{"name": "logreg", "version": "1", "path": "models/logreg/1"}])
        with Pipeline(root / "app.yaml") as pipe:
            x, _ = digits()
            body = json.dumps({"input": x[0].tolist()}).encode()
            warm_up(pipe, "digits", mode="gateway", seconds=args.warm_up_s)
            hits = _cache_hits(pipe, body, args.hits)
            steps = [_overload(pipe, args, rep) for rep in range(args.repeat)]
    return hits, steps


def _cache_hits(pipe: Pipeline, body: bytes, n: int) -> list[float]:
    """One caller sending the same input again and again, timed by the caller; the first 20
    calls fill the cache and warm the clients, so they are left out."""
    hits = []
    with httpx.Client(base_url=pipe.url, timeout=5) as http:
        say(f"cache-hit round trips: {n} sequential calls with one input")
        for i in range(n + 20):
            t0 = time.perf_counter()
            r = http.post("/v1/apps/digits/predict", content=body, headers={"content-type": "application/json"})
            dt = (time.perf_counter() - t0) * 1000
            assert r.status_code == 200, r.text
            if i >= 20:  # the first calls fill the cache and warm the clients
                hits.append(dt)
    return hits


def _report(hits: list[float], steps: list[Step], repeat: int) -> dict[str, Any]:
    """The report's summary: the cache-hit percentiles and the first overload step, plus every
    repetition and their totals when there are several, since lateness varies run to run."""
    report: dict[str, Any] = {
        "cache_hit_ms": {**percentiles(hits, (50, 99)), "n": len(hits)},
        "overload": steps[0].summary,
    }
    summaries = [st.summary for st in steps]
    if repeat > 1:
        keys = ("answered", "default", "refused_503", "lost", "max_wait_ms", "over_slo_plus_20ms",
                "over_slo_plus_20ms_from_send", "over_slo_plus_20ms_send_to_arrival", "max_send_to_arrival_ms",
                "over_limit")
        report["overload_repetitions"] = [{k: o[k] for k in keys} for o in summaries]
        report["overload_all"] = {
            "callers": sum(o["answered"] + o["default"] + o["error"] + o["lost"] for o in summaries),
            "over_slo_plus_20ms": sum(o["over_slo_plus_20ms"] for o in summaries),
            "over_slo_plus_20ms_from_send": sum(o["over_slo_plus_20ms_from_send"] for o in summaries),
            "over_slo_plus_20ms_send_to_arrival": sum(o["over_slo_plus_20ms_send_to_arrival"] for o in summaries),
            "max_send_to_arrival_ms": max(o["max_send_to_arrival_ms"] for o in summaries),
            "max_wait_ms": max(o["max_wait_ms"] for o in summaries)}
    return report


def _say_report(report: dict[str, Any], steps: list[Step], repeat: int) -> None:
    """The closing lines: the cache hit, each overload step, and with repetitions their totals."""
    say(f"cache hit: p50 {report['cache_hit_ms']['p50']:.2f} ms, p99 {report['cache_hit_ms']['p99']:.2f} ms")
    for rep, o in enumerate(st.summary for st in steps):
        say(f"overload{f' #{rep + 1}' if repeat > 1 else ''}: offered {o['offered_qps']:.0f} q/s, answered "
            f"{o['answered']}, defaults {o['default']}, 503s {o['refused_503']}, other errors {o['other_errors']}, "
            f"lost {o['lost']}; longest wait {o['max_wait_ms']:.1f} ms ({o['over_slo_plus_20ms']} callers over "
            f"SLO + 20 ms; {o['over_slo_plus_20ms_from_send']} counting from the send, "
            f"{o['over_slo_plus_20ms_send_to_arrival']} from the send to the answer's arrival at the socket, "
            f"longest {o['max_send_to_arrival_ms']:.1f} ms)")
    if "overload_all" in report:
        a = report["overload_all"]
        say(f"overload, {repeat} steps: {a['over_slo_plus_20ms']} of {a['callers']} callers over SLO + 20 ms "
            f"({a['over_slo_plus_20ms_from_send']} counting from the send; "
            f"{a['over_slo_plus_20ms_send_to_arrival']} from the send to the answer's arrival at the socket, "
            f"longest {a['max_send_to_arrival_ms']:.1f} ms), longest wait {a['max_wait_ms']:.1f} ms")


def _plot(hits: list[float], steps: list[Step], args: argparse.Namespace) -> None:
    """The cache-hit round trips, and every overload step's waits timed two ways against SLO + 20 ms."""
    fig, axes = figure(1, 2)
    axes[0][0].hist(hits, bins=60)
    axes[0][0].set_xlabel("cache-hit round trip (ms), one caller")
    # every step: from when each query was due, and from its send to the answer's arrival
    due, arrival = np.concatenate([st.waited for st in steps]), np.concatenate([st.to_arrival for st in steps])
    bins = np.linspace(0.0, max(float(due.max(initial=0.0)), float(arrival.max(initial=0.0)), 1.0), 61)
    axes[0][1].hist(due, bins=bins, color="tab:orange", alpha=0.7, label="from when due, to the generator's read")
    axes[0][1].hist(arrival, bins=bins, color="tab:blue", alpha=0.5, label="from the send, to the arrival at its socket")
    axes[0][1].axvline(args.slo_ms + 20, color="k", ls="--", label="SLO + 20 ms")
    axes[0][1].set_xlabel(f"wait under {args.rate:.0f} q/s offered (ms)" + (f", {args.repeat} steps" if args.repeat > 1 else ""))
    axes[0][1].legend()
    save_figure(fig, "gateway")


@dataclass
class Step:
    """One overload step: its figures, and every answered caller's wait from when its query was
    due and from its send to the answer's arrival at the generator's socket (ms)."""

    summary: dict[str, Any]
    waited: np.ndarray
    to_arrival: np.ndarray


def _overload(pipe: Pipeline, args: argparse.Namespace, rep: int) -> Step:
    """One open-loop step above capacity: how long every caller waited, and who waited too long."""
    say(f"overload{f' #{rep + 1}' if args.repeat > 1 else ''}: Poisson {args.rate:.0f} q/s for "
        f"{args.seconds:.0f}s with fresh inputs, SLO {args.slo_ms:.0f} ms")
    times = arrival_times(args.rate, 1.0, args.seconds, seed=1 + rep)
    bodies = json_bodies(unique_inputs(len(times), seed=3 + 100 * rep))
    procs = pipe.processes()
    cpu0 = cpu_snapshot(procs)
    with raised_priority(args.generator_nice) if args.generator_nice else nullcontext(None) as nice:
        if args.generator_nice and nice is None:
            say(f"  the generator's priority could not be raised to nice {args.generator_nice} (needs root or "
                "CAP_SYS_NICE): its own lag on the shared cores counts in 'from when due'")
        run = run_gateway(pipe.url, "digits", bodies, times, progress=say)
    cpu = cpu_delta(cpu0, cpu_snapshot(procs))
    summary = run.summary(args.slo_ms)
    done = [r for r in run.results if r.recv_us]
    waited = np.array([r.latency_ms for r in done])
    over = [r for r in done if r.latency_ms > args.slo_ms + 20]
    return Step({
        **{k: summary[k] for k in ("offered_qps", "throughput_qps", "goodput_qps", "answered", "default", "error", "lost")},
        # the contract's answer to overload: 503 with Retry-After; anything else is a failure
        "refused_503": sum(r.status == 503 for r in run.results),
        "other_errors": sum(r.outcome == "error" and r.status != 503 for r in run.results),
        "max_wait_ms": float(waited.max()) if waited.size else float("nan"),
        "generator_nice": nice,
        "over_slo_plus_20ms": len(over),
        # the same from when the generator really sent: without its own lag on the shared cores
        "over_slo_plus_20ms_from_send": sum((r.recv_us - r.sent_us) / 1000 > args.slo_ms + 20 for r in done),
        # and to when the answer reached the generator's socket (the kernel's stamp), without the
        # delay of the generator's own loop in reading it: what the system made the caller wait
        "over_slo_plus_20ms_send_to_arrival": sum(
            (r.arrived_us - r.sent_us) / 1000 > args.slo_ms + 20 for r in done if r.arrived_us),
        "max_send_to_arrival_ms": max(((r.arrived_us - r.sent_us) / 1000 for r in done if r.arrived_us),
                                      default=float("nan")),
        "stamped": sum(bool(r.arrived_us) for r in done),
        "generator_read_delay_ms": _read_delay([r for r in done if r.arrived_us]),
        "latency_ms": summary["latency_ms"],
        "generator_cpu_share": summary["generator_cpu_share"],
        "cpu_cores": {k: round(v / max(1e-9, run.wall_s), 3) for k, v in sorted(cpu.items(), key=lambda kv: -kv[1])},
        # where the callers over SLO + 20 ms lost their time: before the generator sent
        # (its own lag), inside the gateway's handler (server_ms), or around it (accept
        # queue, HTTP parsing and writing, the client's loop)
        "over_limit": _over_limit(over),
    }, waited, np.array([(r.arrived_us - r.sent_us) / 1000 for r in done if r.arrived_us]))


def _read_delay(done: list[Any]) -> dict[str, float]:
    """How long answers sat in the generator's socket before its loop read them."""
    d = np.array([(r.recv_us - r.arrived_us) / 1000 for r in done])
    if not d.size:
        return {}
    return {"p50": round(percentile(d, 50), 2), "p99": round(percentile(d, 99), 2), "max": round(float(d.max()), 2)}


def _over_limit(over: list[Any]) -> dict[str, Any]:
    if not over:
        return {"n": 0}
    lag = np.array([(r.sent_us - r.sched_us) / 1000 for r in over])
    server = np.array([r.server_ms for r in over if r.server_ms == r.server_ms])
    around = np.array([r.latency_ms - (r.sent_us - r.sched_us) / 1000 - r.server_ms
                       for r in over if r.server_ms == r.server_ms])
    med = (lambda a: round(percentile(a, 50), 1) if a.size else None)
    return {"n": len(over), "by_outcome": dict(Counter(r.outcome for r in over)),
            "send_lag_ms_p50": med(lag), "server_ms_p50": med(server), "around_handler_ms_p50": med(around),
            "read_delay_ms_p50": med(np.array([(r.recv_us - r.arrived_us) / 1000 for r in over if r.arrived_us]))}


if __name__ == "__main__":
    main()
