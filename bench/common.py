"""The benchmarks' harness: a private pipeline, load steps on it, JSON and PNG reports.

The scenarios (``bench.e2e``, ``bench.efficiency``, ...) are built from the same parts:

- the pipeline: ``Pipeline`` here (``bench.batching`` starts the batcher and worker alone);
- the load generator: ``bench.load`` (arrivals, outcomes, their summary), driven through the
  gateway (``bench.load_http``) or straight into Kafka (``bench.load_kafka``), one step at a
  time by ``load_step`` / ``sweep`` / ``warm_up`` here;
- the statistics: ``bench.stats`` (the one percentile definition), per-process CPU from
  ``bench.machine``, and ``bench.tap`` to read what the pipeline writes to a topic;
- the report: ``write_json`` and ``figure`` / ``save_figure`` here.

``Pipeline`` runs ``clipstream up -f app.yaml --free-ports --state-dir DIR --gateway-port P``
with its own Kafka and Redis (the environment points at unused ports, so an infrastructure
somebody else runs on the default ports is never touched), waits for ``ready:``, and stops
everything with SIGINT at the end. ``Pipeline.processes`` names every pipeline process, so a
benchmark can say where the CPU went per query and per process (``bench.machine``).

Every report is ``out/bench/<name>.json`` with the machine, the settings and the raw figures,
plus ``<name>.png``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from bench.machine import (broker_jit_s, broker_pid, cmdline, cpu_delta, cpu_snapshot, descendants, jit_apart,
                           label_of, warm_until_jit_quiet)

OUT = Path("out/bench")


def say(msg: str) -> None:
    print(msg, flush=True)


# --- the pipeline ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_app_file(path: Path, apps: list[dict[str, Any]], models: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"apps": apps, "models": models}, sort_keys=False))
    return path


class Pipeline:
    """``clipstream up`` on a private broker and Redis; a context manager that always stops it.

    ``env`` adds variables for every stage (e.g. ``CLIPSTREAM_BATCHER_MAX_IN_FLIGHT``). The
    gateway's instance is fixed (``bench``), so its reply topic is known and can be tapped.
    """

    GATEWAY_INSTANCE = "bench"

    def __init__(self, app_file: Path, state_dir: Path | None = None, env: Mapping[str, str] | None = None,
                 timeout_s: float = 240.0, log: Callable[[str], None] = say) -> None:
        self.app_file = Path(app_file).resolve()
        self._tmp = None if state_dir else tempfile.TemporaryDirectory(prefix="clipstream-bench-")
        self.state_dir = Path(state_dir or self._tmp.name).resolve()  # type: ignore[union-attr]
        self.port = free_port()
        self.extra_env = dict(env or {})
        self.timeout_s = timeout_s
        self.log = log
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.kafka = ""
        self.redis = ""
        self.lines: list[str] = []
        self.started_s = 0.0
        self._infra: Any = None  # the settings of the Kafka and Redis started for this pipeline

    def start(self) -> "Pipeline":
        t0 = time.monotonic()
        # the benchmark's own Kafka and Redis, named to `up`, which then uses them and nothing
        # another process runs; they go with this process if it dies
        from clipstream.infra import launcher
        from clipstream.settings import get_settings

        self._infra = get_settings(state_dir=self.state_dir)
        status = launcher.up(self._infra, free_ports=True, progress=lambda m: self.log(f"  [infra] {m}"),
                             die_with_parent=True)
        env = {
            **os.environ,
            "CLIPSTREAM_KAFKA_BOOTSTRAP": status.kafka_bootstrap,
            "CLIPSTREAM_REDIS_URL": status.redis_url,
            "CLIPSTREAM_GATEWAY_INSTANCE": self.GATEWAY_INSTANCE,
            "PYTHONUNBUFFERED": "1",
            **self.extra_env,
        }
        cmd = [sys.executable, "-m", "clipstream.cli", "up", "-f", str(self.app_file), "--free-ports",
               "--state-dir", str(self.state_dir), "--gateway-port", str(self.port)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        assert self.proc.stdout is not None
        deadline = time.monotonic() + self.timeout_s
        ready = threading.Event()

        def read() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                line = line.rstrip()
                self.lines.append(line)
                if not ready.is_set() and not line.startswith("stats:"):
                    self.log(f"  [up] {line}")
                if line.startswith("infra: "):
                    info = dict(kv.split("=", 1) for kv in line[len("infra: "):].split())
                    self.kafka, self.redis = info["kafka"], info["redis"]
                if line.startswith("ready: "):
                    self.url = line[len("ready: "):]
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        while not ready.wait(0.5):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"clipstream up did not get ready; logs in {self.state_dir}/up/")
        self.started_s = time.monotonic() - t0
        self.log(f"  pipeline ready in {self.started_s:.0f}s at {self.url}")
        return self

    @property
    def broker_port(self) -> int | None:
        """The port of the (first) broker the stages send to."""
        first = self.kafka.split(",")[0]
        return int(first.rsplit(":", 1)[1]) if ":" in first else None

    def settings(self) -> Any:
        from clipstream.settings import get_settings

        return get_settings(kafka_bootstrap=self.kafka, redis_url=self.redis)

    def processes(self) -> dict[int, str]:
        """pid -> label of every pipeline process: the stages, the broker and Redis."""
        out: dict[int, str] = {}
        if self.proc is not None:
            out[self.proc.pid] = "up"
            for pid in descendants(self.proc.pid):
                out[pid] = label_of(cmdline(pid))
        try:
            state = json.loads((self.state_dir / "infra.json").read_text())
            for name in ("kafka", "redis"):
                if isinstance(state.get(name), dict) and "pid" in state[name]:
                    out[int(state[name]["pid"])] = name
                    for pid in descendants(int(state[name]["pid"])):
                        out[pid] = name
        except (OSError, ValueError):
            pass
        return out

    def apply(self, app_file: Path) -> None:
        """Apply another app file to the running pipeline (``up`` starts the new stages)."""
        env = {**os.environ, "CLIPSTREAM_KAFKA_BOOTSTRAP": self.kafka, "CLIPSTREAM_REDIS_URL": self.redis}
        subprocess.run([sys.executable, "-m", "clipstream.cli", "apply", "-f", str(app_file)], check=True,
                       env=env, stdout=subprocess.DEVNULL)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.log("  stopping the pipeline ...")
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.log("  `clipstream up` did not stop in 90 s: killing it")
                self.proc.kill()
                self.proc.wait(10)
        if self._infra is not None:
            from clipstream.infra import launcher

            launcher.down(self._infra)
            self._infra = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> "Pipeline":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_warm(url: str, app: str, body: bytes, n: int = 20, timeout_s: float = 60.0) -> None:
    """A few sequential predictions, until real (non-default) answers come back: topics,
    consumer assignments and model warm-up are done before anything is measured."""
    import httpx

    deadline = time.monotonic() + timeout_s
    good = 0
    with httpx.Client(base_url=url, timeout=10) as client:
        while good < n and time.monotonic() < deadline:
            try:
                r = client.post(f"/v1/apps/{app}/predict", content=body,
                                headers={"content-type": "application/json"})
                good += r.status_code == 200 and not r.json().get("default")
            except httpx.HTTPError:
                time.sleep(0.2)
    if good < n:
        raise RuntimeError(f"app {app} gave no real answers within {timeout_s:.0f}s")


# --- reports --------------------------------------------------------------------------------


def write_json(name: str, data: Mapping[str, Any], out_dir: Path = OUT) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, default=_jsonable))
    say(f"wrote {path}")
    return path


def _jsonable(x: Any) -> Any:
    if hasattr(x, "tolist"):
        return x.tolist()
    if isinstance(x, Path):
        return str(x)
    return str(x)


def figure(nrows: int = 1, ncols: int = 1, size: tuple[float, float] | None = None) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=size or (6 * ncols, 4 * nrows), squeeze=False)
    return fig, axes


def save_figure(fig: Any, name: str, out_dir: Path = OUT) -> Path:
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    say(f"wrote {path}")
    return path


# --- load steps -------------------------------------------------------------------------------


def load_step(pipe: Pipeline, app: str, rate: float, slo_ms: float, duration_s: float, *, mode: str = "kafka",
              kafka_load: Any = None, cv: float = 1.0, seed: int = 0, warmup_s: float = 1.0,
              inputs: Any = None, label: str = "") -> dict[str, Any]:
    """One open-loop step at ``rate``; the summary plus each pipeline process's CPU ms per query."""
    from bench import load
    from bench.load_http import run_gateway

    times = load.arrival_times(rate, cv, duration_s, seed)
    x = load.unique_inputs(len(times), seed=seed * 7919 + int(rate)) if inputs is None else inputs
    procs = pipe.processes()
    c0, j0 = cpu_snapshot(procs), broker_jit_s(procs)
    if mode == "kafka":
        run = kafka_load.run(app, load.tensors(x), times, slo_ms)
    else:
        run = run_gateway(pipe.url, app, load.json_bodies(x, slo_ms), times)
    cpu = jit_apart(cpu_delta(c0, cpu_snapshot(procs)), j0, broker_jit_s(procs))
    s = run.summary(slo_ms, warmup_s)
    n = max(1, len(times))
    s["rate"] = rate
    s["mode"] = mode
    s["cpu_ms_per_query"] = {k: round(v * 1000 / n, 3) for k, v in sorted(cpu.items(), key=lambda kv: -kv[1])}
    s["cpu_cores"] = {k: round(v / max(1e-9, run.wall_s), 3) for k, v in cpu.items()}
    s["generator_cpu_ms_per_query"] = round(run.cpu_s * 1000 / n, 3)
    say(f"  {label}{mode} {rate:7.1f} q/s: {load.format_summary(s)}")
    s["_run"] = run
    return s


