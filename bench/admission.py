"""Admission control at loads it must not refuse: a straggler ensemble, and light load.

* straggler: an Exp4 app of four python models, one of which stalls STALL_MS on the batches
  holding a flagged input (STALL_SHARE of the calls), called by CALLERS closed-loop callers with
  a STRAGGLER_SLO_MS SLO. The straggler cutoff answers every call on time from the three others,
  so the gateway should refuse none of them: the callers never have more than CALLERS in flight.
  The same app is then offered STRAGGLER_RATE q/s of Poisson arrivals (bursts above CALLERS).
* light: the simulated accelerator (Clockwork's ResNet-50 table) at LIGHT_RATE q/s of Poisson
  arrivals through the gateway, a fraction of what it serves, with a LIGHT_SLO_MS SLO.

Reported: the 503 refusals (with the gateway's reasons), defaults, answers past the SLO, and for
the straggler how many flagged calls named it missing.

    .venv/bin/python -m bench.admission [--calls 400] [--seconds 8]   # out/bench/admission.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import Pipeline, say, wait_warm, warm_up, write_app_file, write_json
from bench.load import arrival_times, json_bodies, unique_inputs
from bench.load_http import run_gateway
from bench.machine import machine_info
from frontend.dashboard.series import parse

CALLERS, STALL_MS, STALL_SHARE, STRAGGLER_SLO_MS = 4, 250.0, 0.3, 100.0
STRAGGLER_RATE = 40.0
LIGHT_RATE, LIGHT_SLO_MS = 200.0, 50.0


def build(root: Path) -> Path:
    from clipstream.testing.models import make_profile_model, make_stalling_model

    models = [{"name": f"fast{k}", "path": str(make_stalling_model(root / "models", f"fast{k}")),
               "latency_objective_ms": 10, "batch_delay_ms": 1} for k in range(3)]
    models.append({"name": "slow", "path": str(make_stalling_model(root / "models", "slow", STALL_MS)),
                   "latency_objective_ms": 10, "batch_delay_ms": 1})
    models.append({"name": "accel", "path": str(make_profile_model(root / "models", "accel")),
                   "latency_objective_ms": 9.5, "batch_delay_ms": 1})
    apps = [{"name": "strag", "policy": "exp4", "slo_ms": STRAGGLER_SLO_MS, "default_output": -1,
             "models": ["fast0", "fast1", "fast2", "slow"]},
            {"name": "sim", "policy": "single", "slo_ms": LIGHT_SLO_MS, "default_output": -1, "models": ["accel"]}]
    return write_app_file(root / "app.yaml", apps, models)


def straggler_step(pipe: Pipeline, calls: int) -> dict[str, Any]:
    from clipstream.testing.callers import closed_loop, tally

    say(f"straggler: {CALLERS} closed-loop callers, {calls} calls, SLO {STRAGGLER_SLO_MS:g} ms, "
        f"{STALL_SHARE:.0%} of calls meet a {STALL_MS:g} ms stall")
    got = closed_loop(pipe.url, "strag", callers=CALLERS, calls_each=max(1, calls // CALLERS),
                      stall_share=STALL_SHARE, seed=11)
    out = tally(got, STRAGGLER_SLO_MS, "slow")
    out["admission_limit_after"] = admission_limit(pipe.url)
    return out


def straggler_open_step(pipe: Pipeline, seconds: float) -> dict[str, Any]:
    """The same app under Poisson arrivals: bursts put more than CALLERS in flight now and then,
    which a limit cut to its floor by the cutoff's answers refuses."""
    from clipstream.testing.callers import flagged_input

    say(f"straggler, open loop: {STRAGGLER_RATE:g} q/s Poisson for {seconds:g} s, SLO {STRAGGLER_SLO_MS:g} ms")
    times = arrival_times(STRAGGLER_RATE, 1.0, seconds, seed=9)
    rng = np.random.default_rng(13)
    bodies = [json.dumps({"input": flagged_input(i, STALL_SHARE, rng)[0]}).encode() for i in range(len(times))]
    run = run_gateway(pipe.url, "strag", bodies, times)
    s = run.summary(STRAGGLER_SLO_MS)
    refused = [r for r in run.results if r.status == 503]
    return {"calls": len(times), "refused_503": len(refused), "refusal_reasons": run.refusal_reasons(),
            "answered": s["answered"], "defaults": s["default"], "lost": s["lost"], "p99_ms": s["latency_ms"]["p99"],
            "admission_limit_after": admission_limit(pipe.url)}


