"""``bench.machine.raised_priority``: the load generator's thread ahead of the pipeline, and back."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from bench.machine import raised_priority


def _in_a_thread(fn: Any) -> dict[str, Any]:
    """The priority is per thread on Linux: run the check in one of its own, so the test
    process's priority is not touched whatever happens."""
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out.update(fn())
        except BaseException as exc:  # surfaced by the caller
            out["error"] = exc

    t = threading.Thread(target=target)
    t.start()
    t.join(10)
    assert not t.is_alive()
    if "error" in out:
        raise out["error"]
    return out


def test_the_priority_is_raised_inside_and_put_back_after() -> None:
    def check() -> dict[str, Any]:
        before = os.getpriority(os.PRIO_PROCESS, 0)
        with raised_priority(before - 3) as got:
            inside = os.getpriority(os.PRIO_PROCESS, 0)
        return {"before": before, "got": got, "inside": inside, "after": os.getpriority(os.PRIO_PROCESS, 0)}

    r = _in_a_thread(check)
    if r["got"] is None:  # not permitted here: nothing changed, and the caller is told
        assert r["inside"] == r["before"] == r["after"]
        assert os.geteuid() != 0
    else:
        assert r["got"] == r["inside"] == r["before"] - 3
        assert r["after"] == r["before"]


def test_the_old_priority_is_back_when_the_block_raises() -> None:
    def check() -> dict[str, Any]:
        before = os.getpriority(os.PRIO_PROCESS, 0)
        try:
            with raised_priority(before - 2):
                raise RuntimeError("the run failed")
        except RuntimeError:
            pass
        return {"before": before, "after": os.getpriority(os.PRIO_PROCESS, 0)}

    r = _in_a_thread(check)
    assert r["after"] == r["before"]


def test_handoff_round_trips_cost_cpu_on_one_core_and_across_two() -> None:
    from bench.machine import handoff_us

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    before = os.sched_getaffinity(0)
    got = handoff_us(rounds=200)
    assert got is not None and set(got) == {"same_core", "across_cores"}
    assert all(v > 0 for v in got.values())
    assert os.sched_getaffinity(0) == before  # only the children were pinned


def test_cold_start_times_a_record_warm_and_after_each_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import machine

    slept: list[float] = []
    monkeypatch.setattr(machine.time, "sleep", slept.append)
    got = machine.cold_start_us(rounds=20, sleep_s=0.003)
    assert set(got) == {"warm", "after_sleep", "sleep_ms"} and got["sleep_ms"] == 3.0
    assert got["warm"] > 0 and got["after_sleep"] > 0
    assert slept == [0.003] * 20  # one sleep before each timed run of the second set


def test_handoff_needs_two_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import machine

    monkeypatch.setattr(machine.os, "sched_getaffinity", lambda pid: {0})
    assert machine.handoff_us(rounds=10) is None
