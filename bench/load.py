"""Open-loop load generator: Poisson or Gamma arrivals, through the gateway or straight into Kafka.

Arrivals follow InferLine's workload model: gaps drawn from a Gamma distribution with the given
mean rate and coefficient of variation (CV 1 is a Poisson process, CV 0 a constant rate, CV > 1
bursty). The generator is open loop: each query is sent at its scheduled time whether or not the
earlier ones have been answered, and its latency runs from that scheduled time (a generator
that falls behind does not hide the system's queueing: no coordinated omission).

Two ways in, each a module of its own:
- ``gateway`` (``bench.load_http``): one task per query over a pool of keep-alive connections;
- ``kafka`` (``bench.load_kafka``): a confluent-kafka Producer writes QueryEvents to the queries
  topic with a private reply topic, and a consumer thread reads the Responses (their trace
  stamps come along).
This module holds what both share: the arrival process, the outcomes and their summary, the
inputs, and the command line.

Every query's outcome is recorded (answered, default, error, lost = no answer at all); the
summary gives throughput, goodput within the SLO, p50/p90/p99/p99.9 and the fraction of SLO
misses (a default, an error, a lost query or a late answer is a miss), plus the generator's own
CPU use (process time / wall time) and how late it sent (its lag behind the schedule).

    .venv/bin/python -m bench.load --url http://127.0.0.1:8080 --app digits --rate 200 --duration 10
    .venv/bin/python -m bench.load --mode kafka --bootstrap 127.0.0.1:9092 --app digits --rate 500
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.stats import percentiles
from clipstream.clock import now_us

if TYPE_CHECKING:
    from schemas import Tensor

OUTCOMES = ("answered", "default", "error", "lost")


# --- the arrival process (pure) -----------------------------------------------------------------


def arrival_gaps(rate: float, cv: float, n: int, seed: int = 0) -> np.ndarray:
    """``n`` inter-arrival gaps (seconds): Gamma with mean 1/rate and coefficient of variation cv.

    cv = 1 is exponential (Poisson arrivals); cv = 0 is a constant gap.
    """
    if rate <= 0:
        raise ValueError("rate must be > 0")
    if cv < 0:
        raise ValueError("cv must be >= 0")
    if cv == 0:
        return np.full(n, 1.0 / rate)
    shape = 1.0 / (cv * cv)
    return np.random.default_rng(seed).gamma(shape, 1.0 / (rate * shape), n)


def arrival_times(rate: float, cv: float, duration_s: float, seed: int = 0) -> np.ndarray:
    """Send times (seconds from the start) of every arrival before ``duration_s``."""
    n = int(rate * duration_s * 1.2 + 10 * math.sqrt(rate * duration_s + 1) + 10)
    while True:
        times = np.cumsum(arrival_gaps(rate, cv, n, seed))
        if times[-1] >= duration_s:
            return times[times < duration_s]
        n *= 2


def gap_stats(gaps: Sequence[float] | np.ndarray) -> tuple[float, float]:
    """(rate, cv) of observed gaps."""
    g = np.asarray(gaps, dtype=np.float64)
    mean = float(g.mean())
    return 1.0 / mean, float(g.std() / mean)


# --- records and statistics (pure) ---------------------------------------------------------------


@dataclass
class Outcome:
    """One query: when it was due (epoch us), when it was really sent, when its answer came."""

    index: int
    sched_us: int
    sent_us: int = 0
    recv_us: int = 0  # 0: no answer
    outcome: str = "lost"
    query_id: str = ""
    output: Any = None
    trace: dict[str, int] = field(default_factory=dict)
    server_ms: float = math.nan  # the gateway's own latency_ms for the call (200 answers)
    status: int = 0  # the HTTP status (gateway runs; 0: none came)
    # when the answer reached the generator's socket, by the kernel's stamp (gateway runs with
    # the raw client; 0: none): recv_us minus the generator's own delay in reading it
    arrived_us: int = 0
    detail: str = ""  # the gateway's reason for an error status (gateway runs)

    @property
    def latency_ms(self) -> float:
        return (self.recv_us - self.sched_us) / 1000.0 if self.recv_us else math.nan


def summarize(results: Sequence[Outcome], slo_ms: float, duration_s: float, *, warmup_s: float = 0.0,
              start_us: int | None = None) -> dict[str, Any]:
    """Throughput, goodput, latency percentiles and SLO misses of the queries due after warm-up.

    ``latency`` percentiles are over queries that got any answer (defaults included);
    ``effective`` ones count every miss (default, error, lost, late) as infinitely slow, so
    "effective p99 <= SLO" means at least 99% of queries got a real answer within the SLO.
    """
    if not results:
        return {"sent": 0}
    t0 = start_us if start_us is not None else min(r.sched_us for r in results)
    lo = t0 + int(warmup_s * 1e6)
    window = [r for r in results if r.sched_us >= lo]
    span = max(1e-9, duration_s - warmup_s)
    n = len(window)
    counts = {k: 0 for k in OUTCOMES}
    for r in window:
        counts[r.outcome] = counts.get(r.outcome, 0) + 1
    lat = np.array([r.latency_ms for r in window], dtype=np.float64)
    good = np.array([r.outcome == "answered" and r.latency_ms <= slo_ms for r in window], dtype=bool)
    effective = np.where(good, lat, math.inf)
    lag = np.array([(r.sent_us - r.sched_us) / 1000.0 for r in window if r.sent_us], dtype=np.float64)
    # the same answers timed from when the generator really sent: without its own lag, which on
    # a shared machine is the instrument's delay, not the system's (``latency`` keeps it: open loop)
    from_send = np.array([(r.recv_us - r.sent_us) / 1000.0 for r in window if r.sent_us and r.recv_us],
                         dtype=np.float64)
    # and to when the answer reached the generator's socket (kernel stamp): without its read delay
    to_arrival = np.array([(r.arrived_us - r.sent_us) / 1000.0 for r in window if r.sent_us and r.arrived_us],
                          dtype=np.float64)
    return {
        "sent": n,
        "offered_qps": n / span,
        **{k: counts[k] for k in OUTCOMES},
        "throughput_qps": (counts["answered"] + counts["default"]) / span,
        "goodput_qps": int(good.sum()) / span,
        "slo_ms": slo_ms,
        "slo_miss": float(1.0 - good.mean()) if n else math.nan,
        "latency_ms": percentiles(lat),
        "effective_ms": percentiles(effective),
        "mean_ms": float(np.nanmean(lat)) if n and not np.isnan(lat).all() else math.nan,
        "send_lag_ms": percentiles(lag, (50.0, 99.0)) if lag.size else {},
        "latency_from_send_ms": percentiles(from_send),
        **({"latency_send_to_arrival_ms": percentiles(to_arrival)} if to_arrival.size else {}),
    }


# --- what both drivers share (bench.load_http, bench.load_kafka) ---------------------------------


@dataclass
class RunResult:
    results: list[Outcome]
    start_us: int
    duration_s: float
    wall_s: float
    cpu_s: float

    @property
    def cpu_share(self) -> float:
        """The generator's CPU time over the run's wall time (1.0 = one core busy)."""
        return self.cpu_s / max(1e-9, self.wall_s)

    def summary(self, slo_ms: float, warmup_s: float = 0.0) -> dict[str, Any]:
        s = summarize(self.results, slo_ms, self.duration_s, warmup_s=warmup_s, start_us=self.start_us)
        s["generator_cpu_share"] = round(self.cpu_share, 3)
        return s

    def refusal_reasons(self) -> dict[str, int]:
        """The gateway's 503 reasons, counted with their numbers blanked: which rule refused."""
        from clipstream.testing.callers import refusal_reasons

        refused = [r for r in self.results if r.status == 503]
        return refusal_reasons(json.loads(r.detail).get("detail", "") if r.detail.startswith("{") else r.detail
                               for r in refused)


