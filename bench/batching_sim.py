"""SIMULATION (secondary): the batcher's decision code in simulated time, no broker, no Redis.

The real benchmark, on a real broker and Redis with real batcher and worker processes, is
``bench/batching/`` (``python -m bench.batching``); this one is the colleague's model of it, kept for comparison.
No batching vs fixed batch sizes vs AIMD, AIMD adaptation, delayed batching, and goodput
within a 20 ms deadline under overload beside an ideal batcher's.

A discrete-event simulation driven by the batcher's real decision code (``BatcherCore``:
the deadline queue, per-replica credit, AIMD, delayed batching), with simulated workers whose
batch latency comes from the profile backend's model (``LatencyProfile``: the Clockwork table,
or a fixed cost plus a cost per item) and a fixed one-way Kafka hop. Simulated time makes the
figures repeatable and independent of how busy this machine is; the real-broker behaviour is
covered by the integration tests.

    .venv/bin/python -m bench.batching_sim        # writes out/bench/batching_sim.json and .png
"""

from __future__ import annotations

import heapq
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from batchers.aimd import AIMD
from batchers.core import BatcherCore, Pending
from batchers.dispatch import Dispatcher
from bench.batching.bounds import POLICIES, poisson_arrivals, serve
from bench.batching.helpers import device_max
from workers.backends.profile_backend import LatencyProfile

OBJECTIVE_MS = 20.0
HOP_US = 300  # one Kafka hop (batcher -> worker, worker -> batcher), a typical local figure
PROFILES: dict[str, LatencyProfile] = {
    "clockwork-resnet50": LatencyProfile({1: 2.61, 2: 3.78, 4: 5.61, 8: 9.13, 16: 15.67}),
    "fixed-5ms+0.05ms/item": LatencyProfile.linear(5.0, 0.05),
}
TENSOR = {"dtype": "float32", "shape": [1], "data": b"\0\0\0\0"}


