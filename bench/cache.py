"""The prediction cache: feedback processing with and without it, and the hit path's latency.

Clipper (4.2) needs every model's prediction for a query when its feedback arrives; with the
cache those are looked up, without it the models run again ("1.6x more feedback per second with
the cache, 6K -> 11K observations/s"). Here an Exp4 app over four ONNX digits models:
1. feedback as Clipper processes it: the feedback's query goes through the models again.
   Without the cache (fresh inputs: every model evaluates) vs with it (the same inputs again:
   every batcher answers from Redis); both closed loop (a fixed number of queries in flight,
   long SLO), so the answered rate is the capacity;
2. clipstream's own feedback path: the selector stored each answer's per-model predictions, so
   the learner joins feedback with them and calls observe, with no model evaluation; its rate
   is measured by publishing feedback for answered queries and timing the policy's n_observed;
3. the hit path's latency at a moderate rate, misses vs hits.

Step 1 runs twice: with the ONNX models (they compute in ~15 us, so re-evaluating costs only the
pipeline's own work and the cache has little to save), and with the simulated accelerator of
``bench.efficiency`` (Clockwork's ResNet-50 table at 1/8 speed), a model whose evaluation costs
device time, as Clipper's models did.

    .venv/bin/python -m bench.cache [--quick]      # out/bench/cache.json and .png
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import load
from bench.load_kafka import KafkaLoad
from bench.common import OUT, Pipeline, figure, load_step, save_figure, say, wait_warm, write_app_file, write_json
from bench.machine import machine_info

MODELS = 4
CONCURRENCY = 32
LONG_SLO_MS = 1000.0
LAT_RATE, LAT_SLO_MS = 40.0, 50.0


ACCEL_SPEED = 1 / 8


def build(root: Path, kind: str = "onnx") -> Path:
    from clipstream.testing.models import CLOCKWORK, make_onnx_digits_model, make_profile_model

    def make(k: int) -> Path:
        if kind == "onnx":
            return make_onnx_digits_model(root / "models", f"l{k}")
        return make_profile_model(root / "models", f"l{k}", table=CLOCKWORK, speed=ACCEL_SPEED)

    objective = 10 if kind == "onnx" else 100
    models = [{"name": f"l{k}", "path": str(make(k)), "latency_objective_ms": objective, "batch_delay_ms": 1}
              for k in range(MODELS)]
    return write_app_file(root / "app.yaml", [{"name": "ens", "policy": "exp4", "slo_ms": LAT_SLO_MS,
                                               "default_output": -1, "models": [m["name"] for m in models]}], models)


def capacity(pipe: Pipeline, kl: Any, inputs: Any, duration: float, label: str) -> dict[str, Any]:
    """Closed loop (CONCURRENCY in flight, long SLO): answers per second, CPU per query."""
    from bench.machine import cpu_delta, cpu_snapshot

    procs = pipe.processes()
    c0 = cpu_snapshot(procs)
    run = kl.run_closed("ens", load.tensors(inputs), duration, LONG_SLO_MS, CONCURRENCY)
    cpu = cpu_delta(c0, cpu_snapshot(procs))
    s = run.summary(LONG_SLO_MS, 0.0)
    n = max(1, s["sent"])
    s["answered_qps"] = s["answered"] / duration
    s["cpu_ms_per_query"] = {k: round(v * 1000 / n, 3) for k, v in sorted(cpu.items(), key=lambda kv: -kv[1])}
    s["_run"] = run
    say(f"  {label}: {s['answered_qps']:.1f} answered/s (p50 {s['latency_ms']['p50']:.1f} ms, "
        f"p99 {s['latency_ms']['p99']:.1f} ms, defaults {s['default']})")
    return s


def misses_then_hits(pipe: Pipeline, kl: Any, duration: float, kind: str, seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Step 1: answers/s re-evaluating fresh inputs, then the same inputs again (all cache
    hits). The hits' summary keeps its ``_run`` (the learner replays it); the misses' does not."""
    fresh = load.unique_inputs(int(2000 * duration), seed=seed)
    say(f"cache ({kind}): re-evaluation without the cache (fresh inputs), {CONCURRENCY} in flight")
    miss = capacity(pipe, kl, fresh, duration, f"{kind} misses")
    say(f"cache ({kind}): the same inputs again (every model answers from the cache)")
    hit = capacity(pipe, kl, fresh[: miss["sent"]], duration, f"{kind} hits")
    miss.pop("_run")
    return miss, hit


def reevaluation(duration: float, kind: str) -> dict[str, Any]:
    """Step 1 alone, on its own pipeline of ``kind`` models: answers/s without and with the cache."""
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as tmp, Pipeline(build(Path(tmp), kind)) as pipe:
        wait_warm(pipe.url, "ens", load.json_bodies(load.unique_inputs(1))[0])
        kl = KafkaLoad(pipe.settings(), keep_trace=False)
        try:
            miss, hit = misses_then_hits(pipe, kl, duration, kind, seed=54321)
        finally:
            kl.close()
    hit.pop("_run")
    speedup = round(hit["answered_qps"] / max(1e-9, miss["answered_qps"]), 2)
    say(f"  cache ({kind}): x{speedup}")
    return {"without_cache": miss, "with_cache": hit, "speedup": speedup}