Progress = Callable[[str], None]


def ticker(label: str, total: int, done: Callable[[], int], progress: Progress | None,
           stop: threading.Event) -> threading.Thread:
    def run() -> None:
        while not stop.wait(2.0):
            if progress:
                progress(f"    {label}: {done()}/{total} answered")
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def without_gc_pauses(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``fn`` with the garbage collector off, then back as it was.

    The load generator must not stall: with a run's Outcomes and tasks alive, one collection
    of its oldest generation took 40-70 ms (timed with ``gc.callbacks``), and that pause lands
    in the callers' latency as if the system under test had made it. The run's garbage waits
    until the run is over."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was_enabled:
                gc.enable()
    return wrapper


# --- inputs -------------------------------------------------------------------------------------


def unique_inputs(n: int, shape: Sequence[int] = (64,), seed: int = 0, high: int = 17) -> np.ndarray:
    """``n`` distinct float32 inputs with digit-like values 0..16 (no prediction-cache hits)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, high, size=(n, *shape)).astype(np.float32)
    x.reshape(n, -1)[:, 0] = np.arange(n) % high  # spread; collisions are negligible anyway
    return x


def json_bodies(inputs: np.ndarray, slo_ms: float | None = None) -> list[bytes]:
    extra = f', "slo_ms": {slo_ms:g}' if slo_ms is not None else ""
    return [(f'{{"input": {json.dumps(row.astype(int).tolist() if np.all(row == np.round(row)) else row.tolist())}'
             f'{extra}}}').encode() for row in inputs]


def tensors(inputs: np.ndarray) -> list[Tensor]:
    """One ``Tensor`` record per row, for the Kafka way in."""
    from schemas import Tensor

    return [Tensor.of(np.ascontiguousarray(row)) for row in inputs]


def format_summary(s: dict[str, Any]) -> str:
    lat, eff = s.get("latency_ms", {}), s.get("effective_ms", {})
    return (f"offered {s.get('offered_qps', 0):7.1f} q/s  answered {s.get('goodput_qps', 0):7.1f} q/s in SLO  "
            f"p50 {lat.get('p50', math.nan):6.1f}  p99 {lat.get('p99', math.nan):6.1f}  "
            f"p99.9 {lat.get('p99.9', math.nan):6.1f} ms  eff.p99 {eff.get('p99', math.nan):6.1f}  "
            f"miss {s.get('slo_miss', math.nan):6.2%}  (def {s.get('default', 0)}, err {s.get('error', 0)}, "
            f"lost {s.get('lost', 0)})  gen cpu {s.get('generator_cpu_share', math.nan):.2f}")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("gateway", "kafka"), default="gateway")
    ap.add_argument("--url", default="http://127.0.0.1:8080", help="gateway (mode gateway)")
    ap.add_argument("--bootstrap", default=None, help="Kafka (mode kafka); default CLIPSTREAM_KAFKA_BOOTSTRAP")
    ap.add_argument("--app", required=True)
    ap.add_argument("--rate", type=float, required=True, help="mean arrival rate, queries/s")
    ap.add_argument("--cv", type=float, default=1.0, help="coefficient of variation of the gaps (1 = Poisson)")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds of arrivals")
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds left out of the statistics")
    ap.add_argument("--slo-ms", type=float, default=50.0, help="the SLO the queries carry and are judged by")
    ap.add_argument("--shape", default="64", help="input shape, comma-separated (float32, values 0..16)")
    ap.add_argument("--connections", type=int, default=256, help="gateway keep-alive connections")
    ap.add_argument("--client", choices=("raw", "httpx"), default="raw", help="HTTP client (mode gateway)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the summary here")
    args = ap.parse_args(argv)
    times = arrival_times(args.rate, args.cv, args.duration, args.seed)
    shape = tuple(int(s) for s in args.shape.split(","))
    inputs = unique_inputs(len(times), shape, args.seed)
    print(f"{len(times)} queries over {args.duration:g}s ({args.mode}, rate {args.rate:g}, cv {args.cv:g})", flush=True)
    if args.mode == "gateway":
        from bench.load_http import run_gateway

        run = run_gateway(args.url, args.app, json_bodies(inputs, args.slo_ms), times,
                          max_connections=args.connections, progress=print, client=args.client)
    else:
        from bench.load_kafka import KafkaLoad
        from clipstream.settings import get_settings

        settings = get_settings(**({"kafka_bootstrap": args.bootstrap} if args.bootstrap else {}))
        load = KafkaLoad(settings)
        try:
            run = load.run(args.app, tensors(inputs), times, args.slo_ms, progress=print)
        finally:
            load.close()
    summary = run.summary(args.slo_ms, args.warmup)
    print(format_summary(summary), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    return summary


if __name__ == "__main__":
    main()
