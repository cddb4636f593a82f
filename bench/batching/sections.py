"""The benchmark's sections: throughput, adapt, delayed, cache and cost (see ``bench.batching``).

Each runs its runs on a started ``Bench`` and puts its figures under its key of the report.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bench.batching.bounds import delay_gain, end_to_end_bound
from bench.batching.helpers import (
    OBJECTIVE_MS,
    best_of,
    device_max,
    fmt_ms,
    fmt_ratio as _r,
    latency_fn,
    log,
    ratio as _ratio,
    sweep_sizes,
)
from bench.batching.runner import Bench, Model, RunResult
from bench.stats import percentiles
from clipstream.testing.models import (
    CLOCKWORK,
    SVM_FIXED_MS,
    SVM_PER_ITEM_MS,
    make_onnx_digits_model,
    make_profile_model,
)


SATURATED_DEADLINE_MS = 100.0
CONFIRM_ROUNDS = 5  # interleaved (no batching, best fixed, AIMD) rounds after each sweep
DELAYED_ROUNDS = 3  # interleaved rounds of every (dispatch, load, delay) in the delayed section


def models(quick: bool) -> dict[str, Model]:
    return {
        "clockwork": Model("clockwork", "simulated accelerator (Clockwork ResNet-50 table)",
                           lambda root, name: make_profile_model(root, name, table=CLOCKWORK), 800.0),
        "svm": Model("svm", f"high fixed cost ({SVM_FIXED_MS:g} ms/batch + {SVM_PER_ITEM_MS:g} ms/item)",
                     lambda root, name: make_profile_model(root, name, fixed_ms=SVM_FIXED_MS,
                                                           per_item_ms=SVM_PER_ITEM_MS), 1000.0),
        "onnx": Model("onnx", "sklearn digits logistic regression, ONNX Runtime CPU",
                      lambda root, name: make_onnx_digits_model(root, name), 1000.0),
    }


def section_throughput(b: Bench, ms: dict[str, Model], report: dict[str, Any]) -> dict[str, dict[str, RunResult]]:
    q = b.quick
    warm, meas = (1.0, 1.5) if q else (3.0, 3.0)  # the same for every run: start-up transients are real
    out: dict[str, dict[str, RunResult]] = {}
    for kind in b.args.models:
        m = ms[kind]
        log(f"throughput: {m.label}, offered {m.rate_qps * b.args.rate_scale:g} qps open loop, deadline "
            f"{b.args.deadline_ms:g} ms, AIMD's objective {b.aimd_objective_ms:g} ms on the service time")
        runs: dict[str, RunResult] = {}
        sizes: dict[str, int] = {}  # the sweep's labels and their batch sizes
        for size in sweep_sizes(kind, q):
            label = "no batching (1)" if size == 1 else f"fixed {size}"
            sizes[label] = size
            runs[label] = b.run(m, label, fixed=size, warmup_s=warm, measure_s=meas)
        runs["AIMD"] = b.run(m, "AIMD", warmup_s=warm, measure_s=meas, aimd_objective_ms=b.aimd_objective_ms)
        out[kind] = runs
        rows = {k: r.summary for k, r in runs.items()}
        entry: dict[str, Any] = {"label": m.label, "offered_qps_target": m.rate_qps * b.args.rate_scale, "runs": rows,
                                 "aimd_objective_ms": b.aimd_objective_ms}
        if not q:
            entry["confirmed"] = _confirm(b, m, rows, sizes, warm, meas)
        dev = None
        if kind in ("clockwork", "svm"):
            lat = latency_fn(CLOCKWORK) if kind == "clockwork" else latency_fn(fixed_ms=SVM_FIXED_MS,
                                                                               per_item_ms=SVM_PER_ITEM_MS)
            dev = device_max(lat, OBJECTIVE_MS)
            entry["device_max"] = dev
            entry["device_no_batching_qps"] = 1000.0 / lat(1)
        for metric, key in (("goodput", "goodput_qps"), ("ok throughput", "ok_qps")):
            fixed_rows = {k: {"goodput_qps": v[key]} for k, v in rows.items() if k != "AIMD"}
            best_label, best = best_of(fixed_rows, "")
            aimd, none = rows["AIMD"][key], rows["no batching (1)"][key]
            e = {"best_fixed": best_label, "best_fixed_qps": best, "aimd_qps": aimd, "no_batching_qps": none,
                 "aimd_vs_best_fixed": _ratio(best, aimd),
                 "aimd_vs_no_batching": _ratio(none, aimd),
                 "best_fixed_vs_no_batching": _ratio(none, best)}
            if dev is not None:
                e["aimd_vs_device_max"] = aimd / dev["qps"]
                e["best_fixed_vs_device_max"] = best / dev["qps"]
            entry[metric] = e
            log(f"  => {metric}: best fixed {best_label} {best:.0f} qps; AIMD {aimd:.0f} qps "
                f"(x{_r(e['aimd_vs_best_fixed'])} of best fixed, x{_r(e['aimd_vs_no_batching'])} of no batching"
                + (f", x{_r(e['aimd_vs_device_max'])} of device max {dev['qps']:.0f} qps at b={dev['batch_size']})"
                   if dev else ")"))
        if kind == "clockwork" and dev is not None:
            entry["device_kept_busy"] = _saturated(b, m, dev, warm, meas)
            entry["ideal_within_deadline"] = _ideal_bound(lat, dev, rows["AIMD"], b.args.deadline_ms)
        report["throughput"][kind] = entry
    return out


def _confirm(b: Bench, m: Model, rows: Mapping[str, Mapping[str, Any]], sizes: Mapping[str, int],
             warm: float, meas: float) -> dict[str, Any]:
    """AIMD against the sweep's best fixed size and no batching, re-measured in interleaved rounds.

    The sweep runs each size once, in order, and the best of eight noisy runs is biased
    upward (the winner's curse). Runs taken back to back see the same machine, and the
    medians over the rounds, not the sweep's maximum, are what the figures compare.
    """
    best_label = max(sizes, key=lambda label: rows[label]["goodput_qps"])
    arms = {"none": ("no batching (1)", 1), "fixed": (best_label, sizes[best_label]), "aimd": ("AIMD", None)}
    rounds: list[dict[str, float]] = []
    for i in range(CONFIRM_ROUNDS):
        got: dict[str, float] = {}
        for arm, (label, fixed) in arms.items():
            s = b.run(m, f"{label}, round {i + 1}", fixed=fixed, warmup_s=warm, measure_s=meas,
                      aimd_objective_ms=b.aimd_objective_ms).summary
            got[f"{arm}_goodput_qps"], got[f"{arm}_ok_qps"] = s["goodput_qps"], s["ok_qps"]
        rounds.append(got)
    out: dict[str, Any] = {"best_fixed": best_label, "rounds": rounds}
    for metric, key in (("goodput", "goodput_qps"), ("ok throughput", "ok_qps")):
        none, fixed, aimd = (statistics.median(r[f"{arm}_{key}"] for r in rounds) for arm in arms)
        out[metric] = {"no_batching_qps": none, "best_fixed_qps": fixed, "aimd_qps": aimd,
                       "aimd_vs_best_fixed": _ratio(fixed, aimd),
                       "aimd_vs_no_batching": _ratio(none, aimd)}
    g = out["goodput"]
    log(f"  => medians of {CONFIRM_ROUNDS} interleaved rounds: no batching {g['no_batching_qps']:.0f}, "
        f"{best_label} {g['best_fixed_qps']:.0f}, AIMD {g['aimd_qps']:.0f} qps (AIMD x{_r(g['aimd_vs_best_fixed'])} "
        f"of best fixed, x{_r(g['aimd_vs_no_batching'])} of no batching)")
    return out


def _saturated(b: Bench, m: Model, dev: dict[str, Any], warm: float, meas: float) -> dict[str, Any]:
    """How busy the layer keeps the device when there is always work: AIMD's objective stays
    20 ms on the batch's service time (Clipper's reading), offered 1.3x the device's maximum,
    request deadlines loose (100 ms) so the queue never empties (the excess expires). No
    batching is run the same way, for Clipper's ratio of the two throughputs at the objective."""
    rate = 1.3 * dev["qps"]
    r = b.run(m, "AIMD, always work queued", rate_qps=rate, deadline_ms=SATURATED_DEADLINE_MS,
              warmup_s=warm, measure_s=meas).summary
    one = b.run(m, "no batching, always work queued", fixed=1, rate_qps=rate,
                deadline_ms=SATURATED_DEADLINE_MS, warmup_s=warm, measure_s=meas).summary
    out = {"offered_qps": r["offered_qps"], "rate_qps_target": rate, "request_deadline_ms": SATURATED_DEADLINE_MS,
           "ok_qps": r["ok_qps"], "vs_device_max": r["ok_qps"] / dev["qps"], "mean_batch": r["mean_batch"],
           "service_ms_p50": r["service_ms_p50"], "service_ms_p99": r["service_ms_p99"],
           "device_busy": r["device_busy"], "no_batching_ok_qps": one["ok_qps"],
           "vs_no_batching": _ratio(one["ok_qps"], r["ok_qps"])}
    log(f"  => always work queued: AIMD {r['ok_qps']:.0f} qps = x{_r(out['vs_device_max'])} of device max "
        f"{dev['qps']:.0f} qps (batch {r['mean_batch']:.1f}, service p50 {r['service_ms_p50']:.1f} ms, "
        f"device busy {r['device_busy']:.2f}); no batching {one['ok_qps']:.0f} qps, "
        f"AIMD x{_r(out['vs_no_batching'])} of it")
    return out


