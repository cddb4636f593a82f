"""What the benchmarks record about the machine they ran on, and per-process CPU time.

A figure from a shared 2-core machine means little without the machine's state beside it:
its model, its load, other busy processes and a fixed CPU probe's time. Per-process CPU comes
from /proc, so a benchmark can say which stage spent the CPU of each query.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from clipstream.infra import proc_stat_fields
from clipstream.spare import SPARE_TITLE

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


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
    first = all_cpu()
    time.sleep(sample_s)
    second = all_cpu()
    mine = {os.getpid(), *descendants(os.getpid())}
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
        "handoff_us": handoff_us(),
        "cold_start_us": cold_start_us(),
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


def handoff_us(rounds: int = 5000) -> dict[str, float] | None:
    """CPU µs per round trip of one byte between two processes, on one core and across two.

    A record's hand-off from one thread to another is such a wake-up; on a virtual machine one
    across cores costs an inter-processor interrupt (docs/design/0043). None with fewer than
    two CPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    return {"same_core": _ping_pong(cpus[0], cpus[0], rounds),
            "across_cores": _ping_pong(cpus[0], cpus[1], rounds)}


def cold_start_us(rounds: int = 200, sleep_s: float = 0.005) -> dict[str, float]:
    """CPU µs of one stage's typical work, a ``ModelRequest`` encoded and decoded, run back to
    back and run right after a sleep, medians.

    A stage thread sleeps between records at light load. On this virtual machine the work a
    thread does after a sleep costs several times what it costs warm, so a query's cost follows
    the wake-ups it takes more than the Python it runs (docs/design/0050)."""
    import numpy as np

    from schemas import ModelRequest, Tensor, decode_as, encode

    record = ModelRequest(query_id="q" * 36, app="app", model="model", deadline_us=0, selector_partition=0,
                          input=Tensor.of(np.zeros(784, np.float32)), trace={"produced": 0, "dispatched": 0})

    def once() -> float:
        t0 = time.thread_time()
        decode_as(ModelRequest, encode(record)).input.array()
        return time.thread_time() - t0

    warm = sorted(once() for _ in range(rounds))
    cold = []
    for _ in range(rounds):
        time.sleep(sleep_s)
        cold.append(once())
    cold.sort()
    return {"warm": round(warm[rounds // 2] * 1e6, 1), "after_sleep": round(cold[rounds // 2] * 1e6, 1),
            "sleep_ms": sleep_s * 1000}


def _ping_pong(a: int, b: int, rounds: int) -> float:
    """Two children pinned to CPUs ``a`` and ``b`` pass a byte back and forth ``rounds`` times;
    their CPU time per round trip, in µs."""
    there, back = os.pipe(), os.pipe()
    pids = []
    for cpu, first in ((a, True), (b, False)):
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child)
            try:
                read, write = (back[0], there[1]) if first else (there[0], back[1])
                for fd in {*there, *back} - {read, write}:  # a partner that dies gives EOF, not a hang
                    os.close(fd)
                os.sched_setaffinity(0, {cpu})
                for _ in range(rounds):
                    if first:
                        os.write(write, b"x")
                        os.read(read, 1)
                    else:
                        os.read(read, 1)
                        os.write(write, b"x")
            finally:
                os._exit(0)
        pids.append(pid)
    for fd in (*there, *back):
        os.close(fd)
    cpu_s = 0.0
    for pid in pids:
        _, _, usage = os.wait4(pid, 0)
        cpu_s += usage.ru_utime + usage.ru_stime
    return round(cpu_s * 1e6 / rounds, 1)


# --- per-process CPU ------------------------------------------------------------------------


def _stat(pid: int) -> tuple[int, int] | None:
    """(ppid, utime+stime ticks) of a process, None if it is gone."""
    fields = proc_stat_fields(pid)
    return None if fields is None else (int(fields[1]), int(fields[11]) + int(fields[12]))


def jit_cpu_s(pid: int, proc: Path = Path("/proc")) -> float | None:
    """CPU seconds the JVM ``pid``'s compiler threads (C1, C2) have used so far; None when it is
    gone or /proc has no threads to read. A broker is warm when these go quiet."""
    hz = CLK_TCK
    total, seen = 0, False
    try:
        tasks = list((proc / str(pid) / "task").iterdir())
    except OSError:
        return None
    for task in tasks:
        try:
            if "Compiler" not in (task / "comm").read_text():
                continue
        except OSError:
            continue
        # the thread's own counts: /proc/<tid>/stat would give the whole process's
        try:
            raw = (task / "stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2:].split()
        total += int(fields[11]) + int(fields[12])
        seen = True
    return total / hz if seen else None


JIT_QUIET_CORES = 0.1  # the broker's compiler threads' share of a core below which it counts as warm


def broker_pid(procs: Mapping[int, str], label: str = "kafka") -> int | None:
    """The broker's pid among labelled processes (None: no broker among them)."""
    return next((pid for pid, name in procs.items() if name == label), None)


def broker_jit_s(procs: Mapping[int, str]) -> float | None:
    """CPU seconds the broker's JIT compilers have used so far (None: no broker, or no /proc)."""
    pid = broker_pid(procs)
    return jit_cpu_s(pid) if pid is not None else None


def jit_apart(cpu: Mapping[str, float], jit_before: float | None, jit_after: float | None,
              label: str = "kafka") -> dict[str, float]:
    """``cpu`` (seconds by process) with the broker's JIT compilers' share moved from ``label`` to
    ``<label> (JIT)``: a fresh broker compiles for minutes, which is warm-up, not a request's
    cost. The total is unchanged."""
    out = dict(cpu)
    if jit_before is not None and jit_after is not None and label in out:
        jit = round(jit_after - jit_before, 3)
        out[f"{label} (JIT)"] = jit
        out[label] = round(out[label] - jit, 3)
    return out


def warm_until_jit_quiet(pid: int | None, step: Callable[[int], None], report: Callable[[str], None],
                         max_steps: int = 4, quiet_cores: float = JIT_QUIET_CORES,
                         clock: Callable[[], float] = time.monotonic) -> list[float]:
    """Run ``step(i)`` (more warm-up load) while the JVM ``pid``'s JIT still compiles, at most
    ``max_steps`` times; the compiler threads' share of a core in each step. A fixed warm-up
    left the broker compiling into the first measured runs: those measured the broker
    warming up, not the system."""
    shares: list[float] = []
    if pid is None:
        return shares
    for i in range(max_steps):
        before, t0 = jit_cpu_s(pid), clock()
        if before is None:
            return shares  # no /proc threads to read: the fixed warm-up is all there is
        step(i)
        share = ((jit_cpu_s(pid) or before) - before) / max(1e-9, clock() - t0)
        shares.append(round(share, 3))
        report(f"  broker JIT: {share:.2f} of a core during extra warm-up {i + 1}")
        if share < quiet_cores:
            return shares
    report(f"  broker JIT still above {quiet_cores} of a core after {max_steps} extra warm-ups; going on")
    return shares


def cmdline(pid: int) -> list[str]:
    try:
        return [a for a in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0") if a]
    except OSError:
        return []


def all_cpu() -> dict[int, tuple[int, str]]:
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st is not None:
                out[int(entry.name)] = (st[1], " ".join(cmdline(int(entry.name))))
    return out


def descendants(root: int) -> list[int]:
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
    """A short name for a pipeline process from its command line. A spare (or a stage that
    was one) shows a title set as one string, split here; a waiting spare counts as its stage."""
    if len(argv) == 1 and argv[0].startswith(SPARE_TITLE):  # its arguments, after ``-m clipstream.cli``
        argv = ["python", "-m", "clipstream.cli", *argv[0].removeprefix(SPARE_TITLE).split()]
    elif len(argv) == 1 and " " in argv[0]:
        argv = argv[0].split()
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


@contextmanager
def raised_priority(nice: int) -> Iterator[int | None]:
    """Run the block with the calling thread at scheduling priority ``nice`` (negative: ahead of
    the pipeline's processes), then put the old one back; yields the value in effect, or None
    where raising it is not permitted (not root, no CAP_SYS_NICE).

    A load generator on the same 2 cores as the system it measures is descheduled by it, and
    its late sends then count against the system; callers in production have CPUs of their own.
    On Linux the priority is the calling thread's, which is where an asyncio generator runs."""
    try:
        old = os.getpriority(os.PRIO_PROCESS, 0)
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except (OSError, AttributeError):
        yield None
        return
    try:
        yield nice
    finally:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, old)
        except OSError:
            pass