def learner_rate(pipe: Pipeline, run: Any, timeout_s: float = 60.0) -> dict[str, Any]:
    """Publish feedback for every answered query of ``run``; time until the learner observed them."""
    import redis

    from frontend.producer import Producer
    from selector.store import state_key

    r = redis.Redis.from_url(pipe.redis)

    def observed() -> int:
        raw = r.get(state_key("ens", None))
        return int(json.loads(raw).get("n_observed", 0)) if raw else 0

    ids = [o.query_id for o in run.results if o.outcome == "answered"]
    before = observed()
    t0 = time.monotonic()
    with Producer(settings=pipe.settings()) as prod:
        for i, qid in enumerate(ids):
            prod.send_feedback("ens", qid, label=i % 10)
        prod.flush(30)
    sent_s = time.monotonic() - t0
    while observed() - before < len(ids) and time.monotonic() - t0 < timeout_s:
        time.sleep(0.05)
    took = time.monotonic() - t0
    done = observed() - before
    return {"feedback": len(ids), "observed": done, "seconds": round(took, 3), "publish_s": round(sent_s, 3),
            "observations_per_s": round(done / max(1e-9, took), 1)}


def main(argv: list[str] | None = None, out_dir: Path = OUT) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    duration = 4.0 if args.quick else 8.0
    report: dict[str, Any] = {"machine": machine_info(), "settings": {
        "models": f"{MODELS} ONNX digits logreg, Exp4", "closed_loop_in_flight": CONCURRENCY, "capacity_slo_ms": LONG_SLO_MS,
        "step_s": duration, "latency_rate_qps": LAT_RATE, "latency_slo_ms": LAT_SLO_MS, "mode": "kafka"}}
    accel = reevaluation(duration, "accel")
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as tmp:
        with Pipeline(build(Path(tmp))) as pipe:
            wait_warm(pipe.url, "ens", load.json_bodies(load.unique_inputs(1))[0])
            kl = KafkaLoad(pipe.settings(), keep_trace=False)
            try:
                miss, hit = misses_then_hits(pipe, kl, duration, "onnx", seed=12345)
                say("cache: clipstream's learner (feedback joined with stored predictions)")
                learn = learner_rate(pipe, hit.pop("_run"))
                say(f"    {learn}")
                say("cache: latency at a moderate rate, misses then hits")
                lat_in = load.unique_inputs(int(LAT_RATE * duration * 1.5) + 10, seed=777)
                lat_miss = load_step(pipe, "ens", LAT_RATE, LAT_SLO_MS, duration, kafka_load=kl, inputs=lat_in,
                                     seed=9, label="miss path ")
                lat_hit = load_step(pipe, "ens", LAT_RATE, LAT_SLO_MS, duration, kafka_load=kl, inputs=lat_in,
                                    seed=9, label="hit path ")
                lat_miss.pop("_run"), lat_hit.pop("_run")
            finally:
                kl.close()
    ratio = hit["answered_qps"] / max(1e-9, miss["answered_qps"])
    report.update(capacity_without_cache=miss, capacity_with_cache=hit, learner=learn,
                  latency_miss=lat_miss, latency_hit=lat_hit, accelerator=accel)
    report["summary"] = {
        "reevaluation_qps_without_cache": round(miss["answered_qps"], 1),
        "reevaluation_qps_with_cache": round(hit["answered_qps"], 1),
        "cache_speedup": round(ratio, 2), "paper": "1.6x (6K -> 11K observations/s)",
        "accelerator_reevaluation_qps": [accel["without_cache"]["answered_qps"], accel["with_cache"]["answered_qps"]],
        "accelerator_cache_speedup": accel["speedup"],
        "learner_observations_per_s": learn["observations_per_s"],
        "hit_path_ms": {k: lat_hit["latency_ms"][k] for k in ("p50", "p99")},
        "miss_path_ms": {k: lat_miss["latency_ms"][k] for k in ("p50", "p99")},
    }
    say(f"  cache: {report['summary']}")
    write_json("cache", report, out_dir)
    fig, axes = figure(1, 2)
    ax = axes[0][0]
    labels = ["ONNX\nno cache", "ONNX\ncache hits", "accelerator\nno cache", "accelerator\ncache hits",
              "learner\n(stored)"]
    vals = [miss["answered_qps"], hit["answered_qps"], accel["without_cache"]["answered_qps"],
            accel["with_cache"]["answered_qps"], learn["observations_per_s"]]
    ax.bar(labels, vals, color=["tab:red", "tab:green", "tab:red", "tab:green", "tab:blue"])
    ax.set_yscale("log")
    ax.set_ylabel("feedback processed per second")
    ax = axes[0][1]
    qs = ["p50", "p90", "p99"]
    ax.plot(qs, [lat_miss["latency_ms"][q] for q in qs], "o-", label="miss path")
    ax.plot(qs, [lat_hit["latency_ms"][q] for q in qs], "o-", label="hit path")
    ax.set_ylabel("latency (ms)")
    ax.legend()
    save_figure(fig, "cache", out_dir)
    return report


if __name__ == "__main__":
    main()