TRANSPORT_HOPS = ("produced->batcher_in", "batched->worker_in", "worker_out->consumed")


def _ideal_bound(lat: Callable[[int], float], dev: dict[str, Any], aimd: dict[str, Any], deadline_ms: float) -> dict[str, Any]:
    """What an ideal batcher (no overhead, ``bench.batching.bounds``) could answer within the
    request deadline, as a fraction of the device's best: at this run's offered load, and at
    its best over loads up to 2x the device, with no transport and with the Kafka hops
    measured in the AIMD run taken out of the deadline."""
    transport = sum(aimd["hop_ms_p50"].get(h) or 0.0 for h in TRANSPORT_HOPS)
    cap = int(dev["batch_size"])
    out: dict[str, Any] = {"transport_ms_p50": transport, "offered_vs_device": aimd["offered_qps"] / dev["qps"],
                           "measured_vs_device": aimd["goodput_qps"] / dev["qps"]}
    for name, slo in (("no transport", deadline_ms), ("measured transport", deadline_ms - transport)):
        bound = end_to_end_bound(lat, dev["qps"], slo, cap, loads=(aimd["offered_qps"] / dev["qps"], 1.0, 1.3, 1.6, 2.0))
        out[name] = bound
    at = f"{aimd['offered_qps'] / dev['qps']:g}x"
    log(f"  => ideal batcher within the {deadline_ms:g} ms deadline (a bound, simulated): at this offered load "
        f"({at} the device) {max(out['no transport']['by_load'][at].values()):.2f} of the device; at any load up to 2x "
        f"{out['no transport']['best']['efficient']:.2f}, {out['measured transport']['best']['efficient']:.2f} with the "
        f"measured {transport:.1f} ms of Kafka hops (measured here: {out['measured_vs_device']:.2f})")
    return out


