"""What keeps collector pauses out of the measured paths: the stages' frozen start-up heap and
the load generator's collector switched off while it runs."""

from __future__ import annotations

import gc

from bench.load import without_gc_pauses
from clipstream.heap import freeze_startup_heap


def test_freezing_the_start_up_heap_takes_the_live_objects_out_of_collections():
    try:
        alive = [[i] for i in range(10_000)]  # objects a stage keeps for its whole life
        frozen = freeze_startup_heap()
        # a frozen object freed meanwhile (by another test's leftover thread) leaves the count
        assert 0 <= frozen - gc.get_freeze_count() < len(alive) and frozen >= len(alive)
        # a full collection no longer walks them: the tracked objects left are far fewer
        assert len(gc.get_objects()) < frozen
    finally:
        gc.unfreeze()


def test_the_generator_runs_without_the_collector_and_restores_it():
    seen = []

    @without_gc_pauses
    def run(fail: bool) -> str:
        seen.append(gc.isenabled())
        if fail:
            raise RuntimeError("the run failed")
        return "done"

    assert gc.isenabled()
    assert run(False) == "done"
    try:
        run(True)
    except RuntimeError:
        pass
    assert seen == [False, False] and gc.isenabled()
    gc.disable()
    try:
        run(False)
        assert not gc.isenabled()  # left as the caller had it
    finally:
        gc.enable()
