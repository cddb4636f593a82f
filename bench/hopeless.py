"""The selector's skip of hopeless models (``CLIPSTREAM_SELECTOR_HOPELESS_QUANTILE``), side by
side with asking every model, in overload on the Kafka path.

Two pipelines of ``bench.cost``'s app (the simulated accelerator, one replica, SLO 50 ms) run at
once, one with the skip at ``--quantile`` and one with it off. Each round gives both the same
open-loop step straight onto ``queries`` (``bench.load_kafka``), one after the other, and the
next round swaps which goes first: on a shared machine the order moves a figure as much as a
setting does. Only one pipeline is loaded at a time; the other idles.

Overload is relative to the machine: without ``--rate``, short steps on the pipeline that asks
every model first find the highest rate of ``SEARCH`` it keeps up with, and the rounds offer
``--over`` times that (docs/design/0072).

Reported per step: goodput within the SLO, defaults, the models not asked and the batcher's
expiries (from the stages' ``/metrics``), and CPU per query over every process of that
pipeline. The summary is the median goodput of each variant and their ratio.

    .venv/bin/python -m bench.hopeless [--quick] [--over 1.5 | --rate 450] [--rounds 2] [--seconds 11] [--quantile 0.5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.common import Pipeline, load_step, say, wait_warm, warm_up, write_json
from bench.cost import APP, SLO_MS, build
from bench.load import json_bodies, unique_inputs
from bench.load_kafka import KafkaLoad
from bench.machine import machine_info

COUNTERS = {"not_asked": "clipstream_selector_not_asked_total", "expired": "clipstream_batcher_expired_total"}
SEARCH = (200.0, 300.0, 400.0, 500.0, 600.0, 800.0, 1000.0)  # q/s, the capacity search's steps
SEARCH_SECONDS = 6.0
KEPT_UP = 0.95  # goodput within the SLO / offered: the step was no overload


def kept_up(offered: float, goodput: float) -> bool:
    return goodput >= KEPT_UP * offered


def overload_rate(steps: Sequence[tuple[float, float]], over: float) -> tuple[float, float]:
    """(capacity, rate to offer) from the search's (offered, goodput) steps: the capacity is the
    highest offered rate kept up with, or the lowest step's goodput when none was."""
    capacity = max((o for o, g in steps if kept_up(o, g)), default=None)
    if capacity is None:
        capacity = steps[0][1]
    return capacity, float(round(over * capacity, -1))


def find_capacity(pipe: Pipeline, kl: KafkaLoad, over: float) -> tuple[float, float, list[dict[str, float]]]:
    """Rising steps until one is not kept up with; (capacity, rate to offer, the steps)."""
    steps: list[tuple[float, float]] = []
    for i, rate in enumerate(SEARCH):
        s = load_step(pipe, APP, rate, SLO_MS, SEARCH_SECONDS, kafka_load=kl, seed=10 + i, label="capacity: ")
        steps.append((rate, s["goodput_qps"]))
        if not kept_up(rate, s["goodput_qps"]):
            break
    capacity, offered = overload_rate(steps, over)
    say(f"hopeless: asking every model kept up with {capacity:g} q/s; the rounds offer {over:g}x: {offered:g} q/s")
    return capacity, offered, [{"offered_qps": o, "goodput_qps": g} for o, g in steps]


def metric_urls(pipe: Pipeline) -> list[str]:
    """Every stage's /metrics, from the lines ``clipstream up`` printed."""
    return [line.split()[-1] for line in pipe.lines if line.startswith("metrics: ") and line.endswith("/metrics")]


def counters(urls: list[str]) -> dict[str, float]:
    """The sum over every stage and label of each counter in COUNTERS."""
    key_of = {name: key for key, name in COUNTERS.items()}
    out = dict.fromkeys(COUNTERS, 0.0)
    for url in urls:
        for family in text_string_to_metric_families(httpx.get(url, timeout=10).text):
            for sample in family.samples:
                if sample.name in key_of:
                    out[key_of[sample.name]] += sample.value
    return out