DISPATCH_MODES = {
    # the default: a busy replica's next batch is formed just before its device frees
    "just in time": {},
    # an open pipe: a batch goes the moment a request is queued, up to 16 outstanding, so
    # without a delay a fixed-cost model runs batches of about one and cannot keep up: the
    # regime of Clipper's Figure 5, where the delay is what lets the model keep up
    "open pipe": {"CLIPSTREAM_BATCHER_JUST_IN_TIME": "false", "CLIPSTREAM_BATCHER_MAX_IN_FLIGHT": "16"},
    # the default credit (2 outstanding) but sent as soon as it allows: an idle worker is
    # sent whatever single request is there (not in the default run: ``--dispatch``)
    "eager credit": {"CLIPSTREAM_BATCHER_JUST_IN_TIME": "false"},
    # one batch outstanding, the next formed when it returns (``--dispatch clipper``)
    "clipper": {"CLIPSTREAM_BATCHER_JUST_IN_TIME": "false", "CLIPSTREAM_BATCHER_MAX_IN_FLIGHT": "1"},
}
DEFAULT_DISPATCH = "just in time,open pipe"


def section_delayed(b: Bench, ms: dict[str, Model], report: dict[str, Any]) -> None:
    """Delayed batching's gain under the default dispatch and under an open pipe.

    Just-in-time dispatch with bounded credit already lets requests gather while the device
    is busy, so a delay has little left to add (an ideal batcher gains nothing either). An
    open pipe sends each request the moment it comes, and a model with a high fixed cost per
    batch falls behind; that is where Nagle's argument, and Clipper's 3.3x, apply.

    Every (dispatch, load, delay) runs once per round, and the rounds are interleaved, so a
    ratio compares runs taken minutes apart at most; the figures are medians over the rounds
    (one 4 s run swings +-15% here, and a single pair of runs read anything from 0.7x to 2.8x).
    """
    m = ms["svm"]
    rates = [500.0] if b.quick else [300.0, 600.0]
    delays = [0.0, 2.0] if b.quick else [0.0, 2.0, 5.0]
    modes = [m.strip() for m in b.args.dispatch.split(",")] if b.args.dispatch else (
        ["open pipe"] if b.quick else DEFAULT_DISPATCH.split(","))
    n_rounds = 1 if b.quick else DELAYED_ROUNDS
    period, duty = 0.1, 0.5
    log(f"delayed batching: {m.label}, AIMD, bursty load (on {duty * period * 1000:g} ms / off "
        f"{(1 - duty) * period * 1000:g} ms), dispatch: {', '.join(modes)}; {n_rounds} interleaved round(s)")
    rounds: dict[str, list[dict[str, Any]]] = {}
    for i in range(n_rounds):
        for mode in modes:
            for rate in rates:
                for delay in delays:
                    label = f"{mode}, {rate:g} qps, delay {delay:g} ms"
                    r = b.run(m, f"{label}, round {i + 1}", delay_ms=delay, rate_qps=rate, period_s=period,
                              duty=duty, warmup_s=1.0 if b.quick else 1.5, measure_s=2.0 if b.quick else 4.0,
                              batcher_env=DISPATCH_MODES[mode])
                    rounds.setdefault(label, []).append(r.summary)
    entry: dict[str, Any] = {"burst": {"period_s": period, "duty": duty}, "rounds": n_rounds,
                             "runs": {k: _median_run(v) for k, v in rounds.items()},
                             "goodput_qps_by_round": {k: [s["goodput_qps"] for s in v] for k, v in rounds.items()},
                             "ratios": _delay_ratios(rounds, modes, rates, delays)}
    # the same loads served by an ideal batcher that forms the next batch as the device frees
    lat = latency_fn(fixed_ms=SVM_FIXED_MS, per_item_ms=SVM_PER_ITEM_MS)
    cap = int(device_max(lat, OBJECTIVE_MS)["batch_size"])  # where AIMD settles at the 20 ms objective
    entry["ideal_dispatch_as_device_frees"] = {
        f"{rate:g} qps": delay_gain(lat, b.args.deadline_ms, cap, rate, delays[1:], period_s=period, duty=duty)
        for rate in rates}
    report["delayed"] = entry
    for k, v in entry["ratios"].items():
        log(f"  => {k}: goodput x{_r(v['goodput'])} ({v['goodput_qps'][0]:.0f} -> {v['goodput_qps'][1]:.0f} q/s; "
            f"rounds {', '.join(_r(x) for x in v['goodput_by_round'])}), batches/s x{_r(v['batches_per_s'])}, "
            f"device busy x{_r(v['device_busy'])}")
    for k, v in entry["ideal_dispatch_as_device_frees"].items():
        log(f"  => ideal batcher, next batch formed as the device frees, {k}: delay gain "
            + ", ".join(f"x{_r(x)} at {d}" for d, x in v["ratios"].items()) + " (a bound, simulated)")