WARM_UP = {"rate": 150.0, "seconds": 6.0}  # the discarded step of ``warm_up``


def warm_up(pipe: Pipeline, app: str, *, mode: str = "kafka", kafka_load: Any = None,
            rate: float = WARM_UP["rate"], seconds: float = WARM_UP["seconds"], inputs: Any = None) -> None:
    """A discarded open-loop step at moderate load: a fresh broker and fresh stages run cold
    (JIT, pools, caches) for seconds, which would otherwise land in the first measurement.
    The broker's JIT is the slow one: over a fresh broker's first two minutes of light load its
    compiler threads use almost as much CPU as its request threads, so the step is followed by
    more until they are quiet (``warm_until_jit_quiet``)."""
    load_step(pipe, app, rate, 50.0, seconds, mode=mode, kafka_load=kafka_load, inputs=inputs,
              seed=7, label=f"warm-up {app} (not reported) ").pop("_run")
    # then on, 10 s at a time, while the broker is still compiling
    broker = broker_pid(pipe.processes())
    warm_until_jit_quiet(broker, lambda i: load_step(
        pipe, app, rate, 50.0, 10.0, mode=mode, kafka_load=kafka_load, inputs=inputs, seed=8 + i,
        label=f"warm-up {app}, extra {i + 1} (not reported) ").pop("_run"), say)


