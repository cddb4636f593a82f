"""One benchmark run: a fresh model (its own topics), its batcher and worker, open-loop load,
the consumer of predictions and batch stats, and the run's figures (``Bench.run``)."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.batching.helpers import (
    FIXED_AIMD_OBJECTIVE_MS,
    OBJECTIVE_MS,
    Obs,
    categorise_stacks,
    fmt_ms,
    log,
    parse_stats_line,
    summarise,
    top_leaves,
    within_deadline_objective_ms,
)
from bench.batching.procs import Child, LoadGen, stop_all, wait_ready
from bench.machine import cpu_delta, cpu_snapshot
from bench.tap import Handler, Tap
from schemas import BatchStats, Predictions, Record

if TYPE_CHECKING:  # imported lazily where used
    from topics.catalogue import Catalogue


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


@dataclass
class _Window:
    """What the measured load leaves for the run's figures, carried from ``Bench._measure``
    (which must stay timing-tight) to ``Bench._result`` (which runs after the children stop)."""

    t0_us: int
    t1_us: int
    sent: dict[str, Any]
    cpu0: dict[str, float]
    cpu1: dict[str, float]
    spies: list[tuple[str, subprocess.Popen[bytes], Path]]
    slow_wall: float | None


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
        # AIMD's objective on the service time where goodput counts within the deadline
        self.aimd_objective_ms = within_deadline_objective_ms(getattr(args, "aimd_objective_ms", None))

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
                    "PYTHONUNBUFFERED": "1",
                    # goodput counts a prediction at the predictions topic, so the batcher's margin
                    # for the hop on to the selector would drop requests this benchmark counts as
                    # in time (3 ms: ~8% of goodput at 300 q/s bursty, and eager credit locked
                    # into batches of 1)
                    "CLIPSTREAM_BATCHER_HOPELESS_MARGIN_MS": str(self.args.hopeless_margin_ms)}
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
            profile: bool = False, no_cache: bool = False, batcher_env: dict[str, str] | None = None,
            deadline_ms: float | None = None, aimd_objective_ms: float = OBJECTIVE_MS) -> RunResult:
        """One batcher and worker of ``model`` under an open loop; ``aimd_objective_ms`` is AIMD's
        objective on the batch's service time (Clipper's 20 ms unless a reading says otherwise)."""
        name, folder, cat = self._new_model(model, slowdown)
        objective_us = self.deadline_us if deadline_ms is None else int(deadline_ms * 1000)
        bargs, env = self._batcher_argv(name, fixed, max_batch, aimd_objective_ms, delay_ms, no_cache, batcher_env)
        t_start = time.monotonic()
        obs: list[Obs] = []
        batches: list[tuple[int, int, int]] = []
        tap = None
        batcher, worker = self._children(name, folder, bargs, env)
        try:
            startup_s = wait_ready([batcher, worker])
            # the tap: predictions from their current ends, this model's batch stats from the start
            tap = Tap(self.settings, [cat.predictions], from_beginning=[cat.batch_stats(name)])
            tap.start(_observer(name, obs, batches))
            job = self._load_job(model, name, cat, objective_us, rate_qps, period_s, duty)
            if prefill:
                self._prefill(job, obs, pool, name)
            window = self._measure(job, batcher, worker, folder, warmup_s=warmup_s, measure_s=measure_s,
                                   pool=pool, profile=profile, slowdown=slowdown, slowdown_at_s=slowdown_at_s)
        finally:
            if tap is not None:
                tap.close()
            batcher.stop()
            worker.stop()
        res = self._result(label, obs, batches, objective_us, startup_s, batcher, window)
        self._log_run(label, res.summary, startup_s, t_start)
        return res

    def _new_model(self, model: Model, slowdown: float) -> tuple[str, Path, Catalogue]:
        """A fresh model name, folder and topics for every run, so that no run reads another's
        requests, predictions or consumer offsets."""
        from clipstream.testing.models import set_slowdown
        from topics.admin import ensure_model_topics
        from topics.catalogue import Catalogue

        self.n += 1
        name = f"{model.kind}-{self.n}"
        folder = model.make(self.models_root, name)
        set_slowdown(folder, slowdown)
        cat = Catalogue.from_settings(self.settings)
        ensure_model_topics(self.settings, name, 1)
        return name, folder, cat

    def _batcher_argv(self, name: str, fixed: int | None, max_batch: int, aimd_objective_ms: float,
                      delay_ms: float | None, no_cache: bool,
                      batcher_env: dict[str, str] | None) -> tuple[list[str], dict[str, str]]:
        """The batcher's command line and environment: a fixed size is AIMD pinned at that size
        with an objective nothing misses, so the real batcher serves both kinds of run."""
        bargs = ["batcher", "--model", name, "--version", "1", "--replicas", "1"]
        env = {**self.env, **(batcher_env or {})}
        if fixed is not None:
            bargs += ["--max-batch-size", str(fixed), "--latency-objective-ms", str(FIXED_AIMD_OBJECTIVE_MS)]
            env["CLIPSTREAM_BATCHER_AIMD_START"] = str(fixed)
        else:
            bargs += ["--max-batch-size", str(max_batch), "--latency-objective-ms", str(aimd_objective_ms)]
        if delay_ms is not None:
            bargs += ["--batch-delay-ms", str(delay_ms)]
        if no_cache or self.args.no_cache:
            bargs += ["--no-cache"]
        return bargs, env

    def _children(self, name: str, folder: Path, bargs: list[str], env: dict[str, str]) -> tuple[Child, Child]:
        """The run's batcher and worker processes, started together so that their start-ups overlap."""
        batcher = Child(f"{name}-batcher", bargs, env, self.logs)
        worker = Child(f"{name}-worker", ["worker", "--model", name, "--path", str(folder), "--replica", "0",
                                           "--replicas", "1", "--version", "1", "--device", "cpu"], env, self.logs)
        return batcher, worker

    def _load_job(self, model: Model, name: str, cat: Catalogue, objective_us: int, rate_qps: float | None,
                  period_s: float, duty: float) -> dict[str, Any]:
        """The load generator's settings shared by the prefill and the measured load, so both
        target the same topic with the same deadlines."""
        return dict(bootstrap=self.status.kafka_bootstrap, topic=cat.requests(name).name, model=name,
                    partitions=cat.predictions.partitions, objective_us=objective_us,
                    qid_prefix=f"{name}-", rate_qps=rate_qps or model.rate_qps * self.args.rate_scale,
                    period_s=period_s, duty=duty)

    def _prefill(self, job: dict[str, Any], obs: list[Obs], pool: int, name: str) -> None:
        """Sends the pool once and waits for its answers, so the cache is warm before the measured
        load; its answers are then forgotten and the measured load's ids told apart."""
        assert self.loadgen is not None
        self.loadgen.start(**{**job, "rate_qps": 200.0, "period_s": 0.0, "duty": 1.0},
                           start=time.time() + 0.05, duration_s=pool / 200 + 0.01, pool=pool)
        self.loadgen.result()
        deadline = time.monotonic() + 10
        while sum(1 for o in obs if o.status == "ok") < pool and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        obs.clear()
        job["qid_prefix"] = f"{name}-again-"

    def _measure(self, job: dict[str, Any], batcher: Child, worker: Child, folder: Path, *, warmup_s: float,
                 measure_s: float, pool: int, profile: bool, slowdown: float,
                 slowdown_at_s: float | None) -> _Window:
        """The open-loop load and its measurement window in one place, since the load's start, the
        sleeps to the window's edges and the CPU snapshots time one another."""
        from clipstream.testing.models import set_slowdown

        assert self.loadgen is not None
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
        procs = {p: k for k, p in pids.items() if p}
        cpu0 = cpu_snapshot(procs)
        if profile:
            spies = self._spy({"batcher": batcher.pid, "worker": worker.pid}, measure_s)
        slow_wall = None
        if slowdown_at_s is not None:
            _sleep_until(start + slowdown_at_s)
            set_slowdown(folder, 2.0 * slowdown)
            slow_wall = time.time()
        _sleep_until(start + duration)
        cpu1 = cpu_snapshot(procs)
        sent = self.loadgen.result()
        time.sleep(0.3)  # answers still on their way
        return _Window(t0_us, t1_us, sent, cpu0, cpu1, spies, slow_wall)

    def _result(self, label: str, obs: list[Obs], batches: list[tuple[int, int, int]], objective_us: int,
                startup_s: float, batcher: Child, w: _Window) -> RunResult:
        """The run's figures from what the tap saw in the window, the load sent and the CPU used,
        with the batcher's max batch size trace and the profiles when asked for."""
        summary = summarise(obs, w.t0_us, w.t1_us, objective_us, batches)
        summary["offered_qps"] = w.sent["sent"] / max(1e-9, w.sent["elapsed_s"])
        summary["startup_s"] = round(startup_s, 2)
        summary["loadavg_1min_after"] = round(os.getloadavg()[0], 2)
        summary["cpu_s"] = cpu_delta(w.cpu0, w.cpu1)
        max_batch_trace = [(t, max(r["max_batch_size"] for r in s["replicas"]))
                           for t, line in batcher.lines if (s := parse_stats_line(line)) and s.get("replicas")]
        res = RunResult(label, summary, obs, batches, max_batch_trace, w.t0_us, w.t1_us)
        if w.slow_wall is not None:
            res.extra["slowdown_at_us"] = int(w.slow_wall * 1e6)
        if w.spies:
            res.extra["profile"] = self._spy_results(w.spies)
        return res

    def _log_run(self, label: str, s: dict[str, Any], startup_s: float, t_start: float) -> None:
        """The run's progress line (and its latency by hop with --verbose), so a long benchmark
        shows each run's figures as it goes."""
        log(f"  {label:28s} offered {s['offered_qps']:7.0f}  goodput {s['goodput_qps']:7.0f} qps  "
            f"ok {s['ok_qps']:7.0f}  expired {s['expired_qps']:6.0f}  batch {s['mean_batch']:5.1f}  "
            f"p50 {fmt_ms(s['latency_ms_p50'])} ms  (start {startup_s:.1f}s, run {time.monotonic() - t_start:.1f}s)")
        if self.args.verbose:
            log("      hops p50 ms: " + ", ".join(f"{k} {v}" for k, v in s["hop_ms_p50"].items()))

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


def _sleep_until(t: float) -> None:
    while (d := t - time.time()) > 0:
        time.sleep(min(d, 0.05))


def _observer(model: str, obs: list[Obs], batches: list[tuple[int, int, int]]) -> Handler:
    """The tap's handler: ``model``'s predictions into ``obs``, its BatchStats into ``batches``."""

    def on(rec: Record, msg: Any, now: int) -> None:
        if isinstance(rec, Predictions):
            ts_type, ts_ms = msg.timestamp()
            ts_us = ts_ms * 1000 if ts_type else None
            for p in rec.items:
                if p.model != model:
                    continue
                tr = p.trace
                out = tr.get("worker_out") or tr.get("batched") or now
                obs.append(Obs(p.status, tr.get("produced", 0), out, now, tr.get("batcher_in"),
                               tr.get("batched"), ts_us, tr.get("worker_in")))
        elif isinstance(rec, BatchStats) and rec.model == model:
            batches.append((rec.created_us, rec.batch_size, rec.service_us))

    return on