def simulate(
    profile: LatencyProfile,
    *,
    rate_qps: float | None,
    duration_s: float,
    slo_ms: float = 1000.0,
    fixed: int | None = None,
    delay_ms: float = 0.0,
    in_flight: int = 1,
    cap: int = 1024,
    slowdown_at_s: float | None = None,
    seed: int = 1,
) -> dict[str, Any]:
    """One run. ``rate_qps=None`` keeps the queue saturated (capacity); ``fixed`` pins the
    batch size (AIMD start = cap = fixed); otherwise AIMD finds it. Returns summary figures."""
    if fixed is not None:
        # an objective nothing misses: the size stays pinned
        factory: Callable[[], AIMD] = lambda: AIMD(10**12, cap=fixed, start=fixed)  # noqa: E731
    else:
        factory = lambda: AIMD(int(OBJECTIVE_MS * 1000), cap=cap)  # noqa: E731
    core = BatcherCore("m", "1", Dispatcher(1, factory, in_flight, int(delay_ms * 1000), 10**12), coalesce=False)
    rng = random.Random(seed)
    end_us = int(duration_s * 1e6)
    events: list[tuple[int, int, str, Any]] = []
    seq = 0

    def at(t: int, kind: str, data: Any = None) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, data))

    n_req = 0

    def arrive(t: int) -> None:
        nonlocal n_req
        n_req += 1
        req = {"query_id": str(n_req), "input": TENSOR, "deadline_us": t + int(slo_ms * 1000),
               "selector_partition": 0, "trace": {}}
        core.admit(Pending(req, None, t))

    if rate_qps is None:
        slo_ms = 1e9  # capacity runs: nothing may expire, the queue must stay full
        for _ in range(4 * max(cap, fixed or 0)):
            arrive(0)
    else:
        at(int(rng.expovariate(rate_qps) * 1e6), "arrive")
    worker_free = 0
    done = late = expired = 0
    latencies: list[int] = []
    trace: list[tuple[float, int, float]] = []  # (time s, batch size, service ms)
    wake: int | None = 0
    at(0, "poll")
    while events:
        t, _, kind, data = heapq.heappop(events)
        if t > end_us:
            break
        if kind == "arrive":
            arrive(t)
            at(t + max(1, int(rng.expovariate(rate_qps) * 1e6)), "arrive")  # type: ignore[arg-type]
        elif kind == "batch":  # reaches the worker, which runs batches one after another
            record = data
            start = max(t, worker_free)
            slow = 2.0 if slowdown_at_s is not None and start >= slowdown_at_s * 1e6 else 1.0
            service = int(profile.latency_ms(len(record["items"])) * 1000 * slow)
            worker_free = start + service
            at(worker_free + HOP_US, "stats", (record, service, worker_free))
        elif kind == "stats":
            record, service, finished = data
            core.on_stats({"batch_id": record["batch_id"], "batch_size": len(record["items"]), "service_us": service})
            trace.append((finished / 1e6, len(record["items"]), service / 1000))
            for item in record["items"]:
                done += 1
                lat = finished - item["trace"]["arrival"]
                latencies.append(lat)
                late += finished > item["deadline_us"]
            if rate_qps is None:
                for _ in record["items"]:
                    arrive(t)  # closed loop at saturation: keep the queue full
        step = core.poll(t)
        expired += len(step.expired)
        for sent in step.batches:
            for item in sent.record["items"]:
                item["trace"]["arrival"] = int(item["deadline_us"] - slo_ms * 1000)
            at(t + HOP_US, "batch", sent.record)
        if step.wake_us is not None and step.wake_us != wake:
            wake = step.wake_us
            at(max(t, step.wake_us), "poll")
    lat = np.array(latencies or [0]) / 1000
    sizes = [s for _, s, _ in trace]
    services = [s for _, _, s in trace]
    return {
        "throughput_qps": done / duration_s,
        "goodput_qps": (done - late) / duration_s,
        "completed": done,
        "late": late,
        "expired": expired,
        "mean_batch": float(np.mean(sizes)) if sizes else 0.0,
        "p99_batch_ms": float(np.percentile(services, 99)) if services else 0.0,
        "batches_over_objective": float(np.mean([x > OBJECTIVE_MS for x in services])) if services else 0.0,
        "p50_latency_ms": float(np.percentile(lat, 50)),
        "p99_latency_ms": float(np.percentile(lat, 99)),
        "trace": trace,
    }


def main(out_dir: Path = Path("out/bench")) -> dict[str, Any]:
    out_dir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"objective_ms": OBJECTIVE_MS, "hop_us": HOP_US, "capacity": {}, "adapt": {},
                              "delayed": {}, "overload": {}}
    for name, prof in PROFILES.items():
        rows = {"none (1)": simulate(prof, rate_qps=None, duration_s=5, fixed=1)}
        for b in (4, 8, 16, 32, 64, 128, 256, 512):
            rows[f"fixed {b}"] = simulate(prof, rate_qps=None, duration_s=5, fixed=b)
        rows["AIMD"] = simulate(prof, rate_qps=None, duration_s=5)
        report["capacity"][name] = {
            k: {**{x: v for x, v in r.items() if x != "trace"},
                "meets_objective": r["batches_over_objective"] <= 0.1}
            for k, r in rows.items()
        }
    adapt = simulate(PROFILES["clockwork-resnet50"], rate_qps=None, duration_s=6, slowdown_at_s=3.0)
    sizes_before = [s for t, s, _ in adapt["trace"] if 2.0 <= t < 3.0]
    sizes_after = [s for t, s, _ in adapt["trace"] if 5.0 <= t < 6.0]
    report["adapt"] = {"profile": "clockwork-resnet50, 2x slower from t=3 s",
                       "mean_batch_before": float(np.mean(sizes_before)),
                       "mean_batch_after": float(np.mean(sizes_after)),
                       "misses_after": sum(1 for t, _, s in adapt["trace"] if t >= 3.0 and s > OBJECTIVE_MS)}
    prof = PROFILES["fixed-5ms+0.05ms/item"]
    for credit in (2, 4):
        for rate in (200, 800, 1600, 3200):
            for delay in (0.0, 2.0):
                r = simulate(prof, rate_qps=rate, duration_s=5, slo_ms=50, delay_ms=delay, in_flight=credit)
                report["delayed"][f"{rate} qps, delay {delay:g} ms, credit {credit}"] = {
                    x: v for x, v in r.items() if x != "trace"}
    # goodput within a 20 ms deadline (end to end) as load passes the device's best, against
    # the same arrivals served by an ideal batcher with no hop (bench/batching/bounds.py)
    clock = PROFILES["clockwork-resnet50"]
    dev = device_max(clock.latency_ms, OBJECTIVE_MS)
    for rate in (700, 1100, 1400, 2000):
        r = simulate(clock, rate_qps=rate, duration_s=5, slo_ms=OBJECTIVE_MS, in_flight=2)
        arr = poisson_arrivals(rate, 5.0, seed=1)
        ideal = {p: serve(arr, clock.latency_ms, OBJECTIVE_MS, cap=int(dev["batch_size"]), policy=p)["goodput_qps"]
                 / dev["qps"] for p in POLICIES}
        report["overload"][f"{rate} qps"] = {"vs_device": r["goodput_qps"] / dev["qps"], "late": r["late"],
                                             "expired": r["expired"], "mean_batch": r["mean_batch"],
                                             "ideal_vs_device": ideal}
    (out_dir / "batching_sim.json").write_text(json.dumps(report, indent=2))
    _plot(report, adapt["trace"], out_dir / "batching_sim.png")
    return report


