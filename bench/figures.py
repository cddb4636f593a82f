"""The headline figures of ``make bench`` in one table, read from the reports it wrote.

Every benchmark writes its own report (``out/bench/<name>.json``) with each reading it took,
and the headline figures were copied from those files into the README by hand: slow, easy to
get wrong, and a target missed in one run could pass unnoticed. This module reads the reports
and writes one row per figure (figure | target | measured | met | report), with the numbers
taken from the JSON and the target checked, to stdout and to ``out/bench/FIGURES.md``.
A missing report or key gives a "not measured" / "not in report" row, never an exception.

    .venv/bin/python -m bench.figures [--out-dir out/bench] [--readme README.md]

``--readme`` also rewrites the README's table in place (``bench.figures_readme``).

``bench.all`` runs it after the last benchmark.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import figures_readme
from bench.figures_cost import (
    cost_cpu, cost_light, cost_max_rate, cost_vs_mlserver, cost_wide, crossing, ensemble, ensemble_wide, fronts, gpu,
    hopeless, skip_near_capacity,
)
from bench.figures_format import NONE, Result, ge, get, j, met, ms, pts, q, x

DEFAULT_OUT = Path("out/bench")


@dataclass(frozen=True)
class Row:
    figure: str
    target: str
    measured: str
    met: str
    report: str


# --- one function per figure: report dict -> (measured, met) ------------------------------------

def scaling(r: dict[str, Any]) -> Result:
    s = get(r, "summary")
    g, ratio = get(s, "goodput_qps"), get(s, "ratio_to_one", "4")
    return f"{j([get(g, n) for n in ('1', '2', '4')], q)} q/s within SLO: 4 vs 1 = {x(ratio)}", met(ge(ratio, 3.6))


def members(r: dict[str, Any]) -> Result:
    s = get(r, "summary")
    g, ratio = get(s, "goodput_qps"), get(s, "ratio_to_one")
    ks = sorted(g, key=int)
    return (f"{j([get(g, k) for k in ks], q)} q/s peak goodput within SLO ({' / '.join(ks)} members); "
            + ", ".join(f"{k} vs 1 = {x(get(ratio, k))}" for k in ks if k != "1")
            + f"; {get(s, 'cores')} cores"), NONE


def efficiency(r: dict[str, Any]) -> Result:
    s = get(r, "summary")
    e = get(s, "efficiency")
    p99 = s.get("efficiency_with_p99_within_slo")
    extra = f"; {p99:.3f} with p99 within SLO" if p99 is not None else ""
    return f"{e:.3f} ({q(get(s, 'best_goodput_qps'))} of {q(get(s, 'device_max_qps'))} q/s){extra}", met(ge(e, 0.9))


def stragglers(r: dict[str, Any]) -> Result:
    slo, s = get(r, "settings", "slo_ms"), get(r, "summary")
    sizes = sorted((n for n in s if n.isdigit()), key=int)
    if not sizes:
        raise KeyError("summary")
    p99 = [get(s, n, "p99_cutoff_ms") for n in sizes]
    loss = [get(s, n, "accuracy_loss_points") for n in sizes]
    wrong = [s[n].get("accuracy_loss_points_defaults_wrong") for n in sizes]
    text = f"p99 {j(p99, ms)} ms ({' / '.join(sizes)} models); loss {j(loss, pts)} points"
    if None not in wrong:
        text += f", {j(wrong, pts)} with defaults wrong"
    return text, met(*(p <= slo + 5 for p in p99), *(v < 1 for v in loss))


def cache(r: dict[str, Any]) -> Result:
    s = get(r, "summary")
    sp = get(s, "cache_speedup")
    text = f"ONNX {x(sp)} ({q(get(s, 'reevaluation_qps_without_cache'))} → {q(get(s, 'reevaluation_qps_with_cache'))} q/s)"
    oks = [ge(sp, 1.6)]
    if "accelerator_cache_speedup" in s:
        acc = s["accelerator_cache_speedup"]
        pair = s.get("accelerator_reevaluation_qps") or []
        text += f"; accelerator {x(acc)}" + (f" ({q(pair[0])} → {q(pair[1])} q/s)" if len(pair) == 2 else "")
        oks.append(ge(acc, 1.6))
    return text, met(*oks)


def gateway_hit(r: dict[str, Any]) -> Result:
    h = get(r, "summary", "cache_hit_ms")
    p50, p99 = get(h, "p50"), get(h, "p99")
    return f"p50 {ms(p50)} ms, p99 {ms(p99)} ms ({h.get('n', '?')} calls)", met(p50 < 10, p99 < 25)


def gateway_overload(r: dict[str, Any]) -> Result:
    o = get(r, "summary", "overload")
    due = get(o, "over_slo_plus_20ms")
    ways = {"over_slo_plus_20ms_from_send": "from the send", "over_slo_plus_20ms_send_to_arrival": "at arrival"}
    counts = ", ".join([f"{due} from when due"] + [f"{o[k]} {how}" for k, how in ways.items() if k in o])
    of = f" (of {o['stamped']:,})" if "stamped" in o else ""
    outcomes = "{:,} answered / {:,} defaults / {:,} 503s / {:,} lost".format(
        get(o, "answered"), get(o, "default"), o.get("refused_503", o.get("error", 0)), get(o, "lost"))
    nice = o.get("generator_nice")
    gen = f"; generator at nice {nice}" if nice else ""
    offered = f"{o['offered_qps']:,.0f} q/s offered; " if "offered_qps" in o else ""
    return (f"{offered}over SLO + 20 ms: {counts}{of}; longest {ms(get(o, 'max_wait_ms'))} ms; {outcomes}{gen}",
            met(due == 0))


def join_overhead(r: dict[str, Any]) -> Result:
    o = get(r, "summary", "join_overhead_ms")
    p50 = get(o, "p50")
    hop = r["summary"].get("kafka_hop_ms", {}).get("p50")
    return (f"p50 {ms(p50)} ms, p99 {ms(get(o, 'p99'))} ms" + (f" (Kafka hop before it p50 {ms(hop)} ms)" if hop else ""),
            met(p50 < 2))


def after_deadline(r: dict[str, Any]) -> Result:
    a = get(r, "summary", "after_deadline_ms")
    p99 = get(a, "p99")
    latest = f", latest {a['max']:+.2f}" if "max" in a else ""
    return f"p99 {p99:+.2f} ms, p50 {get(a, 'p50'):+.2f}{latest} (negative: before the deadline)", met(p99 < 5)


def e2e(r: dict[str, Any]) -> Result:
    groups: dict[str, list[tuple[float, float]]] = {}
    for key, v in get(r, "summary").items():
        model, mode, slo = (key.split("/") + ["", ""])[:3]
        name = {"logreg": "ONNX", "accel": "accelerator"}.get(model, model) + (" via gateway" if mode == "gateway" else "")
        groups.setdefault(name, []).append((float(slo or 0), get(v, "max_goodput_qps_within_slo")))
    if not groups:
        raise KeyError("summary")
    return "; ".join(f"{name} {j([g for _, g in sorted(v)], q)} q/s (SLO {j([s for s, _ in sorted(v)], '{:g}'.format)} ms)"
                     for name, v in groups.items()), NONE


def kept_busy(r: dict[str, Any]) -> Result:
    c = get(r, "throughput", "clockwork")
    k = get(c, "device_kept_busy")
    vs_dev, vs_none = get(k, "vs_device_max"), get(k, "vs_no_batching")
    dev = c.get("device_max", {}).get("qps")
    return (f"AIMD {q(get(k, 'ok_qps'))} q/s ok = {vs_dev:.2f} of the device's {q(dev)}; "
            f"{x(vs_none)} no batching ({q(k.get('no_batching_ok_qps'))})", met(ge(vs_dev, 0.9), ge(vs_none, 2.4)))


def confirmed(kind: str) -> Callable[[dict[str, Any]], Result]:
    def figure(r: dict[str, Any]) -> Result:
        c = get(r, "throughput", kind, "confirmed")
        g = get(c, "goodput")
        vs_best, vs_none = get(g, "aimd_vs_best_fixed"), get(g, "aimd_vs_no_batching")
        text = (f"AIMD {q(get(g, 'aimd_qps'))} q/s = {x(vs_best)} best fixed ({c.get('best_fixed', '?')} "
                f"{q(get(g, 'best_fixed_qps'))}), {x(vs_none)} no batching ({q(get(g, 'no_batching_qps'))})")
        return text, met(ge(vs_best, 0.9))
    return figure


def onnx(r: dict[str, Any]) -> Result:
    text, ok = confirmed("onnx")(r)
    costs = r.get("cost") or {}
    label = next((k for k in costs if "no profiler" in k), next(iter(costs), None))
    if label is None:
        return text + "; CPU cost not in report", ok
    c = costs[label]
    split = c.get("cpu_us_per_ok_query", {})
    parts = ", ".join(f"{k} {split[k]:,.0f}" for k in ("kafka", "batcher", "worker", "redis") if k in split)
    return (f"{text}; layer {c.get('layer_us_per_ok_query', 0):,.0f} µs CPU/query ({parts}), "
            f"model {c.get('model_service_us_per_query', 0):g}"), ok


def adapt(r: dict[str, Any]) -> Result:
    a = get(r, "adapt")
    readings = [k for k in ("goodput", "ok throughput", "goodput, objective as given") if isinstance(a.get(k), dict)]
    if not readings:
        raise KeyError("adapt")
    parts, oks = [], []
    for k in readings:
        e = a[k]
        rec, settled = get(e, "recovery_batches"), get(e, "aimd_after_vs_new_best")
        obj = f" (AIMD {e['aimd_objective_ms']:g} ms)" if "aimd_objective_ms" in e else ""
        rounds = [b.get("recovery_batches") for b in e.get("by_round") or [] if isinstance(b, dict)]
        each = f" ({', '.join('never' if b is None else str(b) for b in rounds)})" if len(rounds) > 1 else ""
        counts = e.get("counts_for_target", True)  # another objective is shown, not judged
        parts.append(f"{k}{obj}: {'never' if rec is None else rec} batches{each}, settled {x(settled)} "
                     f"of {e.get('new_best_fixed', 'new best')}{'' if counts else ' (not counted)'}")
        if counts:
            oks.append(rec is not None and rec <= 200 and ge(settled, 0.9))
    return "; ".join(parts), met(*oks)


_DELAY = re.compile(r"^(?P<mode>.+?), (?P<rate>[\d.]+) qps, delay (?P<delay>[\d.]+) vs 0 ms$")


def delayed(r: dict[str, Any]) -> Result:
    best: dict[tuple[str, str], tuple[float, str]] = {}
    for key, v in get(r, "delayed", "ratios").items():
        g = v.get("goodput") if isinstance(v, dict) else None
        m = _DELAY.match(key)
        mode, rate, delay = (m["mode"], m["rate"], m["delay"]) if m else (key, "?", "?")
        if g is not None and ((mode, delay) not in best or g > best[mode, delay][0]):
            best[mode, delay] = (g, rate)
    if not best:
        raise KeyError("ratios")
    modes: dict[str, list[str]] = {}
    for (mode, delay), (g, rate) in sorted(best.items(), key=lambda kv: (kv[0][0], len(kv[0][1]), kv[0][1])):
        modes.setdefault(mode, []).append(f"{delay} ms {x(g)} @{rate}")
    reached = [f"{mode} {delay} ms" for (mode, delay), (g, _) in best.items() if g >= 2]
    text = "; ".join(f"{mode}: {', '.join(v)}" for mode, v in modes.items())
    return text + (f"; 2x reached by {', '.join(reached)}" if reached else "; 2x reached by none"), met(bool(reached))


def cache_hit(r: dict[str, Any]) -> Result:
    c = get(r, "cache")
    p50 = get(c, "batcher_in_to_consumed_ms", "p50")
    made = c.get("batcher_in_to_answer_made_ms", {}).get("p50")
    return (f"p50 {ms(p50)} ms, p99 {ms(c['batcher_in_to_consumed_ms'].get('p99'))} ms"
            + (f" (answer made {ms(made)} ms after arrival)" if made is not None else ""), met(p50 < 2))


def soak(r: dict[str, Any]) -> Result:
    g, drift, minutes = get(r, "rss_growth"), get(r, "p99_drift"), get(r, "settings", "minutes")
    stages = {k: v for k, v in g.items() if k not in ("kafka", "redis")}
    worst = max(stages, key=stages.get)
    text = (f"{minutes:g} min at {q(get(r, 'rate_qps'))} q/s: worst stage RSS growth {worst} "
            f"{stages[worst]:+.1%}; p99 last/first third {x(drift)}")
    return text, met(minutes >= 30, stages[worst] < 0.10, drift is not None and drift <= 1.5)


# (figure, target, report, function)
FIGURES: list[tuple[str, str, str, Callable[[dict[str, Any]], Result]]] = [
    ("scaling: 1, 2, 4 replicas of the simulated accelerator", "≥ 3.6x", "scaling", scaling),
    ("members: 1, 2, 4 selector and batcher members, simulated accelerator (bench.members)", NONE, "members",
     members),
    ("efficiency: goodput within SLO / device ceiling, 1 replica", "≥ 0.9", "efficiency", efficiency),
    ("stragglers: p99 with the deadline cutoff, 2 / 4 / 8 models", "p99 ≤ SLO + 5 ms; loss < 1 point", "stragglers", stragglers),
    ("cache: feedback re-evaluation with vs without", "≥ 1.6x", "cache", cache),
    ("gateway round trip, cache hit, one caller", "p50 < 10 ms, p99 < 25 ms", "gateway", gateway_hit),
    ("gateway at overload", "none over SLO + 20 ms, counted from when due", "gateway", gateway_overload),
    ("join overhead: last prediction → response built", "p50 < 2 ms", "join", join_overhead),
    ("answer time minus deadline, a straggler always late", "p99 < +5 ms", "join", after_deadline),
    ("end-to-end: the highest goodput at a load whose p99 is within the SLO", NONE, "e2e", e2e),
    ("batching, accelerator, work always queued", "≥ 0.9 of device, ≥ 2.4x no batching", "batching", kept_busy),
    # the 2.4x is on the row above (throughput at the objective, against the device alone);
    # within the deadline at this load AIMD answers nearly all that is offered (README)
    ("batching, accelerator, within the 20 ms deadline", "≥ 0.9x best fixed", "batching",
     confirmed("clockwork")),
    ("batching, 5 ms + 0.05 ms/item profile, within 20 ms", "≥ 0.9x best fixed", "batching", confirmed("svm")),
    ("batching, ONNX, within 20 ms; the layer's CPU", "≥ 0.9x best fixed", "batching", onnx),
    ("AIMD after the model's speed halves: recovery, settled", "≤ 200 batches; ≥ 0.9x new best", "batching", adapt),
    ("delayed batching vs none, 5 ms profile, bursty load", "≥ 2x", "batching", delayed),
    ("cache hit, batcher in → predictions topic", "p50 < 2 ms", "batching", cache_hit),
    ("cost: CPU per query at 300 q/s, every process (bench.cost)", "≤ 1,000 µs", "cost", cost_cpu("300", 1000, machine=True)),
    ("cost: CPU per query at 100 q/s, every process", "≤ 1,500 µs", "cost", cost_cpu("100", 1500)),
    ("cost floor: one Kafka crossing at 300 records/s, stages' settings (bench.crossing)", NONE, "crossing",
     crossing),
    ("cost: highest rate through the gateway, p99 ≤ 50 ms, no refusals", "≥ 800 q/s", "cost", cost_max_rate),
    ("cost: clipstream vs MLServer 1.7.1 (and Ray Serve 2.60.0), same model and load", "≥ 2x", "cost", cost_vs_mlserver),
    ("cost: the demo's 5-model digits ensemble, highest rate within its SLO (bench.ensemble)",
     "≥ 3x the first version's 130 q/s", "ensemble", ensemble),
    ("cost: light load p50; cache-hit round trip", "p50 ≤ 10 ms; hit p50 < 10 ms", "cost", cost_light),
    ("cost by way in: CPU per query, /v1 and V2 JSON, gRPC calls and one gRPC stream; a feedback (bench.fronts)", NONE,
     "fronts", fronts),
    ("selector's skip of hopeless models vs asking every model, Kafka path, overload (bench.hopeless)", NONE,
     "hopeless", hopeless),
    ("the same skip near capacity: make demo with more callers, Exp4's error (bench.skip_near_capacity)", NONE,
     "skip_near_capacity", skip_near_capacity),
    ("cost on a 16-core machine: highest rate through the gateway; vs MLServer (bench.cost --name cost-16core)",
     "≥ 800 q/s; ≥ 2x", "cost-16core", cost_wide),
    ("the 5-model ensemble on a 16-core machine (bench.ensemble --name ensemble-16core)", NONE,
     "ensemble-16core", ensemble_wide),
    ("GPU: a real ResNet-50 through the torch backend, device auto, per batch (bench.gpu)", NONE, "gpu", gpu),
    ("soak at 70% of capacity (python -m bench.soak)", "30 min; each stage's RSS < +10%; p99 stable",
     "soak", soak),
]


def load(path: Path) -> dict[str, Any] | str:
    """The report, or why there is none."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return f"not measured (no {path})"
    except (OSError, ValueError) as exc:
        return f"not measured (unreadable {path}: {type(exc).__name__})"
    return data if isinstance(data, dict) else f"not measured ({path} is not a JSON object)"