def step(pipe: Pipeline, kl: KafkaLoad, variant: str, rate: float, seconds: float, seed: int) -> dict[str, Any]:
    urls = metric_urls(pipe)
    before = counters(urls)
    s = load_step(pipe, APP, rate, SLO_MS, seconds, kafka_load=kl, seed=seed, label=f"{variant}: ")
    s.pop("_run")
    after = counters(urls)
    row = {"variant": variant, "rate": rate, "goodput_qps": s["goodput_qps"], "answered": s["answered"],
           "default": s["default"], "lost": s["lost"], "p99_ms": s["latency_ms"]["p99"],
           "cpu_us_per_query": round(sum(s["cpu_ms_per_query"].values()) * 1e3, 1),
           **{k: after[k] - before[k] for k in COUNTERS}}
    say(f"    {variant}: goodput {row['goodput_qps']:.0f} q/s, defaults {row['default']}, not asked "
        f"{row['not_asked']:.0f}, batcher expiries {row['expired']:.0f}, CPU {row['cpu_us_per_query']:,.0f} µs/query")
    return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=None,
                    help="offered q/s, onto the queries topic (default: --over times the capacity found)")
    ap.add_argument("--over", type=float, default=1.5, help="the rounds' rate over the capacity found")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=11.0, help="length of each step")
    ap.add_argument("--quantile", type=float, default=0.5, help="the skip's setting in the pipeline that skips")
    ap.add_argument("--quick", action="store_true", help="one round of 8 s steps")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.seconds = 1, 8.0
    variants = {"skip": str(args.quantile), "ask": "0"}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-hopeless-") as tmp, ExitStack() as stack:
        app_file = build(Path(tmp))
        pipes, loads = {}, {}
        for name, quantile in variants.items():
            say(f"hopeless: pipeline '{name}', CLIPSTREAM_SELECTOR_HOPELESS_QUANTILE={quantile}")
            pipes[name] = stack.enter_context(Pipeline(app_file, env={"CLIPSTREAM_SELECTOR_HOPELESS_QUANTILE": quantile}))
            loads[name] = KafkaLoad(pipes[name].settings(), keep_trace=False)
            stack.callback(loads[name].close)
            wait_warm(pipes[name].url, APP, json_bodies(unique_inputs(1))[0])
            warm_up(pipes[name], APP, kafka_load=loads[name])
        capacity, search = None, []
        if args.rate is None:
            capacity, args.rate, search = find_capacity(pipes["ask"], loads["ask"], args.over)
        for r in range(args.rounds):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            say(f"hopeless: round {r + 1} of {args.rounds}, {' then '.join(order)}, {args.rate:g} q/s")
            for i, name in enumerate(order):
                row = step(pipes[name], loads[name], name, args.rate, args.seconds, seed=100 + r)
                rows.append({**row, "round": r + 1, "first": i == 0})
    median = {name: statistics.median(x["goodput_qps"] for x in rows if x["variant"] == name) for name in variants}
    summary = {"median_goodput_qps": median,
               "skip_vs_ask": round(median["skip"] / median["ask"], 2) if median["ask"] else None,
               "not_asked": sum(x["not_asked"] for x in rows if x["variant"] == "skip"),
               "capacity_qps": capacity, "capacity_search": search,
               "ask_kept_up": kept_up(args.rate, median["ask"])}
    say(f"hopeless: median goodput skip {median['skip']:.0f} / ask every model {median['ask']:.0f} q/s "
        f"= {summary['skip_vs_ask']}x")
    report = {"machine": machine_info(), "settings": {**vars(args), "app": APP, "slo_ms": SLO_MS, "path": "kafka"},
              "rows": rows, "summary": summary}
    write_json("hopeless", report)
    return report


if __name__ == "__main__":
    main()
