"""Benchmark helpers that need no pipeline: process labels, the device ceiling, trace splits."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.breakdown import SEGMENTS, STRAIGHT, split, table
from bench.common import best_under_slo
from bench.machine import label_of
from bench.efficiency import CLOCKWORK, device_bound


def test_labels_of_pipeline_processes() -> None:
    py = "/x/.venv/bin/python"
    assert label_of([py, "-m", "clipstream.cli", "worker", "--model", "m", "--version", "1", "--replica", "2"]) == "worker-m-2"
    assert label_of([py, "-m", "clipstream.cli", "batcher", "--model", "m"]) == "batcher-m"
    assert label_of([py, "-m", "clipstream.cli", "batcher", "--model", "a", "--model", "b"]) == "batcher-a+b"
    assert label_of([py, "-m", "clipstream.cli", "selector"]) == "selector"
    assert label_of(["/usr/bin/java", "-cp", "x", "kafka.Kafka", "server.properties"]) == "kafka"
    assert label_of(["/usr/bin/redis-server", "127.0.0.1:6379"]) == "redis"
    # a spare's title (clipstream.spare) is one string: waiting, and after it took the place
    assert label_of(["clipstream-spare: worker --model m --replica 1"]) == "worker-m-1"
    assert label_of(["python -m clipstream.cli batcher --model m"]) == "batcher-m"


def test_device_bound_from_the_latency_table() -> None:
    # Clockwork at full speed: batch 9 (interpolated 9.9475 ms) is the largest within 10 ms
    b, ms, qps = device_bound(CLOCKWORK, 10.0)
    assert b == 9 and ms == pytest.approx(9.13 + (15.67 - 9.13) / 8) and qps == pytest.approx(9 / ms * 1000)
    b, ms, _ = device_bound(CLOCKWORK, 9.5)
    assert (b, ms) == (8, 9.13)
    # 8x slower and a 100 ms budget: batch 12 by linear interpolation between 8 and 16
    b, ms, qps = device_bound(CLOCKWORK, 100.0, speed=1 / 8)
    assert b == 12 and ms == pytest.approx(8 * (9.13 + 4 * (15.67 - 9.13) / 8))
    assert device_bound(CLOCKWORK, 1.0) == (0, 0.0, 0.0)


def test_split_of_a_trace_into_segments() -> None:
    trace = {"produced": 1000, "dispatched": 2000, "batcher_in": 3500, "batched": 5500, "worker_in": 6000,
             "worker_out": 9000, "joined": 10_000, "_missing": 0}
    parts = split(trace, sent_us=500, recv_us=11_000)
    assert parts is not None and list(parts) == [s[0] for s in SEGMENTS]
    assert parts["gateway"] == 0.5 and parts["batcher"] == 2.0 and parts["model service"] == 3.0
    assert sum(parts.values()) == pytest.approx((11_000 - 500) / 1000)
    assert split({"produced": 1}, 0, 2) is None


def test_a_query_answered_straight_by_its_model_splits_without_the_selectors_stamps() -> None:
    trace = {"produced": 1000, "batcher_in": 2500, "batched": 4500, "worker_in": 5000, "worker_out": 8000}
    parts = split(trace, sent_us=500, recv_us=9_000)
    assert parts is not None and list(parts) == [s[0] for s in STRAIGHT]
    assert parts["requests hop"] == 1.5 and parts["predictions hop"] == 1.0
    assert sum(parts.values()) == pytest.approx((9_000 - 500) / 1000)
    assert list(table([parts, parts])) == [s[0] for s in STRAIGHT]


def test_the_brokers_append_time_splits_the_reply_hop() -> None:
    trace = {"produced": 1000, "dispatched": 2000, "batcher_in": 3500, "batched": 5500, "worker_in": 6000,
             "worker_out": 9000, "joined": 10_000, "_reply_appended": 14_000}
    parts = split(trace, sent_us=1000, recv_us=15_000)
    assert parts is not None
    assert parts["reply: to broker"] == 4.0 and parts["reply: from broker"] == 1.0
    assert parts["reply: to broker"] + parts["reply: from broker"] == parts["reply"]
    # the halves are tabled only when every query has them
    plain = split({k: v for k, v in trace.items() if k != "_reply_appended"}, sent_us=1000, recv_us=15_000)
    assert plain is not None and "reply: to broker" not in plain
    assert "reply: to broker" in table([parts, parts]) and "reply: to broker" not in table([parts, plain])


def test_best_under_slo_picks_the_highest_compliant_goodput() -> None:
    rows = [{"goodput_qps": 10, "effective_ms": {"p99": 5.0}}, {"goodput_qps": 20, "effective_ms": {"p99": 19.0}},
            {"goodput_qps": 30, "effective_ms": {"p99": float("inf")}}]
    assert best_under_slo(rows, 20.0)["goodput_qps"] == 20
    assert best_under_slo(rows, 1.0) is None


def test_warm_up_goes_on_until_the_jit_is_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.machine as machine

    # compiler CPU seconds read before and after each step, and a clock 10 s per step
    jit = iter([0.0, 3.0, 3.0, 4.5, 4.5, 4.6])
    clock = iter([0.0, 10.0, 10.0, 20.0, 20.0, 30.0])
    monkeypatch.setattr(machine, "jit_cpu_s", lambda pid: next(jit))
    steps: list[int] = []
    shares = machine.warm_until_jit_quiet(1, steps.append, lambda m: None, max_steps=4, clock=lambda: next(clock))
    assert shares == [0.3, 0.15, 0.01] and steps == [0, 1, 2]  # stops at the first step under 0.1


def test_warm_up_is_bounded_and_skipped_without_proc(monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.machine as machine

    said: list[str] = []
    ticks = iter(range(100))
    monkeypatch.setattr(machine, "jit_cpu_s", lambda pid: float(next(ticks)) * 5)  # always busy
    steps: list[int] = []
    clock = lambda: float(next(ticks))  # noqa: E731
    assert len(machine.warm_until_jit_quiet(1, steps.append, said.append, max_steps=2, clock=clock)) == 2
    assert steps == [0, 1] and "still above" in said[-1]
    monkeypatch.setattr(machine, "jit_cpu_s", lambda pid: None)  # no /proc threads to read
    assert machine.warm_until_jit_quiet(1, steps.append, said.append) == [] and steps == [0, 1]
    assert machine.warm_until_jit_quiet(None, steps.append, said.append) == []


def test_jit_apart_moves_the_compilers_share_and_keeps_the_total() -> None:
    from bench.machine import jit_apart

    cpu = {"kafka": 2.5, "selector": 1.0}
    out = jit_apart(cpu, 10.0, 10.75)
    assert out == {"kafka": 1.75, "kafka (JIT)": 0.75, "selector": 1.0}
    assert sum(out.values()) == pytest.approx(sum(cpu.values())) and cpu["kafka"] == 2.5  # input untouched
    assert jit_apart(cpu, None, 10.75) == cpu and jit_apart({"selector": 1.0}, 1.0, 2.0) == {"selector": 1.0}


def test_broker_jit_is_read_from_the_process_labelled_kafka(monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.machine as machine

    monkeypatch.setattr(machine, "jit_cpu_s", lambda pid: {7: 1.5}.get(pid))
    assert machine.broker_pid({3: "selector", 7: "kafka"}) == 7
    assert machine.broker_jit_s({3: "selector", 7: "kafka"}) == 1.5
    assert machine.broker_jit_s({3: "selector"}) is None


def test_jit_cpu_counts_the_compiler_threads_own_time_not_the_process(tmp_path: Path) -> None:
    # /proc/<tid>/stat holds the whole process's counts; only task/<tid>/stat is the thread's
    from bench.machine import CLK_TCK, jit_cpu_s

    def thread(tid: int, comm: str, ticks: int) -> None:
        d = tmp_path / "7" / "task" / str(tid)
        d.mkdir(parents=True)
        (d / "comm").write_text(comm + "\n")
        (d / "stat").write_text(f"{tid} ({comm}) S " + " ".join(["0"] * 10) + f" {ticks} {ticks} 0 0\n")

    thread(7, "java", 5000)
    thread(8, "C2 CompilerThre", 30)
    thread(9, "C1 CompilerThre", 10)
    thread(10, "data-plane-kafk", 900)
    assert jit_cpu_s(7, proc=tmp_path) == (30 + 30 + 10 + 10) / CLK_TCK
    assert jit_cpu_s(8, proc=tmp_path) is None  # no such process