def admission_limit(url: str) -> float:
    """The gateway's learnt limit, from its metrics."""
    import httpx

    return limit_in(httpx.get(f"{url}/metrics", timeout=10).text)


def limit_in(metrics_text: str) -> float:
    """``clipstream_gateway_admission_limit`` from a ``/metrics`` page (nan: not there)."""
    return next((v for name, _, v in parse(metrics_text) if name == "clipstream_gateway_admission_limit"),
                float("nan"))


def admission_cuts(url: str) -> dict[str, float]:
    """The gateway's cuts of its admission limit so far, by cause; {} where there is no such
    gateway (another server under the same load)."""
    import httpx

    try:
        return cuts_in(httpx.get(f"{url}/metrics", timeout=10).text)
    except httpx.HTTPError:
        return {}


def cuts_in(metrics_text: str) -> dict[str, float]:
    """``clipstream_gateway_admission_cuts_total`` by cause, from a ``/metrics`` page."""
    return {labels["cause"]: v for name, labels, v in parse(metrics_text)
            if name == "clipstream_gateway_admission_cuts_total"}


def light_step(pipe: Pipeline, seconds: float) -> dict[str, Any]:
    say(f"light: {LIGHT_RATE:g} q/s Poisson for {seconds:g} s on the simulated accelerator, SLO {LIGHT_SLO_MS:g} ms")
    times = arrival_times(LIGHT_RATE, 1.0, seconds, seed=5)
    run = run_gateway(pipe.url, "sim", json_bodies(unique_inputs(len(times), seed=17)), times)
    s = run.summary(LIGHT_SLO_MS)
    refused = [r for r in run.results if r.status == 503]
    return {"calls": len(times), "refused_503": len(refused), "refusal_reasons": run.refusal_reasons(),
            "answered": s["answered"], "defaults": s["default"], "lost": s["lost"],
            "p50_ms": s["latency_ms"]["p50"], "p99_ms": s["latency_ms"]["p99"]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--calls", type=int, default=400, help="straggler calls in all (default 400)")
    ap.add_argument("--seconds", type=float, default=8.0, help="light-load step length (default 8)")
    ap.add_argument("--warm-up-s", type=float, default=10.0, help="discarded light-load step first")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-admission-") as tmp:
        # no prediction cache: a hit would skip the straggler
        with Pipeline(build(Path(tmp)), env={"CLIPSTREAM_BATCHER_CACHE": "false"}) as pipe:
            body = json_bodies(unique_inputs(1))[0]
            for app in ("strag", "sim"):
                wait_warm(pipe.url, app, body)
            warm_up(pipe, "sim", mode="gateway", seconds=args.warm_up_s)
            report = {"straggler": straggler_step(pipe, args.calls),
                      "straggler_open": straggler_open_step(pipe, args.seconds), "light": light_step(pipe, args.seconds)}
    st, li = report["straggler"], report["light"]
    say(f"straggler: {st['refused_503']} of {st['calls']} refused {st['refusal_reasons']}, "
        f"{st['defaults']} defaults, {st['over_slo']} past the SLO (p99 {st['p99_ms']} ms); "
        f"{st['flagged_naming_straggler']} of {st['flagged_answered']} flagged answers name the straggler missing; "
        f"limit after {st['admission_limit_after']:g}")
    so = report["straggler_open"]
    say(f"straggler, open loop: {so['refused_503']} of {so['calls']} refused {so['refusal_reasons']}, "
        f"{so['defaults']} defaults, p99 {so['p99_ms']} ms; limit after {so['admission_limit_after']:g}")
    say(f"light: {li['refused_503']} of {li['calls']} refused {li['refusal_reasons']}, {li['defaults']} defaults, p99 {li['p99_ms']} ms")
    write_json("admission", {"machine": machine_info(), "settings": {
        "callers": CALLERS, "stall_ms": STALL_MS, "stall_share": STALL_SHARE, "straggler_slo_ms": STRAGGLER_SLO_MS,
        "straggler_rate_qps": STRAGGLER_RATE,
        "light_rate_qps": LIGHT_RATE, "light_slo_ms": LIGHT_SLO_MS, **vars(args)}, "summary": report})
    return report


if __name__ == "__main__":
    main()
