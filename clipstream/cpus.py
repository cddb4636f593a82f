"""One CPU per stage process, stages next to each other in a record's path on the same CPU.

A record's trip through a stage passes between threads (librdkafka's broker thread, the
stage's poll loop, an emitter), and from one stage to the next through the broker: on a
virtual machine, waking a thread that sleeps on another core costs an inter-processor
interrupt, more CPU than the stage's own work on the record. ``up`` gives each stage a CPU
(``CpuPlan``) through ``CPU_ENV``, and the stage pins all its threads there at start
(``pin_from_env``). Docs: docs/design/0043.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Iterable

CPU_ENV = "CLIPSTREAM_CPU"


# stages a query meets before its models (the rest: batchers and workers, after)
FRONT = ("gateway", "selector")


class CpuPlan:
    """Which CPU each named stage runs on.

    The gateway and selectors share the first half of the CPUs (at least one), batchers and
    workers the rest: a query's hops from gateway to selector and back, and from batcher to
    worker and back, then stay on one core. Within its half a stage gets the CPU with the
    fewest stages, lowest first. A restarted stage keeps its CPU (it is assigned by name); a
    removed one frees it. With fewer than two CPUs no stage is pinned."""

    def __init__(self, cpus: Iterable[int]) -> None:
        self.cpus = sorted(set(cpus))
        half = max(1, len(self.cpus) // 2)
        self.front, self.back = self.cpus[:half], self.cpus[half:]
        self.held: dict[str, int] = {}

    @classmethod
    def from_machine(cls) -> CpuPlan:
        """The CPUs this process may run on (its affinity: a container's cpuset, taskset)."""
        return cls(os.sched_getaffinity(0))

    def assign(self, name: str) -> int | None:
        if len(self.cpus) < 2:
            return None
        if name not in self.held:
            load = Counter(self.held.values())
            side = self.front if name.startswith(FRONT) else self.back
            self.held[name] = min(side, key=lambda cpu: (load[cpu], cpu))
        return self.held[name]

    def release(self, name: str) -> None:
        self.held.pop(name, None)

    def env(self, name: str, env: dict[str, str]) -> dict[str, str]:
        """``env`` with the stage's CPU in ``CPU_ENV`` (unchanged when it gets none)."""
        cpu = self.assign(name)
        return env if cpu is None else {**env, CPU_ENV: str(cpu)}


def pin_threads(cpu: int) -> None:
    """Every thread of this process on ``cpu``; threads started later inherit it."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), {cpu})
        except ProcessLookupError:  # a thread that ended meanwhile
            continue


def pin_from_env(stage: str, environ: dict[str, str] | None = None) -> int | None:
    """Pin this process to the CPU ``up`` gave it, if any; the CPU, or None when unpinned.

    A CPU this process may not use (a narrower cpuset than ``up``'s) leaves it unpinned, with
    a warning: it still serves, only with the cross-core hand-offs."""
    value = (os.environ if environ is None else environ).get(CPU_ENV)
    if not value:
        return None
    try:
        cpu = int(value)
        pin_threads(cpu)
    except (ValueError, OSError) as exc:
        print(f"{stage}: not pinned to CPU {value!r} ({exc}); it runs unpinned. "
              f"Set CLIPSTREAM_UP_PIN_STAGES=false to stop `up` from pinning stages.", file=sys.stderr)
        return None
    return cpu
