"""``OffsetTracker``: commit only past batches that are finished and fully acknowledged."""

from __future__ import annotations

from workers.offsets import OffsetTracker


def test_commit_waits_for_every_ack_of_every_earlier_batch() -> None:
    t = OffsetTracker()
    for o in (10, 11, 12):
        t.begin(o)
    t.produced(11, 2)
    t.acked(11)
    t.acked(11)
    assert t.take_committable() is None  # 10 is still running
    t.produced(10, 1)
    assert t.take_committable() is None  # produced, not acknowledged
    t.acked(10)
    assert t.take_committable() == 12  # 10 and 11 are done; 12 still running
    assert t.take_committable() is None  # only reported when it moves
    t.produced(12, 0)  # a batch with nothing to write is done at once
    assert t.take_committable() == 13 and len(t) == 0


def test_a_failed_ack_keeps_its_batch_open_as_the_resume_point() -> None:
    t = OffsetTracker()
    for o in (5, 6):
        t.begin(o)
        t.produced(o, 1)
    t.acked(5, "broker down")
    t.acked(6)
    assert t.failure is not None and "offset 5" in t.failure
    assert t.take_committable() is None and t.first_open() == 5
    t.reset()
    t.produced(6, 1)  # a stale report from before the reset changes nothing
    assert len(t) == 0 and t.failure is None