def _delay_ratios(rounds: Mapping[str, Sequence[Mapping[str, Any]]], modes: Sequence[str],
                  rates: Sequence[float], delays: Sequence[float]) -> dict[str, dict[str, Any]]:
    """Each delay against none, per dispatch mode and rate: medians over the rounds, and each
    round's own goodput ratio."""
    ratios: dict[str, dict[str, Any]] = {}
    for mode in modes:
        for rate in rates:
            offs = rounds[f"{mode}, {rate:g} qps, delay 0 ms"]
            for delay in delays[1:]:
                ons = rounds[f"{mode}, {rate:g} qps, delay {delay:g} ms"]
                ratios[f"{mode}, {rate:g} qps, delay {delay:g} vs 0 ms"] = {
                    "goodput": _median_ratio(offs, ons, "goodput_qps"),
                    "batches_per_s": _median_ratio(offs, ons, "batches_per_s"),
                    "device_busy": _median_ratio(offs, ons, "device_busy"),
                    "goodput_by_round": [_ratio(off["goodput_qps"], on["goodput_qps"]) for off, on in zip(offs, ons)],
                    "goodput_qps": [statistics.median(s["goodput_qps"] for s in offs),
                                    statistics.median(s["goodput_qps"] for s in ons)],
                }
    return ratios


