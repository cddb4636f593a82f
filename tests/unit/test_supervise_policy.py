"""The restart policy of `clipstream up` (pure: pauses from a death count and a healthy time)
and the heartbeat file a stage writes for it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from clipstream.backoff import Backoff
from topics.stage import Heartbeat, read_heartbeat


def test_the_pause_doubles_to_its_cap_and_never_gives_up() -> None:
    b = Backoff(first_s=0.5, max_s=30.0, healthy_s=60.0)
    pauses = [b.next_delay(healthy_for_s=1.0) for _ in range(200)]  # far past the old cap of 5
    assert pauses[:8] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert set(pauses[6:]) == {30.0}


def test_a_healthy_while_starts_the_pause_over_and_a_short_one_does_not() -> None:
    b = Backoff(first_s=0.5, max_s=30.0, healthy_s=60.0)
    for _ in range(4):
        b.next_delay(healthy_for_s=0.0)
    assert b.next_delay(healthy_for_s=59.9) == 8.0  # served less than the healthy while: no reset
    assert b.next_delay(healthy_for_s=60.0) == 0.5  # served a healthy while: from the start
    assert b.next_delay(healthy_for_s=0.0) == 1.0


@pytest.mark.parametrize("args", [(0.0, 30.0, 60.0), (5.0, 1.0, 60.0), (0.5, 30.0, 0.0)])
def test_a_backoff_that_makes_no_sense_is_refused(args: tuple[float, float, float]) -> None:
    with pytest.raises(ValueError, match="backoff needs"):
        Backoff(*args)


def test_the_heartbeat_file_shows_every_loop_so_the_stalest_one_counts(tmp_path: Path) -> None:
    path = tmp_path / "stage.heartbeat"
    hb = Heartbeat(path, every_s=0.0)
    assert read_heartbeat(path) is None  # no beat yet: the supervisor waits for the first
    hb.beat("join")
    hb.beat("learn")
    first = read_heartbeat(path)
    assert first is not None and set(first) == {"join", "learn"}
    assert abs(first["join"] - time.monotonic()) < 5
    hb.beat("join")  # the learner stops beating: its old time stays in the file
    again = read_heartbeat(path)
    assert again is not None and again["learn"] == first["learn"] and again["join"] >= first["join"]
    assert list(tmp_path.iterdir()) == [path]  # written whole through a rename, no leftovers


def test_beats_are_written_at_most_once_per_interval(tmp_path: Path) -> None:
    path = tmp_path / "stage.heartbeat"
    hb = Heartbeat(path, every_s=3600.0)
    hb.beat("loop")
    written = read_heartbeat(path)
    hb.beat("loop")
    assert read_heartbeat(path) == written  # a hot loop costs a clock read, not a file write


def test_a_capacity_alert_names_only_stages_still_restarting_or_just_back(tmp_path: Path) -> None:
    """A restart served long since explains no shortage in an alert's 10 s window: an operator
    told so would not add the replicas the load needs."""
    from clipstream.supervise import RECENT_RESTART_S, Stage, Supervisor

    sup = Supervisor(tmp_path)
    now = time.monotonic()
    for name, restarts, ready_at in (("worker", 1, None), ("batcher", 2, now - 5.0), ("selector-1", 1, now - 45.0),
                                     ("gateway", 0, now - 1.0)):
        stage = sup.stages[name] = Stage(name, [], {}, tmp_path / f"{name}.log", restarts=restarts)
        if ready_at is not None:
            stage.ready.set()
            stage.ready_at = ready_at
    said = sup._restarts_before()
    assert said.startswith(" (batcher, worker restarted, back less than ") and "selector-1" not in said, said
    assert RECENT_RESTART_S < 45.0
    for stage in sup.stages.values():
        stage.restarts = 0
    assert sup._restarts_before() == ""
