"""The ``bench.figures`` rows of the per-query cost: ``bench.cost``, ``bench.ensemble``,
``bench.crossing``, ``bench.fronts``, ``bench.hopeless``, ``bench.skip_near_capacity`` and ``bench.gpu``, each on
the machine that wrote it.

They live apart from the other rows because they read the largest reports, with a step per
rate and a table per process, and say which machine a figure came from.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from statistics import median
from typing import Any

from bench.figures_format import NONE, YES, Result, ge, get, j, met, ms, q, x


def cost_cpu(rate: str, target: float, machine: bool = False) -> Callable[[dict[str, Any]], Result]:
    """``machine``: also what a record's work costs on this machine warm and after a sleep."""
    def figure(r: dict[str, Any]) -> Result:
        c = get(r, "systems", "clipstream", "cpu", rate)
        total, per = get(c, "cpu_us_per_query_total"), get(c, "cpu_us_per_query")
        split = ", ".join(f"{k} {v:,.0f}" for k, v in per.items())
        answered = c.get("cpu_us_per_answered_query")
        also = f"; {answered:,.0f} µs per query answered" if answered is not None else ""
        trips = c.get("kafka_requests_per_query")
        if trips:
            also += f"; {sum(trips.values()):.1f} Kafka requests per query"
        still = r["systems"]["clipstream"].get("idle")  # reports from before it was measured have none
        if still:
            top = max(still["cores"].items(), key=lambda kv: kv[1])
            also += (f"; idle, the pipeline takes {still['total_cores']:.3f} cores ({top[0]} {top[1]:.3f}) = "
                     f"{still['total_cores'] * 1e6 / float(rate):,.0f} µs per query at {rate} q/s")
        cold = r.get("machine", {}).get("cold_start_us") if machine else None
        if cold:
            also += (f"; on this machine a record's encode + decode costs {cold['warm']:.0f} µs back to back, "
                     f"{cold['after_sleep']:.0f} µs after a {cold['sleep_ms']:g} ms sleep")
        return f"{total:,.0f} µs ({split}){also}", met(total <= target)
    return figure


def next_miss(steps: list[dict[str, Any]], rate: float) -> str:
    """Why the row stopped at ``rate``: the lowest step above it that missed, with the p99 of
    what it answered and what it refused, so a refusal is told apart from a slow answer."""
    missed = sorted((st for st in steps if st["rate"] > rate and not st.get("ok")), key=lambda st: st["rate"])
    if not missed:
        return ""
    st = missed[0]
    why = [f"p99 of answers {ms(st['latency_ms']['p99'])} ms"]
    why += [f"{st[k]:,} {word}" + (refused_by(st.get("refusal_reasons")) if k == "refused" else "")
            for k, word in (("refused", "refused"), ("default", "defaults"), ("lost", "lost")) if st.get(k)]
    return f"; {q(st['rate'])} q/s missed: {', '.join(why)}"


REFUSERS = (("learnt", "the learnt admission limit"), ("event loop", "the event loop late"),
            ("limit of", "max_inflight"))


def refused_by(reasons: dict[str, int] | None) -> str:
    """Which of the gateway's rules refused (its 503 reasons, as ``bench.cost`` counts them)."""
    if not reasons:
        return ""
    rules = {next((rule for key, rule in REFUSERS if key in reason), "another reason") for reason in reasons}
    return f" by {' and '.join(sorted(rules))}"


def cost_max_rate(r: dict[str, Any]) -> Result:
    s = get(r, "summary")
    v = get(s, "max_rate_qps")
    steps = r.get("systems", {}).get("clipstream", {}).get("search") or []
    return f"{q(v)} q/s{next_miss(steps, v)}", met(ge(v, 800))


