"""Shared helpers of the benchmarks: a private pipeline, per-process CPU, JSON and PNG reports.

``Pipeline`` runs ``clipstream up -f app.yaml --free-ports --state-dir DIR --gateway-port P``
with its own Kafka and Redis (the environment points at unused ports, so an infrastructure
somebody else runs on the default ports is never touched), waits for ``ready:``, and stops
everything with SIGINT at the end. ``cpu_snapshot`` reads every pipeline process's CPU time
from /proc, so a benchmark can say where the CPU went per query and per process.

Every report is ``out/bench/<name>.json`` with the machine, the settings and the raw figures,
plus ``<name>.png``.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

OUT = Path("out/bench")
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def say(msg: str) -> None:
    print(msg, flush=True)


# --- machine -----------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def busy_processes(min_pct: float = 5.0, sample_s: float = 0.5) -> list[dict[str, Any]]:
    """Processes (not ours) using more than ``min_pct`` of a core right now: the noise to report."""
    first = _all_cpu()
    time.sleep(sample_s)
    second = _all_cpu()
    mine = {os.getpid(), *_descendants(os.getpid())}
    out = []
    for pid, (ticks, name) in second.items():
        if pid in mine or pid not in first:
            continue
        pct = 100.0 * (ticks - first[pid][0]) / CLK_TCK / sample_s
        if pct >= min_pct:
            out.append({"pid": pid, "cmd": name[:120], "cpu_pct": round(pct, 1)})
    return sorted(out, key=lambda r: -r["cpu_pct"])


def machine_info() -> dict[str, Any]:
    """CPU model and count, memory, load average, Python, and what else was busy at the time."""
    try:
        mem_kb = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                          if line.startswith("MemTotal")))
    except (OSError, StopIteration, ValueError):
        mem_kb = 0
    return {
        "hostname": socket.gethostname(),
        "cpu_model": _cpu_model(),
        "cpus": os.cpu_count(),
        "mem_gib": round(mem_kb / 2**20, 1),
        "loadavg": list(os.getloadavg()),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "other_busy_processes": busy_processes(),
        "cpu_probe_ms": cpu_probe_ms(),
    }


def cpu_probe_ms(rounds: int = 3) -> float:
    """The best of a few runs of a fixed pure-Python loop, in ms. This machine is a VM whose
    speed drifts by tens of percent over minutes (the same step cost 40% more CPU per query
    twenty minutes later), so each report keeps a reading of how fast it was at the time."""
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        acc = 0
        for i in range(1_000_000):
            acc += i & 7
        best = min(best, time.perf_counter() - t0)
    return round(best * 1000, 1)


# --- per-process CPU ------------------------------------------------------------------------


def _stat(pid: int) -> tuple[int, int] | None:
    """(ppid, utime+stime ticks) of a process, None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = raw[raw.rfind(")") + 2:].split()
    return int(rest[1]), int(rest[11]) + int(rest[12])


def _cmdline(pid: int) -> list[str]:
    try:
        return [a for a in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0") if a]
    except OSError:
        return []


def _all_cpu() -> dict[int, tuple[int, str]]:
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st is not None:
                out[int(entry.name)] = (st[1], " ".join(_cmdline(int(entry.name))))
    return out


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st is not None:
                children.setdefault(st[0], []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def label_of(argv: list[str]) -> str:
    """A short name for a pipeline process from its command line."""
    if not argv:
        return "?"
    exe = Path(argv[0]).name
    if exe == "java" or any("kafka.Kafka" in a for a in argv):
        return "kafka"
    if exe.startswith("redis-server"):
        return "redis"
    if "clipstream.cli" in argv:
        args = argv[argv.index("clipstream.cli") + 1:]
        verb = args[0] if args else "?"
        opts = dict(zip(args[1::2], args[2::2])) if len(args) > 1 else {}
        if verb == "batcher":  # one model, or several in one process
            models = [b for a, b in zip(args, args[1:]) if a == "--model"]
            return "batcher-" + ("+".join(models) or "?")
        if verb == "worker":
            return f"worker-{opts.get('--model', '?')}-{opts.get('--replica', '0')}"
        return verb
    return exe


def cpu_snapshot(pids: Mapping[int, str]) -> dict[str, float]:
    """CPU seconds used so far by each labelled process (the same label adds up)."""
    out: dict[str, float] = {}
    for pid, label in pids.items():
        st = _stat(pid)
        if st is not None:
            out[label] = out.get(label, 0.0) + st[1] / CLK_TCK
    return out


def cpu_delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    return {k: round(after[k] - before.get(k, 0.0), 3) for k in after}


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

    def start(self) -> "Pipeline":
        t0 = time.monotonic()
        env = {
            **os.environ,
            # unused ports: `up` never adopts an infrastructure somebody else runs
            "CLIPSTREAM_KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port()}",
            "CLIPSTREAM_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
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

    def settings(self) -> Any:
        from clipstream.settings import get_settings

        return get_settings(kafka_bootstrap=self.kafka, redis_url=self.redis)

    def processes(self) -> dict[int, str]:
        """pid -> label of every pipeline process: the stages, the broker and Redis."""
        out: dict[int, str] = {}
        if self.proc is not None:
            out[self.proc.pid] = "up"
            for pid in _descendants(self.proc.pid):
                out[pid] = label_of(_cmdline(pid))
        try:
            state = json.loads((self.state_dir / "infra.json").read_text())
            for name in ("kafka", "redis"):
                if isinstance(state.get(name), dict) and "pid" in state[name]:
                    out[int(state[name]["pid"])] = name
                    for pid in _descendants(int(state[name]["pid"])):
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
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> "Pipeline":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def private_infra(log: Callable[[str], None] = say) -> Iterator[tuple[Any, dict[str, str], Any]]:
    """A broker and Redis of our own on unused ports, for a benchmark that needs no pipeline:
    yields the settings, the environment that points child processes at them, and the
    launcher's status (pids)."""
    from clipstream.infra import launcher
    from clipstream.settings import Settings

    with tempfile.TemporaryDirectory(prefix="clipstream-bench-") as tmp:
        infra = Settings(state_dir=Path(tmp) / "state")
        status = launcher.up(infra, free_ports=True, progress=lambda m: log(f"  infra: {m}"), die_with_parent=True)
        try:
            yield (Settings(kafka_bootstrap=status.kafka_bootstrap, redis_url=status.redis_url),
                   {**os.environ, **status.env()}, status)
        finally:
            launcher.down(infra)


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


def median(xs: Iterable[float]) -> float:
    vals = sorted(xs)
    if not vals:
        return float("nan")
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2


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
    c0 = cpu_snapshot(procs)
    if mode == "kafka":
        run = kafka_load.run(app, load.tensors(x), times, slo_ms)
    else:
        run = run_gateway(pipe.url, app, load.json_bodies(x, slo_ms), times)
    cpu = cpu_delta(c0, cpu_snapshot(procs))
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
    compiler threads used almost as much CPU as its request threads (``bench.intake``)."""
    load_step(pipe, app, rate, 50.0, seconds, mode=mode, kafka_load=kafka_load, inputs=inputs,
              seed=7, label=f"warm-up {app} (not reported) ").pop("_run")


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
