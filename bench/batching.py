"""Benchmark of the model abstraction layer ALONE, on a real Kafka broker and a real Redis.

``requests.<model>`` in -> ``clipstream batcher`` -> ``batches.<model>`` -> ``clipstream worker``
-> ``predictions`` out. The benchmark plays the selector on both sides: a load generator (its
own process) produces ``ModelRequest`` records straight into ``requests.<model>`` (deadline =
now + objective, ``selector_partition`` spread over the partitions of ``predictions``), and a
consumer reads ``predictions`` (and ``batch-stats.<model>``, the workers' per-batch reports).
Batcher and worker are the real CLI processes, started per run, each waited on for its
``ready:`` line and stopped at the end of the run.

Every run gets its own model name (so its own topics and consumer groups) under one private
broker + Redis (``launcher.up`` with free ports in a temporary state dir), stopped at the end,
also on Ctrl-C. Sections:

* ``throughput``: ok predictions answered within the objective per second (goodput), at a
  20 ms objective, open loop above capacity, for no batching (batch size 1), fixed batch
  sizes, and AIMD; for (a) the simulated accelerator with Clockwork's ResNet-50 table, (b) a
  high-fixed-cost profile (5 ms per batch + 0.05 ms per item, like the paper's SVM), (c) the
  scikit-learn digits logistic regression exported to ONNX. A *fixed* size N is the real
  batcher with ``--max-batch-size N``, AIMD started at N (``CLIPSTREAM_BATCHER_AIMD_START``)
  and an AIMD objective nothing misses (``--latency-objective-ms 1e6``): the size never moves.
  The request deadline (20 ms) is set by the load generator, not by that flag.
* ``adapt``: AIMD on the Clockwork profile when the model becomes 2x slower mid-run
  (``set_slowdown``), against fixed sizes measured at the slower speed.
* ``delayed``: delayed batching off (0 ms) vs on, AIMD, the high-fixed-cost profile, moderate
  bursty load.
* ``cache``: cache hits: batcher in -> predictions topic out.
* ``cost``: the ONNX model's CPU cost per query, per process (/proc/<pid>/stat), and where the
  batcher's and the worker's Python time goes (py-spy, when installed).

    .venv/bin/python -m bench.batching            # ~7 min; out/bench/batching.json and .png
    .venv/bin/python -m bench.batching --quick    # ~2-3 min smoke run (fewer sizes, shorter runs)
    .venv/bin/python -m bench.batching --sections throughput --models clockwork --deadline-ms 100 \
        --rate-scale 1.6 --out out/bench/d100     # a looser request deadline, more load
    (--verbose: latency by hop per run; --keep: keep the process logs and py-spy stacks)

Offered load is open loop: a linear ramp over the first half of each run's warm-up (a step
from nothing to the full rate puts a just-started batcher more than a deadline behind at
once, and it never catches up), then the constant rate, whether or not answers come back.
Every run has the same warm-up and measurement window; figures count answers made in the
window. ``goodput`` = ok answers made within the request deadline; ``ok throughput`` = ok
answers, any latency (the batch latency is still bounded by the 20 ms AIMD objective).

The discrete-event simulation that used to live here is ``bench/batching_sim.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OBJECTIVE_MS = 20.0
CLOCKWORK: dict[int, float] = {1: 2.61, 2: 3.78, 4: 5.61, 8: 9.13, 16: 15.67}
SVM_FIXED_MS, SVM_PER_ITEM_MS = 5.0, 0.05
FIXED_AIMD_OBJECTIVE_MS = 1e6  # an AIMD objective nothing misses: a fixed batch size


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# =====================================================================================
# pure helpers (unit-tested in tests/unit/test_bench_batching.py)
# =====================================================================================


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


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (k - lo))


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


def cpu_ticks(pid: int) -> int | None:
    """utime + stime of ``pid`` (all its threads) in clock ticks, from /proc/<pid>/stat."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12])


