"""Where a query's time and CPU go: latency split by stage from the trace stamps, CPU per process.

Every record carries trace stamps (epoch us): ``produced`` (the query made: through the
gateway, when the server began reading the request, as its deadline counts), ``dispatched``
(selector), ``batcher_in``/``batched`` (batcher), ``worker_in``/``worker_out`` (worker) and
``joined`` (selector); the selector copies the stamps of the last prediction that reached the
join into the Response. With the generator's own send and receive times, a query's latency
splits into:

    gateway             produced - sent       (REST only: the request's bytes reaching the server)
    queries hop         dispatched - produced (Kafka hop, selector decode + select; through the
                                               gateway: + its body read, parse, encode, produce)
    requests hop        batcher_in - dispatched
    batcher             batched - batcher_in  (cache lookup, deadline queue, delayed batching)
    batches hop         worker_in - batched   (Kafka hop, and waiting behind a batch in flight)
    model service       worker_out - worker_in
    predictions + join  joined - worker_out   (Kafka hop, selector decode + combine)
    reply               received - joined     (Kafka hop back; through the gateway: + its reply
                                               thread, the event loop, HTTP out)

Through the gateway, the Responses are read from the gateway's own reply topic (its instance is
pinned by ``bench.common.Pipeline``) and matched by query id. Straight into Kafka, the
generator's private reply topic stamps each Response with the broker's append time
(``LogAppendTime``, 1 ms resolution), which splits ``reply`` into ``reply: to broker`` (the
selector's producer and the broker's request queue) and ``reply: from broker`` (the fetch and
the generator's consumer). CPU per query per process comes from /proc (utime + stime) over
each step.

    .venv/bin/python -m bench.breakdown [--quick]      # out/bench/breakdown.json and .png
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from bench import load
from bench.load_kafka import KafkaLoad
from bench.common import OUT, Pipeline, figure, load_step, save_figure, say, wait_warm, write_app_file, write_json
from bench.machine import machine_info
from bench.stats import percentiles
from bench.tap import Tap
from schemas import Predictions, Record, Response

SEGMENTS: list[tuple[str, str, str]] = [
    ("gateway", "sent", "produced"),
    ("queries hop", "produced", "dispatched"),
    ("requests hop", "dispatched", "batcher_in"),
    ("batcher", "batcher_in", "batched"),
    ("batches hop", "batched", "worker_in"),
    ("model service", "worker_in", "worker_out"),
    ("predictions + join", "worker_out", "joined"),
    ("reply", "joined", "received"),
]
# a one-model app's query through the gateway, which skips the selector (docs/design/0083):
# the gateway's request to the batcher, and the prediction's hop back to the gateway
STRAIGHT: list[tuple[str, str, str]] = [
    SEGMENTS[0], ("requests hop", "produced", "batcher_in"), *SEGMENTS[3:6], ("predictions hop", "worker_out", "received"),
]
# the two halves of ``reply``, where the Response carries the broker's append time
REPLY_SPLIT: list[tuple[str, str, str]] = [
    ("reply: to broker", "joined", "_reply_appended"),
    ("reply: from broker", "_reply_appended", "received"),
]
SLO_MS = 50.0


def split(trace: dict[str, int], sent_us: int, recv_us: int) -> dict[str, float] | None:
    """Milliseconds per segment of one query, None when a stamp is missing."""
    t = {**{k: v for k, v in trace.items() if not k.startswith("_")}, "sent": sent_us, "received": recv_us}
    segments = SEGMENTS if "dispatched" in t else STRAIGHT
    if not all(k in t for _, a, b in segments for k in (a, b)):
        return None
    if "_reply_appended" in trace:
        t["_reply_appended"], segments = trace["_reply_appended"], SEGMENTS + REPLY_SPLIT
    return {name: (t[b] - t[a]) / 1000.0 for name, a, b in segments}


def parts_of(results: Any, traces: Mapping[str, dict[str, int]] | None = None) -> list[dict[str, float]]:
    """The split of every answered query with all its stamps. Straight into Kafka (``traces``
    None) the Response carries the trace and the generator's send is its ``produced``; through
    the gateway the trace comes from the reply topic by query id and the send is the caller's."""
    parts = []
    for r in results:
        if r.outcome != "answered":
            continue
        if traces is None:
            p = split(r.trace, r.trace.get("produced", r.sent_us), r.recv_us) if r.trace else None
        else:
            p = split(traces.get(r.query_id, {}), r.sent_us, r.recv_us)
        if p is not None:
            parts.append(p)
    return parts