def _plot(report: dict[str, Any], trace: list[tuple[float, int, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    for ax, (name, rows) in zip([axes[0]] * 2, report["capacity"].items()):
        labels = list(rows)
        ax.plot(range(len(labels)), [rows[k]["throughput_qps"] for k in labels], "o-", label=name)
        ax.set_xticks(range(len(labels)), labels, rotation=60, fontsize=7)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("throughput at saturation (qps)")
    axes[0].set_title(f"batching strategies, {OBJECTIVE_MS:g} ms objective")
    axes[0].legend(fontsize=7)
    axes[1].plot([t for t, _, _ in trace], [s for _, s, _ in trace], ".", ms=2)
    axes[1].axvline(3.0, color="grey", ls="--")
    axes[1].set_xlabel("time (s)")
    axes[1].set_ylabel("batch size")
    axes[1].set_title("AIMD when the model becomes 2x slower (t = 3 s)")
    rates = sorted({int(k.split()[0]) for k in report["delayed"]})
    for credit in ("2", "4"):
        for delay in ("0", "2"):
            rows = [report["delayed"][f"{r} qps, delay {delay} ms, credit {credit}"] for r in rates]
            axes[2].plot(rates, [x["p99_latency_ms"] for x in rows], "o-",
                         label=f"credit {credit}, delay {delay} ms")
    axes[2].set_ylabel("p99 latency (ms), SLO 50 ms")
    axes[2].set_xscale("log")
    axes[2].set_xlabel("offered load (qps)")
    axes[2].set_title("delayed batching, 5 ms + 0.05 ms/item")
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    rep = main()
    for name, rows in rep["capacity"].items():
        print(name)
        for k, r in rows.items():
            print(f"  {k:10s} throughput {r['throughput_qps']:9.0f} qps  mean batch {r['mean_batch']:6.1f}  "
                  f"p99 batch {r['p99_batch_ms']:6.2f} ms  over objective {100 * r['batches_over_objective']:5.1f}%")
    print("adapt:", rep["adapt"])
    for k, r in rep["overload"].items():
        print(f"  overload {k:9s} goodput x{r['vs_device']:.2f} of the device, {r['late']} late, "
              f"mean batch {r['mean_batch']:.1f}; ideal batcher x{r['ideal_vs_device']['efficient']:.2f} "
              f"(oldest first x{r['ideal_vs_device']['greedy']:.2f})")
    for k, r in rep["delayed"].items():
        print(f"  {k:34s} goodput {r['goodput_qps']:7.0f}  mean batch {r['mean_batch']:5.1f}  "
              f"p50 {r['p50_latency_ms']:6.2f} ms  p99 {r['p99_latency_ms']:6.2f} ms  late {r['late']}")