CATEGORIES: list[tuple[str, tuple[str, ...]]] = [
    ("epoll wait (idle or waking)", ("EpollSelector.select",)),
    ("asyncio socket send/recv (syscalls)", ("selector_events.py",)),
    ("librdkafka calls (produce, poll, flush, commit)", ("Worker.produce (", "Worker.serve (", "Worker.run (")),
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


# =====================================================================================
# load generator (its own process, spawned once; jobs over a pipe)
# =====================================================================================


def _loadgen_main(conn: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    import numpy as np
    from confluent_kafka import Producer

    from clipstream.settings import Settings
    from schemas import encode, to_tensor
    from tests.models import digits
    from topics.client import producer_config

    base = digits()[0]
    producers: dict[str, Any] = {}
    conn.send({"ready": os.getpid()})
    while True:
        job = conn.recv()
        if job is None:
            break
        if job["bootstrap"] not in producers:
            producers[job["bootstrap"]] = Producer(producer_config(Settings(kafka_bootstrap=job["bootstrap"])))
        producer = producers[job["bootstrap"]]
        pool = job.get("pool") or 0
        n_parts, objective_us = job["partitions"], job["objective_us"]
        topic, model, prefix = job["topic"], job["model"], job["qid_prefix"]
        start, duration = job["start"], job["duration_s"]
        rate, period, duty = job["rate_qps"], job.get("period_s", 0.0), job.get("duty", 1.0)
        ramp = job.get("ramp_s", 0.0)
        sent = 0
        while time.time() < start:
            time.sleep(0.001)
        while True:
            now = time.time()
            t = now - start
            if t >= duration:
                break
            due = arrivals_due(t, rate, period, duty, ramp)
            while sent < due:
                i = sent if not pool else sent % pool
                x = base[i % len(base)].copy()
                x[0] = float(i)  # unique input per request (pool: the same inputs again)
                now_us = time.time_ns() // 1000
                record = {"query_id": f"{prefix}{sent}", "app": "bench", "model": model,
                          "input": to_tensor(np.asarray(x, np.float32)), "deadline_us": now_us + objective_us,
                          "selector_partition": sent % n_parts, "trace": {"produced": now_us}}
                while True:
                    try:
                        producer.produce(topic, encode("ModelRequest", record))
                        break
                    except BufferError:
                        producer.poll(0.01)
                sent += 1
                if sent % 64 == 0:
                    producer.poll(0)
            producer.poll(0)
            time.sleep(0.0005)
        producer.flush(10)
        conn.send({"sent": sent, "elapsed_s": time.time() - start})


class LoadGen:
    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_loadgen_main, args=(child,), daemon=True)
        self.proc.start()
        self.pid = self.conn.recv()["ready"]

    def start(self, **job: Any) -> None:
        self.conn.send(job)

    def result(self, timeout_s: float = 60) -> dict[str, Any]:
        if not self.conn.poll(timeout_s):
            raise RuntimeError("load generator did not finish")
        return self.conn.recv()

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


# =====================================================================================
# processes
# =====================================================================================

CHILDREN: list["Child"] = []


class Child:
    """A clipstream CLI subprocess: stdout lines timestamped by a reader thread, stderr to a log."""

    def __init__(self, name: str, args: Sequence[str], env: Mapping[str, str], log_dir: Path,
                 wrap: Sequence[str] = ()) -> None:
        from clipstream.infra import _die_with_parent_hook

        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self.lines: list[tuple[float, str]] = []
        self._err = open(self.log_path, "w")
        argv = [*wrap, sys.executable, "-m", "clipstream.cli", *args]
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=dict(env), stdout=subprocess.PIPE, stderr=self._err,
                                     stdin=subprocess.DEVNULL, text=True, bufsize=1,
                                     preexec_fn=_die_with_parent_hook())
        CHILDREN.append(self)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def ready(self) -> bool:
        return any(line.startswith("ready:") for _, line in self.lines)

    def tail(self) -> str:
        try:
            return self.log_path.read_text()[-2000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._reader.join(2)
        self._err.close()
        if self in CHILDREN:
            CHILDREN.remove(self)


def wait_ready(children: Sequence[Child], timeout_s: float = 120) -> float:
    t0 = time.monotonic()
    while not all(c.ready() for c in children):
        for c in children:
            if c.proc.poll() is not None:
                raise RuntimeError(f"{c.name} exited during start-up:\n{c.tail()}")
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError("not ready in time: " + ", ".join(c.name for c in children if not c.ready()))
        time.sleep(0.05)
    return time.monotonic() - t0


def stop_all() -> None:
    for c in list(CHILDREN):
        try:
            c.stop()
        except Exception as exc:  # keep stopping the others
            log(f"stopping {c.name}: {exc}")


# =====================================================================================
# one run
# =====================================================================================


@dataclass
class Model:
    kind: str  # clockwork | svm | onnx
    label: str
    make: Callable[[Path, str], Path]  # (root, name) -> folder
    rate_qps: float  # offered load for the throughput runs (above capacity)


@dataclass
class RunResult:
    label: str
    summary: dict[str, Any]
    obs: list[Obs] = field(repr=False)
    batches: list[tuple[int, int, int]] = field(repr=False)
    max_batch: list[tuple[float, int]] = field(repr=False)  # (wall s, max batch size) from stats lines
    t0_us: int = 0
    t1_us: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.quick = args.quick
        self.tmp = Path(tempfile.mkdtemp(prefix="bench-batching-"))
        self.models_root = self.tmp / "models"
        self.logs = self.tmp / "logs"
        self.logs.mkdir(parents=True)
        self.status: Any = None
        self.settings: Any = None
        self.loadgen: LoadGen | None = None
        self.n = 0
        self.env: dict[str, str] = {}
        self.deadline_us = int(args.deadline_ms * 1000)

    # -- infra ------------------------------------------------------------------------
    def start(self) -> None:
        from clipstream.infra import launcher
        from clipstream.settings import Settings
        from topics.admin import ensure_core_topics

        self.infra_settings = Settings(state_dir=self.tmp / "state")
        t = time.monotonic()
        self.status = launcher.up(self.infra_settings, free_ports=True, progress=lambda m: log(f"infra: {m}"),
                                  die_with_parent=True)
        log(f"infra up in {time.monotonic() - t:.1f}s: kafka {self.status.kafka_bootstrap}, redis {self.status.redis_url}")
        prefix = f"bench{uuid.uuid4().hex[:6]}."
        self.settings = Settings(kafka_bootstrap=self.status.kafka_bootstrap, redis_url=self.status.redis_url,
                                 topic_prefix=prefix, state_dir=self.tmp / "state")
        self.env = {**os.environ, **self.status.env(), "CLIPSTREAM_TOPIC_PREFIX": prefix,
                    "CLIPSTREAM_BATCHER_STATS_LOG_INTERVAL_S": "0.2", "CLIPSTREAM_WORKER_DEVICE": "cpu",
                    "PYTHONUNBUFFERED": "1"}
        ensure_core_topics(self.settings)
        self.loadgen = LoadGen()

    def stop(self) -> None:
        stop_all()
        if self.loadgen is not None:
            self.loadgen.stop()
        if self.status is not None:
            from clipstream.infra import launcher

            log("stopping broker and Redis")
            launcher.down(self.infra_settings)
        if not self.args.keep:
            shutil.rmtree(self.tmp, ignore_errors=True)

    # -- a run -----------------------------------------------------------------------
    def run(self, model: Model, label: str, *, fixed: int | None = None, max_batch: int = 1024,
            delay_ms: float | None = None, rate_qps: float | None = None, period_s: float = 0.0,
            duty: float = 1.0, warmup_s: float = 1.5, measure_s: float = 3.0, slowdown: float = 1.0,
            slowdown_at_s: float | None = None, pool: int = 0, prefill: bool = False,
            profile: bool = False, no_cache: bool = False) -> RunResult:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        from topics.admin import ensure_model_topics
        from topics.catalogue import Catalogue
        from topics.client import consumer_config
        from tests.models import set_slowdown

        self.n += 1
        name = f"{model.kind}-{self.n}"
        folder = model.make(self.models_root, name)
        set_slowdown(folder, slowdown)
        cat = Catalogue.from_settings(self.settings)
        ensure_model_topics(self.settings, name, 1)
        objective_us = self.deadline_us

        bargs = ["batcher", "--model", name, "--version", "1", "--replicas", "1"]
        env = dict(self.env)
        if fixed is not None:
            bargs += ["--max-batch-size", str(fixed), "--latency-objective-ms", str(FIXED_AIMD_OBJECTIVE_MS)]
            env["CLIPSTREAM_BATCHER_AIMD_START"] = str(fixed)
        else:
            bargs += ["--max-batch-size", str(max_batch), "--latency-objective-ms", str(OBJECTIVE_MS)]
        if delay_ms is not None:
            bargs += ["--batch-delay-ms", str(delay_ms)]
        if no_cache or self.args.no_cache:
            bargs += ["--no-cache"]
        t_start = time.monotonic()
        obs: list[Obs] = []
        batches: list[tuple[int, int, int]] = []
        consumer_stop = threading.Event()
        consumer = th = None
        batcher = Child(f"{name}-batcher", bargs, env, self.logs)
        worker = Child(f"{name}-worker", ["worker", "--model", name, "--path", str(folder), "--replica", "0",
                                           "--replicas", "1", "--version", "1", "--device", "cpu"], env, self.logs)
        try:
            startup_s = wait_ready([batcher, worker])
            # the consumer: predictions from their current ends, this model's batch stats from the start
            consumer = Consumer(consumer_config(self.settings, f"bench-{uuid.uuid4().hex[:8]}",
                                                **{"enable.auto.commit": False}))
            parts = []
            for p in range(cat.predictions.partitions):
                _, high = consumer.get_watermark_offsets(TopicPartition(cat.predictions.name, p), timeout=10)
                parts.append(TopicPartition(cat.predictions.name, p, high))
            parts.append(TopicPartition(cat.batch_stats(name).name, 0, OFFSET_BEGINNING))
            consumer.assign(parts)
            stop = consumer_stop
            th = threading.Thread(target=_consume, args=(consumer, name, obs, batches, stop), daemon=True)
            th.start()

            assert self.loadgen is not None
            job = dict(bootstrap=self.status.kafka_bootstrap, topic=cat.requests(name).name, model=name,
                       partitions=cat.predictions.partitions, objective_us=objective_us,
                       qid_prefix=f"{name}-", rate_qps=rate_qps or model.rate_qps * self.args.rate_scale,
                       period_s=period_s, duty=duty)
            if prefill:  # send the pool once and wait for its answers: the cache is now warm
                self.loadgen.start(**{**job, "rate_qps": 200.0, "period_s": 0.0, "duty": 1.0},
                                   start=time.time() + 0.05, duration_s=pool / 200 + 0.01, pool=pool)
                self.loadgen.result()
                deadline = time.monotonic() + 10
                while sum(1 for o in obs if o.status == "ok") < pool and time.monotonic() < deadline:
                    time.sleep(0.05)
                time.sleep(0.3)
                obs.clear()
                job["qid_prefix"] = f"{name}-again-"
            duration = warmup_s + measure_s
            start = time.time() + 0.1
            # open loop, but reached by a ramp over the first half of the warm-up: a step from 0 to
            # the full rate puts a just-started batcher behind by more than a deadline at once
            self.loadgen.start(**job, start=start, duration_s=duration, pool=pool,
                               ramp_s=warmup_s / 2 if self.args.ramp else 0.0)
            t0_us = int((start + warmup_s) * 1e6)
            t1_us = int((start + duration) * 1e6)
            pids = {"batcher": batcher.pid, "worker": worker.pid, "kafka": self.status.kafka_pid,
                    "redis": self.status.redis_pid, "loadgen": self.loadgen.pid, "bench (consumer)": os.getpid()}
            spies: list[tuple[str, subprocess.Popen[bytes], Path]] = []
            _sleep_until(start + warmup_s)
            cpu0 = {k: cpu_ticks(p) for k, p in pids.items() if p}
            if profile:
                spies = self._spy({"batcher": batcher.pid, "worker": worker.pid}, measure_s)
            slow_wall = None
            if slowdown_at_s is not None:
                _sleep_until(start + slowdown_at_s)
                set_slowdown(folder, 2.0 * slowdown)
                slow_wall = time.time()
            _sleep_until(start + duration)
            cpu1 = {k: cpu_ticks(p) for k, p in pids.items() if p}
            sent = self.loadgen.result()
            time.sleep(0.3)  # answers still on their way
        finally:
            consumer_stop.set()
            if th is not None:
                th.join(5)
            if consumer is not None:
                consumer.close()
            batcher.stop()
            worker.stop()
        summary = summarise(obs, t0_us, t1_us, objective_us, batches)
        summary["offered_qps"] = sent["sent"] / max(1e-9, sent["elapsed_s"])
        summary["startup_s"] = round(startup_s, 2)
        summary["loadavg_1min_after"] = round(os.getloadavg()[0], 2)
        hz = os.sysconf("SC_CLK_TCK")
        cpu_s = {k: (cpu1[k] - cpu0[k]) / hz for k in cpu0 if cpu0.get(k) is not None and cpu1.get(k) is not None}
        summary["cpu_s"] = {k: round(v, 3) for k, v in cpu_s.items()}
        max_batch_trace = [(t, max(r["max_batch_size"] for r in s["replicas"]))
                           for t, line in batcher.lines if (s := parse_stats_line(line)) and s.get("replicas")]
        res = RunResult(label, summary, obs, batches, max_batch_trace, t0_us, t1_us)
        if slow_wall is not None:
            res.extra["slowdown_at_us"] = int(slow_wall * 1e6)
        if spies:
            res.extra["profile"] = self._spy_results(spies)
        s = summary
        log(f"  {label:28s} offered {s['offered_qps']:7.0f}  goodput {s['goodput_qps']:7.0f} qps  "
            f"ok {s['ok_qps']:7.0f}  expired {s['expired_qps']:6.0f}  batch {s['mean_batch']:5.1f}  "
            f"p50 {_fmt(s['latency_ms_p50'])} ms  (start {startup_s:.1f}s, run {time.monotonic() - t_start:.1f}s)")
        if self.args.verbose:
            log("      hops p50 ms: " + ", ".join(f"{k} {v}" for k, v in s["hop_ms_p50"].items()))
        return res

    def _spy(self, pids: Mapping[str, int], seconds: float) -> list[tuple[str, subprocess.Popen[bytes], Path]]:
        exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if not Path(exe).exists():
            log("  py-spy not installed: no per-function breakdown (pip install py-spy)")
            return []
        out = []
        for name, pid in pids.items():
            path = self.logs / f"pyspy-{name}.txt"
            proc = subprocess.Popen([exe, "record", "-p", str(pid), "-d", str(max(1, int(seconds))), "-r", "200",
                                     "-f", "raw", "-o", str(path), "--nonblocking"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            out.append((name, proc, path))
        return out

    def _spy_results(self, spies: list[tuple[str, subprocess.Popen[bytes], Path]]) -> dict[str, Any]:
        res = {}
        for name, proc, path in spies:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            try:
                lines = path.read_text().splitlines()
            except OSError:
                lines = []
            cats = categorise_stacks(lines)
            total = sum(cats.values()) or 1
            res[name] = {k: round(v / total, 3) for k, v in sorted(cats.items(), key=lambda kv: -kv[1])}
            res[name]["_samples"] = total
            res[name]["_top_frames"] = [(f, round(c / total, 3)) for f, c in top_leaves(lines)]
        return res


def _fmt(x: float | None) -> str:
    return "  -  " if x is None else f"{x:5.1f}"


def _sleep_until(t: float) -> None:
    while (d := t - time.time()) > 0:
        time.sleep(min(d, 0.05))


def _consume(consumer: Any, model: str, obs: list[Obs], batches: list[tuple[int, int, int]],
             stop: threading.Event) -> None:
    from schemas import decode

    while not stop.is_set():
        # consume(n, t) waits for n messages or all of t: wait for the first only, then take the rest
        first = consumer.poll(0.05)
        if first is None:
            continue
        for msg in [first, *consumer.consume(1000, 0)]:
            if msg.error() is not None:
                continue
            now = time.time_ns() // 1000
            try:
                kind, rec = decode(msg.value())
            except Exception:
                continue
            if kind == "Predictions":
                ts_type, ts_ms = msg.timestamp()
                ts_us = ts_ms * 1000 if ts_type else None
                for p in rec["items"]:
                    if p["model"] != model:
                        continue
                    tr = p["trace"]
                    out = tr.get("worker_out") or tr.get("batched") or now
                    obs.append(Obs(p["status"], tr.get("produced", 0), out, now, tr.get("batcher_in"),
                                   tr.get("batched"), ts_us, tr.get("worker_in")))
            elif kind == "BatchStats" and rec["model"] == model:
                batches.append((int(rec["created_us"]), int(rec["batch_size"]), int(rec["service_us"])))


# =====================================================================================
# sections
# =====================================================================================


def models(quick: bool) -> dict[str, Model]:
    from tests.models import make_onnx_digits_model, make_profile_model

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
        log(f"throughput: {m.label}, offered {m.rate_qps * b.args.rate_scale:g} qps open loop, objective {OBJECTIVE_MS:g} ms")
        runs: dict[str, RunResult] = {}
        for size in sweep_sizes(kind, q):
            label = "no batching (1)" if size == 1 else f"fixed {size}"
            runs[label] = b.run(m, label, fixed=size, warmup_s=warm, measure_s=meas)
        runs["AIMD"] = b.run(m, "AIMD", warmup_s=warm, measure_s=meas)
        out[kind] = runs
        rows = {k: r.summary for k, r in runs.items()}
        entry: dict[str, Any] = {"label": m.label, "offered_qps_target": m.rate_qps * b.args.rate_scale, "runs": rows}
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
                 "aimd_vs_best_fixed": aimd / best if best else None,
                 "aimd_vs_no_batching": aimd / none if none else None,
                 "best_fixed_vs_no_batching": best / none if none else None}
            if dev is not None:
                e["aimd_vs_device_max"] = aimd / dev["qps"]
                e["best_fixed_vs_device_max"] = best / dev["qps"]
            entry[metric] = e
            log(f"  => {metric}: best fixed {best_label} {best:.0f} qps; AIMD {aimd:.0f} qps "
                f"(x{_r(e['aimd_vs_best_fixed'])} of best fixed, x{_r(e['aimd_vs_no_batching'])} of no batching"
                + (f", x{_r(e['aimd_vs_device_max'])} of device max {dev['qps']:.0f} qps at b={dev['batch_size']})"
                   if dev else ")"))
        report["throughput"][kind] = entry
    return out


def section_adapt(b: Bench, ms: dict[str, Model], report: dict[str, Any]) -> RunResult:
    m = ms["clockwork"]
    half = 3.0 if b.quick else 5.0
    log(f"adapt: {m.label}, AIMD, the model becomes 2x slower at t = {half:g} s")
    fixed_slow: dict[str, dict[str, Any]] = {}
    for size in ([8] if b.quick else [4, 8, 12]):
        r = b.run(m, f"fixed {size} @ 2x slower", fixed=size, slowdown=2.0, warmup_s=1.0,
                  measure_s=2.0 if b.quick else 3.0)
        fixed_slow[f"fixed {size}"] = r.summary
    r = b.run(m, "AIMD, slows down mid-run", warmup_s=half, measure_s=half, slowdown_at_s=half)
    dl = b.deadline_us
    slow_us = r.extra["slowdown_at_us"]
    start_us = r.t0_us - int(half * 1e6)
    win = int(min(2.0, half - 1.0) * 1e6)
    before = summarise(r.obs, slow_us - win, slow_us, dl, r.batches)
    after = summarise(r.obs, r.t1_us - win, r.t1_us, dl, r.batches)
    bin_s, hold = 0.1, 5
    entry: dict[str, Any] = {
        "fixed_at_2x_slower": fixed_slow, "aimd_before": before, "aimd_after": after,
        "windows_s": win / 1e6,
        "recovery_rule": f"first {hold * bin_s:g} s window after the slowdown whose rate >= 90% of the new best "
                         "fixed size's; batches = BatchStats created from the slowdown to the end of that window",
        "device_max_before": device_max(latency_fn(CLOCKWORK), OBJECTIVE_MS),
        "device_max_after": device_max(latency_fn(CLOCKWORK), OBJECTIVE_MS, slowdown=2.0),
        "max_batch_before_median": _median_between(r.max_batch, (slow_us - win) / 1e6, slow_us / 1e6),
        "max_batch_after_median": _median_between(r.max_batch, (r.t1_us - win) / 1e6, r.t1_us / 1e6),
    }
    for metric, key, objective in (("goodput", "goodput_qps", dl), ("ok throughput", "ok_qps", None)):
        new_label, new_best = best_of({k: {"goodput_qps": v[key]} for k, v in fixed_slow.items()})
        series = goodput_series(r.obs, slow_us, r.t1_us, bin_s, objective)
        rec_s = recovery(series, bin_s, 0.9 * new_best, hold) if new_best else None
        rec_batches = batches_between(r.batches, slow_us, slow_us + int(rec_s * 1e6)) if rec_s is not None else None
        entry[metric] = {
            "new_best_fixed": new_label, "new_best_fixed_qps": new_best,
            "aimd_before_qps": before[key], "aimd_after_qps": after[key],
            "aimd_after_vs_new_best": after[key] / new_best if new_best else None,
            "recovery_s": rec_s, "recovery_batches": rec_batches,
        }
        log(f"  => {metric}: before {before[key]:.0f} qps, after {after[key]:.0f} qps; new best {new_label} "
            f"{new_best:.0f} qps (after/new best {_r(entry[metric]['aimd_after_vs_new_best'])}); "
            f"back to 90% in {rec_s} s = {rec_batches} batches")
    log(f"  => AIMD max batch size median before {entry['max_batch_before_median']}, "
        f"after {entry['max_batch_after_median']}")
    entry["trace"] = {
        "t0_s": start_us / 1e6, "slowdown_s": (slow_us - start_us) / 1e6,
        "max_batch": [(round(t - start_us / 1e6, 3), v) for t, v in r.max_batch],
        "batches": [(round((c - start_us) / 1e6, 4), sz, round(sv / 1000, 2)) for c, sz, sv in r.batches
                    if c >= start_us],
        "goodput_bins": goodput_series(r.obs, start_us, r.t1_us, 0.25, dl),
        "ok_bins": goodput_series(r.obs, start_us, r.t1_us, 0.25, None),
        "bin_s": 0.25,
    }
    report["adapt"] = entry
    return r


def _median_between(trace: Sequence[tuple[float, int]], t0: float, t1: float) -> float | None:
    vals = [v for t, v in trace if t0 <= t < t1]
    return statistics.median(vals) if vals else None


def section_delayed(b: Bench, ms: dict[str, Model], report: dict[str, Any]) -> None:
    m = ms["svm"]
    rates = [500.0] if b.quick else [300.0, 600.0]
    delays = [0.0, 2.0] if b.quick else [0.0, 2.0, 5.0]
    period, duty = 0.1, 0.5
    log(f"delayed batching: {m.label}, AIMD, bursty load (on {duty * period * 1000:g} ms / off "
        f"{(1 - duty) * period * 1000:g} ms)")
    rows: dict[str, Any] = {}
    for rate in rates:
        for delay in delays:
            label = f"{rate:g} qps, delay {delay:g} ms"
            r = b.run(m, label, delay_ms=delay, rate_qps=rate, period_s=period, duty=duty,
                      warmup_s=1.0 if b.quick else 1.5, measure_s=2.0 if b.quick else 3.0)
            rows[label] = r.summary
    entry: dict[str, Any] = {"burst": {"period_s": period, "duty": duty}, "runs": rows, "ratios": {}}
    for rate in rates:
        off = rows[f"{rate:g} qps, delay 0 ms"]
        for delay in delays[1:]:
            on = rows[f"{rate:g} qps, delay {delay:g} ms"]
            entry["ratios"][f"{rate:g} qps, delay {delay:g} vs 0 ms"] = {
                "goodput": on["goodput_qps"] / off["goodput_qps"] if off["goodput_qps"] else None,
                "batches_per_s": on["batches_per_s"] / off["batches_per_s"] if off["batches_per_s"] else None,
                "device_busy": on["device_busy"] / off["device_busy"] if off["device_busy"] else None,
            }
    report["delayed"] = entry
    for k, v in entry["ratios"].items():
        log(f"  => {k}: goodput x{_r(v['goodput'])}, batches/s x{_r(v['batches_per_s'])}, device busy x{_r(v['device_busy'])}")


def _r(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def section_cache(b: Bench, ms: dict[str, Model], report: dict[str, Any]) -> None:
    m = ms["onnx"]
    log("cache: the same inputs again (the worker filled the cache), 200 qps")
    r = b.run(m, "cache hits", rate_qps=200.0, pool=100 if b.quick else 200, prefill=True, warmup_s=0.5,
              measure_s=1.5 if b.quick else 3.0)
    hits = [o for o in r.obs if o.status == "cached" and o.batcher_in_us]
    def ms_of(xs: list[float]) -> dict[str, float | None]:
        return {"p50": percentile(xs, 50), "p90": percentile(xs, 90), "p99": percentile(xs, 99)}
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
    log(f"  => {len(hits)} hits; batcher_in -> consumed p50 {_fmt(entry['batcher_in_to_consumed_ms']['p50'])} ms, "
        f"-> answer made p50 {_fmt(entry['batcher_in_to_answer_made_ms']['p50'])} ms, "
        f"produced -> consumed p50 {_fmt(entry['produced_to_consumed_ms']['p50'])} ms")


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


# =====================================================================================
# figure and main
# =====================================================================================


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(15, 10))
    ax = axes[0][0]
    for kind, e in report.get("throughput", {}).items():
        labels = list(e["runs"])
        line, = ax.plot(range(len(labels)), [max(0.5, e["runs"][k]["goodput_qps"]) for k in labels], "o-",
                        label=f"{e['label']}: goodput")
        ax.plot(range(len(labels)), [max(0.5, e["runs"][k]["ok_qps"]) for k in labels], "s--", color=line.get_color(),
                label="  ok throughput (any latency)", alpha=0.6)
        for i, k in enumerate(labels):
            if k == "AIMD":
                ax.plot(i, max(0.5, e["runs"][k]["ok_qps"]), "k*", ms=12)
        if "device_max" in e:
            ax.axhline(e["device_max"]["qps"], ls=":", lw=1, color=line.get_color())
    allk = max((list(e["runs"]) for e in report.get("throughput", {}).values()), key=len, default=[])
    ax.set_xticks(range(len(allk)), allk, rotation=45, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("qps (goodput: ok within the deadline; 0 drawn at 0.5)")
    ax.set_title("real broker + Redis: no batching / fixed / AIMD (*); dotted = device max")
    ax.legend(fontsize=7)

    ad = report.get("adapt")
    ax = axes[0][1]
    if ad:
        tr = ad["trace"]
        ax.plot([t for t, _, _ in tr["batches"]], [s for _, s, _ in tr["batches"]], ".", ms=2, label="batch size (worker)")
        ax.step([t for t, _ in tr["max_batch"]], [v for _, v in tr["max_batch"]], where="post", label="AIMD max (stats: lines)")
        ax.axvline(tr["slowdown_s"], color="grey", ls="--")
        ax.set_xlabel("time (s)")
        ax.set_ylabel("batch size")
        ax2 = ax.twinx()
        for key, color, name in (("goodput_bins", "r", "goodput"), ("ok_bins", "m", "ok throughput")):
            g = tr[key]
            ax2.plot([(i + 0.5) * tr["bin_s"] for i in range(len(g))], g, "-", color=color, lw=1, label=name)
        best = ad["ok throughput"]["new_best_fixed_qps"]
        if best:
            ax2.axhline(best, color="m", ls=":", lw=1)
        ax2.set_ylabel("qps: goodput (red), ok throughput (magenta)")
        ax.legend(fontsize=7, loc="upper right")
        ax.set_title("AIMD, Clockwork profile 2x slower at the dashed line (dotted: best fixed after)")

    de = report.get("delayed")
    ax = axes[1][0]
    if de:
        labels = list(de["runs"])
        x = range(len(labels))
        ax.bar([i - 0.2 for i in x], [de["runs"][k]["goodput_qps"] for k in labels], 0.4, label="goodput (qps)")
        ax.bar([i + 0.2 for i in x], [de["runs"][k]["batches_per_s"] for k in labels], 0.4, label="batches/s")
        ax.set_xticks(list(x), labels, rotation=30, fontsize=7)
        ax.legend(fontsize=7)
        ax.set_title("delayed batching, 5 ms + 0.05 ms/item, bursty load (AIMD)")

    co = report.get("cost")
    ax = axes[1][1]
    if co:
        e = next(iter(co.values()))
        per = e["cpu_us_per_ok_query"]
        ax.bar(list(per), list(per.values()))
        ax.set_ylabel("CPU us per ok query")
        ax.set_title(f"ONNX digits, AIMD at saturation: CPU per query by process (layer {e['layer_us_per_ok_query']} us)")
        ax.tick_params(axis="x", labelsize=7)
    for row in axes:
        for ax in row:
            if not ax.has_data():
                ax.text(0.5, 0.5, "section not run", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


SECTIONS = ("throughput", "adapt", "delayed", "cache", "cost")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="~1 minute smoke run: fewer sizes, shorter runs")
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "bench")
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    ap.add_argument("--models", default="clockwork,svm,onnx", help="models of the throughput section")
    ap.add_argument("--keep", action="store_true", help="keep the temporary dir (process logs)")
    ap.add_argument("--verbose", action="store_true", help="print each run's latency by hop")
    ap.add_argument("--deadline-ms", type=float, default=OBJECTIVE_MS,
                    help="request deadline = produce time + this (the AIMD objective stays 20 ms)")
    ap.add_argument("--no-ramp", dest="ramp", action="store_false",
                    help="step to the full offered load at once instead of a ramp over half the warm-up")
    ap.add_argument("--rate-scale", type=float, default=1.0, help="scale the throughput runs' offered load")
    ap.add_argument("--no-cache", action="store_true", help="run every batcher with --no-cache")
    args = ap.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    sections = [s for s in args.sections.split(",") if s]
    if args.quick and args.sections == ",".join(SECTIONS):
        sections = ["throughput", "cache"]  # ~1 min; name --sections for the others
    args.out.mkdir(parents=True, exist_ok=True)

    def on_term(*_: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    t0 = time.monotonic()
    report: dict[str, Any] = {
        "what": "model abstraction layer alone on a real Kafka broker and Redis: requests.<model> -> batcher -> "
                "worker -> predictions; goodput = ok predictions answered within the objective per second",
        "objective_ms": OBJECTIVE_MS, "request_deadline_ms": args.deadline_ms, "quick": args.quick,
        "ramp": args.ramp, "argv": list(argv) if argv is not None else sys.argv[1:], "host_cpus": os.cpu_count(),
        "load_at_start": os.getloadavg(), "throughput": {},
    }
    b = Bench(args)
    ms = models(args.quick)
    try:
        b.start()
        log("warm-up run (the broker's JIT; not reported)")
        b.run(ms["svm"], "warm-up", rate_qps=1000.0, warmup_s=0.5, measure_s=1.0 if args.quick else 5.0)
        thr: dict[str, dict[str, RunResult]] = {}
        if "throughput" in sections:
            thr = section_throughput(b, ms, report)
        if "adapt" in sections:
            section_adapt(b, ms, report)
        if "delayed" in sections:
            section_delayed(b, ms, report)
        if "cache" in sections:
            section_cache(b, ms, report)
        if "cost" in sections:
            section_cost(b, ms, report, thr)
    except KeyboardInterrupt:
        log("interrupted: stopping everything")
        report["interrupted"] = True
    finally:
        b.stop()
    report["load_at_end"] = os.getloadavg()
    report["wall_s"] = round(time.monotonic() - t0, 1)
    (args.out / "batching.json").write_text(json.dumps(report, indent=1, default=str))
    try:
        plot(report, args.out / "batching.png")
    except Exception as exc:  # a figure problem must not lose the numbers
        log(f"figure failed: {exc}")
    log(f"wrote {args.out / 'batching.json'} and batching.png in {report['wall_s']} s")
    return report


if __name__ == "__main__":
    main()