def table(parts: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per segment: median, mean, p99 (ms) over the queries (the reply's halves where every
    query has them)."""
    out = {}
    names = [n for n, _, _ in (SEGMENTS if not parts or "queries hop" in parts[0] else STRAIGHT)]
    if parts and all(n in p for p in parts for n, _, _ in REPLY_SPLIT):
        names += [n for n, _, _ in REPLY_SPLIT]
    for name in names:
        v = np.array([p[name] for p in parts], dtype=np.float64)
        pct = percentiles(v, (50, 99))
        out[name] = {"p50": pct["p50"], "mean": float(v.mean()) if v.size else float("nan"), "p99": pct["p99"]}
    return out


def reply_tap(settings: Any, instance: str, traces: dict[str, dict[str, int]]) -> Tap:
    """Reads the gateway's reply topic into ``traces``: query id -> the trace of its Response,
    or of its Prediction for a query its one model answered straight."""
    from topics.catalogue import Catalogue

    def on(rec: Record, msg: Any, arrived_us: int) -> None:
        if isinstance(rec, Response):
            traces[rec.query_id] = dict(rec.trace)
        elif isinstance(rec, Predictions):
            for item in rec.items:
                traces[item.query_id] = dict(item.trace)

    return Tap(settings, [Catalogue.from_settings(settings).replies(instance)],
               group=f"bench-tap-{instance}").start(on)


def build(root: Path) -> Path:
    from clipstream.testing.models import make_onnx_digits_model, make_profile_model

    onnx = make_onnx_digits_model(root / "models", "logreg")
    ens = [make_onnx_digits_model(root / "models", f"e{k}") for k in range(5)]
    sim = make_profile_model(root / "models", "accel")
    models = [{"name": "logreg", "path": str(onnx), "latency_objective_ms": 5, "batch_delay_ms": 1},
              {"name": "accel", "path": str(sim), "latency_objective_ms": 9.5, "batch_delay_ms": 1}]
    models += [{"name": f"e{k}", "path": str(p), "latency_objective_ms": 5, "batch_delay_ms": 1} for k, p in enumerate(ens)]
    return write_app_file(root / "app.yaml", [
        {"name": "digits", "policy": "single", "slo_ms": SLO_MS, "default_output": -1, "models": ["logreg"]},
        {"name": "sim", "policy": "single", "slo_ms": SLO_MS, "default_output": -1, "models": ["accel"]},
        {"name": "ens5", "policy": "exp4", "slo_ms": SLO_MS, "default_output": -1, "models": [f"e{k}" for k in range(5)]},
    ], models)


def main(argv: list[str] | None = None, out_dir: Path = OUT) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    duration = 4.0 if args.quick else 10.0
    cases = [("digits", "kafka", 100.0), ("digits", "gateway", 100.0), ("sim", "kafka", 100.0),
             ("ens5", "kafka", 40.0)]
    if not args.quick:
        cases += [("digits", "kafka", 250.0), ("ens5", "kafka", 70.0)]
    report: dict[str, Any] = {"machine": machine_info(), "settings": {
        "slo_ms": SLO_MS, "step_s": duration, "segments": [s[0] for s in SEGMENTS], "cases": cases}, "cases": {}}
    with tempfile.TemporaryDirectory(prefix="bench-breakdown-") as tmp:
        with Pipeline(build(Path(tmp))) as pipe:
            body = load.json_bodies(load.unique_inputs(1))[0]
            for app in ("digits", "sim", "ens5"):
                wait_warm(pipe.url, app, body)
            kl = KafkaLoad(pipe.settings(), keep_trace=True)
            traces: dict[str, dict[str, int]] = {}
            tap = reply_tap(pipe.settings(), Pipeline.GATEWAY_INSTANCE, traces)
            try:
                for i, (app, mode, rate) in enumerate(cases):
                    step = load_step(pipe, app, rate, SLO_MS, duration, mode=mode, kafka_load=kl, seed=i + 1,
                                     label=f"{app} ")
                    run = step.pop("_run")
                    parts = parts_of(run.results, traces if mode == "gateway" else None)
                    step["breakdown_ms"] = table(parts)
                    step["traced_queries"] = len(parts)
                    report["cases"][f"{app}/{mode}/{rate:g}"] = step
                    say("    " + "  ".join(f"{k} {v['p50']:.2f}" for k, v in step["breakdown_ms"].items())
                        + f"  (medians, ms, {len(parts)} queries)")
                    say("    CPU ms/query: " + ", ".join(f"{k} {v}" for k, v in step["cpu_ms_per_query"].items()))
            finally:
                tap.close()
                kl.close()
    write_json("breakdown", report, out_dir)
    _plot(report, out_dir)
    return report


def _plot(report: dict[str, Any], out_dir: Path) -> None:
    """Each case's mean time per segment, and its CPU per query by process, as stacked bars."""
    fig, axes = figure(1, 2, size=(14, 5))
    keys = list(report["cases"])
    ax = axes[0][0]
    bottom = np.zeros(len(keys))
    for name, _, _ in SEGMENTS:
        vals = np.array([report["cases"][k]["breakdown_ms"][name]["mean"] for k in keys])
        vals = np.nan_to_num(vals)
        ax.bar(keys, vals, bottom=bottom, label=name)
        bottom += vals
    ax.set_ylabel("mean ms per answered query")
    ax.tick_params(axis="x", rotation=20, labelsize=7)
    ax.legend(fontsize=7)
    ax = axes[0][1]
    procs = sorted({p for k in keys for p in report["cases"][k]["cpu_ms_per_query"]})
    bottom = np.zeros(len(keys))
    for p in procs:
        vals = np.array([report["cases"][k]["cpu_ms_per_query"].get(p, 0.0) for k in keys])
        if vals.max() < 0.05:
            continue
        ax.bar(keys, vals, bottom=bottom, label=p)
        bottom += vals
    ax.set_ylabel("CPU ms per query")
    ax.tick_params(axis="x", rotation=20, labelsize=7)
    ax.legend(fontsize=7)
    save_figure(fig, "breakdown", out_dir)


if __name__ == "__main__":
    main()