def cost_vs_mlserver(r: dict[str, Any]) -> Result:
    s = get(r, "summary")
    ratio = get(s, "vs_mlserver")
    ray, also = s.get("rayserve_max_rate_qps"), ""
    if ray:
        also = f"; Ray Serve {q(ray)} q/s, {x(s.get('vs_rayserve'))}"
    elif ray is not None:
        steps = r.get("systems", {}).get("rayserve", {}).get("search") or [{"rate": 0}]
        also = f"; Ray Serve: no step within the SLO, down to {q(min(st['rate'] for st in steps))} q/s"
    return (f"{x(ratio)} ({q(get(s, 'max_rate_qps'))} vs MLServer {q(get(s, 'mlserver_max_rate_qps'))} q/s{also})",
            met(ge(ratio, 2.0)))


def cost_light(r: dict[str, Any]) -> Result:
    s = get(r, "summary")
    p50, hit = get(s, "light_p50_ms"), get(s, "cache_hit_p50_ms")
    return f"p50 {ms(p50)} ms at 100 q/s; cache hit p50 {ms(hit)} ms", met(p50 <= 10, hit < 10)


def ensemble(r: dict[str, Any]) -> Result:
    v, base, times = get(r, "max_rate_qps"), get(r, "settings", "baseline_qps"), get(r, "settings", "target_x")
    c = get(r, "closed_loop")
    at = next((s for s in get(r, "search") if s["rate"] == v), None)
    cpu = f", {at['cpu_us_per_query_total']:,.0f} µs CPU/query there" if at else ""
    return (f"{q(v)} q/s within SLO {get(r, 'settings', 'slo_ms'):g} ms = {x(v / base)} of {q(base)}{cpu}"
            f"{next_miss(get(r, 'search'), v)}; "
            f"{c['callers']} callers: {q(c['qps'])} q/s, p99 {ms(c['p99_ms'])} ms"), met(ge(v, times * base))


def cores(r: dict[str, Any]) -> str:
    return f"; {get(r, 'machine', 'cpus')} cores"


def cost_wide(r: dict[str, Any]) -> Result:
    """The rate and MLServer rows of ``bench.cost`` on a machine with more cores, in one row."""
    rate, rate_ok = cost_max_rate(r)
    vs, vs_ok = cost_vs_mlserver(r)
    cpu = get(r, "systems", "clipstream", "cpu", "300", "cpu_us_per_query_total")
    return (f"{rate}; {vs}; {cpu:,.0f} µs CPU per query at 300 q/s{cores(r)}",
            met(rate_ok == YES, vs_ok == YES))


def ensemble_wide(r: dict[str, Any]) -> Result:
    """The ensemble row on another machine: no target, as its baseline was measured on 2 cores."""
    text = ensemble(r)[0]
    if get(r, "max_rate_qps") >= max(get(r, "settings", "search")):
        text = text.replace(" q/s within SLO", " q/s (the highest step searched) within SLO", 1)
    return text + cores(r), NONE


def gpu(r: dict[str, Any]) -> Result:
    b, table, export = get(r, "formats", "torchscript"), get(r, "clockwork_ms"), get(r, "formats").get("export")
    ks = [k for k in ("1", "4", "16", "32") if k in b]
    sim = [k for k in ks if k in table]
    also = f"; as torch.export p50 {j([get(export, k, 'p50_ms') for k in ks], ms)} ms" if export else ""
    return (f"{get(r, 'device')}, backend on {get(r, 'backend_device')}: TorchScript p50 "
            f"{j([get(b, k, 'p50_ms') for k in ks], ms)} ms at batch {' / '.join(ks)}{also}; the simulated "
            f"accelerator sleeps {j([table[k] for k in sim], ms)} ms at batch {' / '.join(sim)}"), NONE


