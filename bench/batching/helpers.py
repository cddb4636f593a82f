"""Pure helpers of the real-broker batching benchmark: the profiles' latency curves, the open
loop's arrivals, the figures of a measurement window, py-spy stack categories, formatting.

Unit-tested in tests/unit/test_bench_batching.py (no broker, no timing assertions).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.stats import percentile
from clipstream.testing.models import CLOCKWORK

ROOT = Path(__file__).resolve().parents[2]
OBJECTIVE_MS = 20.0
FIXED_AIMD_OBJECTIVE_MS = 1e6  # an AIMD objective nothing misses: a fixed batch size


def within_deadline_objective_ms(override: float | None = None) -> float:
    """AIMD's objective on a batch's service time in the runs that count answers within the
    request deadline: the model's latency objective, 20 ms, as in Clipper and the batcher's
    default, unless ``--aimd-objective-ms`` tightens it. AIMD grows the batch up to it; the
    batcher cuts each batch to what its latency curve says fits the oldest deadline, so a
    20 ms objective under a 20 ms deadline does not make answers late
    (``docs/design/0002-aimd-at-the-20-ms-objective.md``)."""
    if override is not None and override > 0:
        return override
    return OBJECTIVE_MS


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def latency_fn(table: Mapping[int, float] | None = None, fixed_ms: float | None = None,
               per_item_ms: float | None = None) -> Callable[[int], float]:
    """The profile backend's own batch-size -> ms curve (interpolated, linear beyond the ends)."""
    from workers.backends.profile_backend import LatencyProfile

    if fixed_ms is not None or per_item_ms is not None:
        prof = LatencyProfile.linear(float(fixed_ms or 0.0), float(per_item_ms or 0.0))
    else:
        prof = LatencyProfile(table if table is not None else CLOCKWORK)
    return prof.latency_ms


def device_max(latency_ms: Callable[[int], float], objective_ms: float, max_batch: int = 4096,
               slowdown: float = 1.0) -> dict[str, float]:
    """What the device alone can do: the batch size b with latency(b) <= objective that has
    the highest b / latency(b), and that rate (queries per second)."""
    best = {"batch_size": 0, "latency_ms": 0.0, "qps": 0.0}
    for b in range(1, max_batch + 1):
        ms = latency_ms(b) * slowdown
        if ms > objective_ms:
            continue
        qps = b / ms * 1000.0 if ms > 0 else math.inf
        if qps > best["qps"]:
            best = {"batch_size": b, "latency_ms": ms, "qps": qps}
    return best


def arrivals_due(t_s: float, rate_qps: float, period_s: float = 0.0, duty: float = 1.0,
                 ramp_s: float = 0.0) -> int:
    """Requests an open-loop generator must have sent ``t_s`` seconds after its start.

    Constant rate when ``period_s`` is 0 or ``duty`` is 1, reached by a linear ramp over the
    first ``ramp_s`` seconds (0: at once); otherwise an on/off square wave (no ramp): during
    the first ``duty`` of every period requests come at ``rate / duty``, then none, so the
    mean rate is still ``rate_qps`` (bursty load).
    """
    if t_s <= 0 or rate_qps <= 0:
        return 0
    if period_s <= 0 or duty >= 1.0:
        if ramp_s > 0:
            if t_s < ramp_s:
                return int(rate_qps * t_s * t_s / (2 * ramp_s))
            return int(rate_qps * (t_s - ramp_s / 2))
        return int(rate_qps * t_s)
    full, frac = divmod(t_s, period_s)
    on = min(frac, duty * period_s)
    return int(rate_qps * (full * period_s) + rate_qps / duty * on)


@dataclass
class Obs:
    """One prediction as the benchmark's consumer saw it (epoch microseconds)."""

    status: str
    produced_us: int
    out_us: int  # when its answer was made: worker_out (ok) or batched (cached / expired)
    consume_us: int
    batcher_in_us: int | None = None
    batched_us: int | None = None
    kafka_ts_us: int | None = None
    worker_in_us: int | None = None