def rows(out_dir: Path) -> tuple[list[Row], dict[str, float]]:
    """One row per figure, and the modification time of each report that was read."""
    reports = {name: load(out_dir / f"{name}.json") for name in {f[2] for f in FIGURES}}
    mtimes = {n: (out_dir / f"{n}.json").stat().st_mtime for n, r in reports.items() if isinstance(r, dict)}
    out = []
    for figure, target, name, fn in FIGURES:
        report, ok = reports[name], NONE
        if isinstance(report, str):
            measured = report
        else:
            try:
                measured, ok = fn(report)
            except (KeyError, IndexError, TypeError, ValueError, AttributeError):
                measured, ok = "not in report", NONE
        out.append(Row(figure, target, measured, ok, f"{name}.json"))
    return out, mtimes


def render(table: list[Row], mtimes: dict[str, float], out_dir: Path) -> str:
    stamp = ", ".join(f"{n}.json {time.strftime('%Y-%m-%d %H:%M', time.localtime(t))}" for n, t in sorted(mtimes.items()))
    lines = [f"Headline figures from {out_dir}/: {stamp or 'no reports'}", "",
             "| figure | target | measured | met | report |", "| --- | --- | --- | --- | --- |"]
    for r in table:
        cells = (r.figure, r.target, r.measured, r.met, r.report)
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_OUT, help="where the reports are (default out/bench)")
    ap.add_argument("--readme", type=Path, default=None,
                    help="also rewrite the table in this file; a row whose report is missing keeps its earlier reading")
    args = ap.parse_args(argv)
    table, mtimes = rows(args.out_dir)
    text = render(table, mtimes, args.out_dir)
    print(text, end="", flush=True)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "FIGURES.md").write_text(text)
    if args.readme is not None:
        fresh = [((r.figure, r.target, r.measured, r.met, r.report), r.report[:-len(".json")] in mtimes) for r in table]
        try:
            renewed, kept = figures_readme.update(args.readme, fresh)
        except (OSError, figures_readme.TableNotFound) as exc:
            print(f"{args.readme}: not rewritten ({exc}); its table must start with the line "
                  f"{figures_readme.HEADER!r}", file=sys.stderr)
            return 1
        print(f"{args.readme}: {renewed} rows from the reports in {args.out_dir}, {kept} kept from before "
              f"(their reports are not there), {len(table) - renewed - kept} not measured", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