def _median_ratio(offs: Sequence[Mapping[str, Any]], ons: Sequence[Mapping[str, Any]], key: str) -> float | None:
    """The median over rounds of on / off, each pair taken in the same round."""
    xs = [x for off, on in zip(offs, ons) if (x := _ratio(off[key], on[key])) is not None]
    return statistics.median(xs) if xs else None


def _median_run(summaries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The round whose goodput is the median (the lower one of an even count)."""
    ordered = sorted(summaries, key=lambda s: s["goodput_qps"])
    return ordered[(len(ordered) - 1) // 2]


def section_cache(b: Bench, ms: dict[str, Model], report: dict[str, Any]) -> None:
    m = ms["onnx"]
    log("cache: the same inputs again (the worker filled the cache), 200 qps")
    r = b.run(m, "cache hits", rate_qps=200.0, pool=100 if b.quick else 200, prefill=True, warmup_s=0.5,
              measure_s=1.5 if b.quick else 3.0)
    hits = [o for o in r.obs if o.status == "cached" and o.batcher_in_us]
    def ms_of(xs: list[float]) -> dict[str, float | None]:
        return percentiles(xs, (50, 90, 99), empty=None)
    entry = {
        "hits": len(hits), "others": dict(Counter(o.status for o in r.obs if o.status != "cached")),
        "batcher_in_to_consumed_ms": ms_of([(o.consume_us - o.batcher_in_us) / 1000 for o in hits]),
        "batcher_in_to_kafka_timestamp_ms": ms_of([(o.kafka_ts_us - o.batcher_in_us) / 1000 for o in hits
                                                   if o.kafka_ts_us is not None]),
        "batcher_in_to_answer_made_ms": ms_of([(o.batched_us - o.batcher_in_us) / 1000 for o in hits if o.batched_us]),
        "produced_to_consumed_ms": ms_of([(o.consume_us - o.produced_us) / 1000 for o in hits]),
        "note": "kafka timestamps have millisecond resolution (CreateTime, set by the batcher's producer)",
    }
    report["cache"] = entry
    log(f"  => {len(hits)} hits; batcher_in -> consumed p50 {fmt_ms(entry['batcher_in_to_consumed_ms']['p50'])} ms, "
        f"-> answer made p50 {fmt_ms(entry['batcher_in_to_answer_made_ms']['p50'])} ms, "
        f"produced -> consumed p50 {fmt_ms(entry['produced_to_consumed_ms']['p50'])} ms")


def section_cost(b: Bench, ms: dict[str, Model], report: dict[str, Any],
                 thr: dict[str, dict[str, RunResult]]) -> None:
    m = ms["onnx"]
    log("cost: ONNX model, AIMD at saturation, CPU time per process; py-spy on batcher and worker")
    runs = thr.get("onnx", {})
    base = runs.get("AIMD")
    entry: dict[str, Any] = {}
    for label, r in [("AIMD (throughput run, no profiler)", base),
                     ("AIMD (profiled run)", b.run(m, "AIMD + py-spy", warmup_s=2.0, measure_s=3.0, profile=True))]:
        if r is None:
            continue
        s = r.summary
        answered = sum(s["counts"].values()) or 1
        ok = s["counts"].get("ok", 0) or 1
        span = (r.t1_us - r.t0_us) / 1e6
        entry[label] = {
            "ok_qps": s["ok_qps"], "answered_qps": s["answered_qps"], "mean_batch": s["mean_batch"],
            "cpu_us_per_ok_query": {k: round(v * 1e6 / ok, 1) for k, v in s["cpu_s"].items()},
            "cpu_us_per_answered_query": {k: round(v * 1e6 / answered, 1) for k, v in s["cpu_s"].items()},
            "cpu_cores_busy": {k: round(v / span, 2) for k, v in s["cpu_s"].items()},
            "layer_us_per_ok_query": round(sum(v for k, v in s["cpu_s"].items() if k in ("batcher", "worker", "kafka", "redis")) * 1e6 / ok, 1),
            "model_service_us_per_query": round(1000 * (s["service_ms_p50"] or 0) / max(1.0, s["mean_batch"]), 1),
        }
        if "profile" in r.extra:
            entry[label]["py_spy_fraction_of_samples"] = r.extra["profile"]
    report["cost"] = entry
    for label, e in entry.items():
        log(f"  => {label}: layer {e['layer_us_per_ok_query']} us/query; per process {e['cpu_us_per_ok_query']}")
        if "py_spy_fraction_of_samples" in e:
            for proc, cats in e["py_spy_fraction_of_samples"].items():
                log(f"     {proc}: " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in cats.items() if not k.startswith("_")))