HOPS = (  # (name, from stamp, to stamp) of an ok prediction's trace, in order
    ("produced->batcher_in", "produced_us", "batcher_in_us"),
    ("batcher_in->batched", "batcher_in_us", "batched_us"),
    ("batched->worker_in", "batched_us", "worker_in_us"),
    ("worker_in->worker_out", "worker_in_us", "out_us"),
    ("worker_out->consumed", "out_us", "consume_us"),
)


def hop_medians(obs: Iterable[Obs]) -> dict[str, float | None]:
    """Median ms of each hop of the ok predictions' traces (where does the latency go)."""
    deltas: dict[str, list[float]] = {name: [] for name, _, _ in HOPS}
    for o in obs:
        if o.status != "ok":
            continue
        for name, a, b in HOPS:
            x, y = getattr(o, a), getattr(o, b)
            if x is not None and y is not None:
                deltas[name].append((y - x) / 1000)
    return {k: (round(v, 2) if (v := percentile(xs, 50)) is not None else None) for k, xs in deltas.items()}


def summarise(obs: Iterable[Obs], t0_us: int, t1_us: int, objective_us: int,
              batches: Iterable[tuple[int, int, int]] = ()) -> dict[str, Any]:
    """Figures of one measurement window [t0, t1): goodput = ok answers made within the
    objective (out - produced <= objective) per second, counted by when they were made.

    ``batches``: (created_us, batch_size, service_us) of the worker's BatchStats.
    """
    span_s = max(1e-9, (t1_us - t0_us) / 1e6)
    counts: Counter[str] = Counter()
    ok_lat, e2e_lat = [], []
    in_time = 0
    window = [o for o in obs if t0_us <= o.out_us < t1_us]
    for o in window:
        counts[o.status] += 1
        if o.status == "ok":
            lat = o.out_us - o.produced_us
            ok_lat.append(lat / 1000)
            e2e_lat.append((o.consume_us - o.produced_us) / 1000)
            in_time += lat <= objective_us
    sizes, services = [], []
    for created, size, service in batches:
        if t0_us <= created < t1_us:
            sizes.append(size)
            services.append(service / 1000)
    return {
        "goodput_qps": in_time / span_s,
        "ok_qps": counts["ok"] / span_s,
        "expired_qps": counts["expired"] / span_s,
        "answered_qps": sum(counts.values()) / span_s,
        "in_time_fraction": in_time / counts["ok"] if counts["ok"] else 0.0,
        "counts": dict(counts),
        "latency_ms_p50": percentile(ok_lat, 50),
        "latency_ms_p99": percentile(ok_lat, 99),
        "e2e_ms_p50": percentile(e2e_lat, 50),
        "batches_per_s": len(sizes) / span_s,
        "mean_batch": statistics.fmean(sizes) if sizes else 0.0,
        "service_ms_p50": percentile(services, 50),
        "service_ms_p99": percentile(services, 99),
        "device_busy": sum(services) / 1000 / span_s,
        "hop_ms_p50": hop_medians(window),
    }


def goodput_series(obs: Iterable[Obs], t0_us: int, t1_us: int, bin_s: float, objective_us: int | None) -> list[float]:
    """Goodput (qps) in consecutive bins of ``bin_s`` from t0 to t1, by answer time; with
    ``objective_us`` None, every ok answer counts (throughput instead of goodput)."""
    n = max(1, int((t1_us - t0_us) / 1e6 / bin_s))
    bins = [0] * n
    for o in obs:
        if (o.status == "ok" and t0_us <= o.out_us < t1_us
                and (objective_us is None or o.out_us - o.produced_us <= objective_us)):
            i = int((o.out_us - t0_us) / 1e6 / bin_s)
            if i < n:
                bins[i] += 1
    return [c / bin_s for c in bins]