def hopeless(r: dict[str, Any]) -> Result:
    s, cfg = get(r, "summary"), get(r, "settings")
    g = get(s, "median_goodput_qps")
    text = (f"median goodput {q(get(g, 'skip'))} q/s with the skip at {cfg['quantile']:g} vs {q(get(g, 'ask'))} q/s "
            f"asking every model = {x(s.get('skip_vs_ask'))}; {get(s, 'not_asked'):,.0f} models not asked; "
            f"{q(cfg['rate'])} q/s offered, {cfg['rounds']} round(s) each way")
    if s.get("capacity_qps"):
        text += f" ({cfg['over']:g}x the {q(s['capacity_qps'])} q/s that asking every model kept up with)"
    # a rate fixed with --rate may be one this machine serves: that step was no overload
    if s.get("ask_kept_up"):
        text += "; not an overload on this machine: asking every model kept up with the offered rate"
    return text, NONE


def skip_near_capacity(r: dict[str, Any]) -> Result:
    s, cfg = get(r, "summary"), get(r, "settings")
    err, asked = get(s, "median_exp4_error"), get(s, "models_not_asked")
    variants = ", ".join(f"{name} {e:.3f}" + (f" ({asked.get(name, 0):,.0f} models not asked)" if name != "ask" else "")
                         for name, e in err.items())
    return (f"median Exp4 error {variants}; {cfg['concurrency']} callers, {cfg['rounds']} round(s), "
            f"p50 {j(list(get(s, 'median_p50_ms').values()), ms)} ms"), NONE


def _median_of(runs: list[dict[str, Any]], key: str) -> float:
    return float(median(f[key] for f in runs))


def crossing(r: dict[str, Any]) -> Result:
    row = next(x for x in get(r, "rows") if x["variant"] == "stages' settings" and x["rate"] == 300.0)
    floor = get(r, "broker_floor_us_per_query", "300")
    burst = next((x for x in get(r, "rows") if x["variant"].startswith("stages' settings, bursts") and x["rate"] == 300.0),
                 None)
    shared = (f"; sent in bursts of 8: broker {burst['broker_cpu_us_per_record']:,.0f} + clients "
              f"{burst['clients_cpu_us_per_record']:,.0f} µs") if burst else ""
    fans = [f for f in r.get("fan_out") or [] if f["linger_ms"] == 0]
    for grouped in (False, True):  # an ensemble's requests, one record per model or one for all
        runs = [f for f in fans if bool(f.get("grouped")) == grouped]
        if not runs:
            continue
        med = partial(_median_of, runs)
        shared += (f"; one record for all {runs[0]['models']} models: " if grouped else
                   f"; {runs[0]['topics']} records for {runs[0]['topics']} topics sent back to back: ")
        n = med("produce_requests_per_fan_out")
        shared += f"{n:g} produce request{'' if n == 1 else 's'}"
        if "broker_cpu_us_per_fan_out" in runs[0]:
            shared += (f", broker {med('broker_cpu_us_per_fan_out'):,.0f} + clients "
                       f"{med('clients_cpu_us_per_fan_out'):,.0f} µs at {runs[0]['rate']:g}/s")
    return (f"broker {row['broker_cpu_us_per_record']:,.0f} µs + clients {row['clients_cpu_us_per_record']:,.0f} µs "
            f"per crossing; x{get(r, 'crossings_per_query')} per query = broker alone {floor:,.0f} µs{shared}"), NONE


def fronts(r: dict[str, Any]) -> Result:
    """Each way into the gateway at the report's first rate: the CPU per query in all and the
    gateway's, and the p50; and a feedback's CPU."""
    rate, at = next(iter(r["rates"].items()))
    f = at["fronts"]
    names = {"v1": "/v1 JSON", "v2-http": "V2 JSON", "grpc": "gRPC", "grpc-stream": "gRPC stream"}
    parts = [f"{label} {f[k]['cpu_us_per_query']:,.0f} µs (gateway {f[k]['gateway_cpu_us_per_query']:,.0f}), "
             f"p50 {f[k]['p50_ms']:.1f} ms" for k, label in names.items() if k in f]
    if "feedback" in f:
        parts.append(f"a feedback {f['feedback']['cpu_us_per_query']:,.0f} µs "
                     f"(gateway {f['feedback']['gateway_cpu_us_per_query']:,.0f})")
    return f"at {rate} q/s: " + "; ".join(parts), NONE