def sweep(pipe: Pipeline, app: str, rates: list[float], slo_ms: float, duration_s: float, *,
          mode: str = "kafka", kafka_load: Any = None, stop_after_misses: int = 2, label: str = "",
          warmup_s: float = 1.0, seed: int = 0) -> list[dict[str, Any]]:
    """Step the offered rate up until the effective p99 exceeds the SLO ``stop_after_misses`` times.
    Sweeps of one pipeline must differ in ``seed``: the same seed replays the same inputs, which
    the prediction cache then answers without the model."""
    rows, misses = [], 0
    for i, rate in enumerate(rates):
        s = load_step(pipe, app, rate, slo_ms, duration_s, mode=mode, kafka_load=kafka_load, seed=1000 * seed + i + 1,
                      label=label, warmup_s=warmup_s)
        s.pop("_run")
        rows.append(s)
        misses = misses + 1 if not s["effective_ms"]["p99"] <= slo_ms else 0
        if misses >= stop_after_misses:
            break
    return rows


def best_under_slo(rows: list[dict[str, Any]], slo_ms: float) -> dict[str, Any] | None:
    """The step with the highest goodput whose effective p99 is within the SLO."""
    ok = [r for r in rows if r["effective_ms"]["p99"] <= slo_ms]
    return max(ok, key=lambda r: r["goodput_qps"]) if ok else None


def strip_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "_run"} for r in rows]