def recovery(series: Sequence[float], bin_s: float, target: float, hold_bins: int) -> float | None:
    """Seconds from the series' start until the rolling mean of ``hold_bins`` bins first
    reaches ``target`` (the end of that window: when it was known); None if never."""
    for i in range(len(series) - hold_bins + 1):
        if statistics.fmean(series[i:i + hold_bins]) >= target:
            return (i + hold_bins) * bin_s
    return None


def batches_between(batches: Iterable[tuple[int, int, int]], t0_us: int, t1_us: int) -> int:
    return sum(1 for created, _, _ in batches if t0_us <= created < t1_us)


def parse_stats_line(line: str) -> dict[str, Any] | None:
    """The batcher's ``stats: {json}`` line, or None for any other line."""
    line = line.strip()
    if not line.startswith("stats:"):
        return None
    try:
        return json.loads(line[len("stats:"):])
    except ValueError:
        return None


CATEGORIES: list[tuple[str, tuple[str, ...]]] = [
    ("epoll wait (idle or waking)", ("EpollSelector.select",)),
    ("asyncio socket send/recv (syscalls)", ("selector_events.py",)),
    ("librdkafka calls (produce, poll, flush, commit)",
     ("Worker.produce (", "Outputs.produce (", "Worker.serve (", "Worker.run (")),
    ("model (onnxruntime / profile sleep)", ("onnxruntime", "profile_backend", "onnx_backend")),
    ("avro encode/decode", ("fastavro", "schemas/")),
    ("kafka client", ("aiokafka", "confluent_kafka", "kafka/")),
    ("redis client", ("redis/",)),
    ("faust / mode framework", ("faust/", "mode/")),
    ("batcher logic", ("batchers/",)),
    ("worker logic", ("workers/",)),
    ("numpy", ("numpy/",)),
    ("asyncio event loop", ("asyncio/", "uvloop", "selectors.py")),
]


def categorise_stacks(lines: Iterable[str]) -> dict[str, int]:
    """Samples per category from py-spy's raw (collapsed) output: ``f (file:line);g (...) N``.

    A sample goes to the category of its innermost frame that matches one (so time inside a
    library called from batcher code is the library's); otherwise ``other``.
    """
    out: Counter[str] = Counter()
    for line in lines:
        line = line.strip()
        if not line:
            continue
        stack, _, count = line.rpartition(" ")
        try:
            n = int(count)
        except ValueError:
            continue
        frames = stack.split(";")
        cat = "other"
        for frame in reversed(frames):
            hit = next((name for name, keys in CATEGORIES if any(k in frame for k in keys)), None)
            if hit is not None:
                cat = hit
                break
        out[cat] += n
    return dict(out)


def top_leaves(lines: Iterable[str], n: int = 10) -> list[tuple[str, int]]:
    """The ``n`` innermost frames with the most samples in py-spy's raw output."""
    out: Counter[str] = Counter()
    for line in lines:
        stack, _, count = line.strip().rpartition(" ")
        if stack and count.isdigit():
            out[stack.split(";")[-1].strip()] += int(count)
    return out.most_common(n)


def sweep_sizes(kind: str, quick: bool) -> list[int]:
    """Fixed batch sizes to measure for a model kind (the quick run keeps a few)."""
    if kind == "clockwork":
        return [1, 16] if quick else [1, 2, 4, 8, 12, 16, 20, 32]
    return [1] if quick else [1, 2, 4, 8, 16, 32, 64, 128, 256]


def best_of(rows: Mapping[str, Mapping[str, Any]], prefix: str = "fixed") -> tuple[str | None, float]:
    """(label, goodput) of the best row whose label starts with ``prefix``."""
    cands = [(k, r["goodput_qps"]) for k, r in rows.items() if k.startswith(prefix)]
    return max(cands, key=lambda kv: kv[1]) if cands else (None, 0.0)


def fmt_ms(x: float | None) -> str:
    return "  -  " if x is None else f"{x:5.1f}"


def fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def ratio(base: float | None, x: float | None) -> float | None:
    """x / base, or None when either is missing or the base is 0."""
    return x / base if base and x is not None else None
