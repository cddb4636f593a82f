"""One CPU per stage: how ``up`` spreads stages over CPUs, and a stage pinning all its threads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from clipstream.cpus import CPU_ENV, CpuPlan, pin_from_env
from clipstream.supervise import Supervisor
from workers.backends.devices import fits_one_core

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = sorted(os.sched_getaffinity(0))
two_cpus = pytest.mark.skipif(len(ALLOWED) < 2, reason="needs two CPUs to pin stages apart")


def test_the_front_stages_share_one_half_and_batchers_and_workers_the_other() -> None:
    plan = CpuPlan([1, 0])
    got = {name: plan.assign(name) for name in ("selector-1", "selector-2", "gateway", "batchers-a+b", "worker-a-v1-0")}
    assert got == {"selector-1": 0, "selector-2": 0, "gateway": 0, "batchers-a+b": 1, "worker-a-v1-0": 1}
    assert plan.assign("selector-2") == 0  # a restart keeps the CPU
    assert plan.env("gateway", {"A": "b"}) == {"A": "b", CPU_ENV: "0"}


def test_within_its_half_a_stage_gets_the_cpu_with_fewest_stages() -> None:
    plan = CpuPlan(range(5))  # front 0-1, back 2-4
    fronts = [plan.assign(f"selector-{i}") for i in range(1, 4)] + [plan.assign("gateway-1")]
    backs = [plan.assign(name) for name in ("batcher-a", "worker-a-v1-0", "worker-b-v1-0", "worker-c-v1-0")]
    assert fronts == [0, 1, 0, 1] and backs == [2, 3, 4, 2]
    plan.release("worker-a-v1-0")
    assert plan.assign("worker-d-v1-0") == 3  # the CPU freed by the removal


def test_one_cpu_pins_nothing() -> None:
    plan = CpuPlan([3])
    assert plan.assign("selector-1") is None
    assert plan.env("selector-1", {"A": "b"}) == {"A": "b"}


def test_no_cpu_given_leaves_the_process_alone() -> None:
    assert pin_from_env("selector", {}) is None


# a child with a thread started before and one after pinning: all three end on the CPU
PINNED_CHILD = """
import os, sys, threading
from clipstream.cpus import pin_from_env
stop = threading.Event()
before = threading.Thread(target=stop.wait); before.start()
cpu = pin_from_env("child")
after = threading.Thread(target=stop.wait); after.start()
sets = {tid: sorted(os.sched_getaffinity(int(tid))) for tid in os.listdir("/proc/self/task")}
stop.set()
print(cpu, len(sets), sorted({tuple(s) for s in sets.values()}))
"""


def run_child(cpu: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), CPU_ENV: cpu}
    return subprocess.run([sys.executable, "-c", PINNED_CHILD], env=env, capture_output=True, text=True,
                          timeout=60, check=True)


@two_cpus
def test_every_thread_of_a_stage_lands_on_its_cpu() -> None:
    cpu = ALLOWED[-1]
    out = run_child(str(cpu)).stdout.split(maxsplit=2)
    assert out[0] == str(cpu)
    assert int(out[1]) >= 3
    assert out[2].strip() == str([(cpu,)])


def test_a_cpu_the_stage_may_not_use_warns_and_serves_unpinned() -> None:
    done = run_child("4095")
    assert done.stdout.split(maxsplit=1)[0] == "None"
    assert "not pinned to CPU '4095'" in done.stderr and "CLIPSTREAM_UP_PIN_STAGES=false" in done.stderr
    assert f"[{tuple(ALLOWED)}]" in done.stdout  # still on every CPU it had


READY_CHILD = """
import os
from clipstream.cpus import pin_from_env
pin_from_env("child")
print("ready:", sorted(os.sched_getaffinity(0)), flush=True)
import time; time.sleep(60)
"""


@two_cpus
def test_up_s_supervisor_gives_each_stage_a_cpu_it_pins_itself_to(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path / "logs", report=lambda line: None, cpus=CpuPlan(ALLOWED[:2]))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        for name in ("gateway", "worker-m-v1-0"):
            sup.add(name, [sys.executable, "-c", READY_CHILD], env)
        sup.wait_ready(60)
        assert sup.stages["gateway"].ready_line == f"ready: [{ALLOWED[0]}]"
        assert sup.stages["worker-m-v1-0"].ready_line == f"ready: [{ALLOWED[1]}]"
        sup.remove("gateway")
        assert sup.cpus is not None and sup.cpus.held == {"worker-m-v1-0": ALLOWED[1]}  # the gateway's CPU is free
    finally:
        sup.stop_all()


@pytest.mark.parametrize(("backend", "device", "threads", "pinned"), [
    ("onnx", "cpu", 1, True),
    ("onnx", "cpu", None, False),  # onnxruntime's default pool: every core
    ("torch", "cpu", 4, False),
    ("torch", "cuda", None, True),  # the device computes; the CPU only hands batches over
    ("python", "cpu", None, True),
    ("python", "cpu", 2, False),  # a python model that says it runs threads of its own
])
def test_a_worker_is_pinned_only_when_its_model_fits_one_core(backend: str, device: str, threads: int | None,
                                                               pinned: bool) -> None:
    assert fits_one_core(backend, device, threads) is pinned
